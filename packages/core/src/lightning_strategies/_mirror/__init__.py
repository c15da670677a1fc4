"""Home of the modules mirror.py builds on demand.

Importing this package installs the mirror finder, so a process that unpickles a mirrored
strategy (a spawned worker, say) can import it without having activated anything first.
"""

from lightning_strategies.mirror import install

install()
