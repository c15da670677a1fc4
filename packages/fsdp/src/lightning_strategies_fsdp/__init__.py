"""FSDP2 strategies for Lightning: ``Trainer(strategy="fsdp")`` on ``fully_shard`` and DCP.

Importing this package is cheap; the strategy classes live in ``strategy`` (Trainer) and
``fabric`` (Fabric) and import torch and Lightning when used.
"""

from lightning_strategies_fsdp.version import __version__

__all__ = ["__version__"]
