"""Building the model lazily, so Gemini materialises it chunk by chunk and alike on every rank.

Built directly on the GPU, a model would need all of its unsharded parameters there at once. Built in
``configure_model`` under ColossalAI's LazyInitContext, each parameter is materialised only as GeminiDDP
moves it into its (sharded) chunk. Every rank draws its own parameters from its random generator, so the
ranks must share a seed, or the shards of one model would come from different initialisations.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator

import torch
import torch.distributed
from lightning.fabric.utilities.seed import seed_everything
from lightning.pytorch.utilities.rank_zero import rank_zero_info


def seed_ranks_alike() -> None:
    """Give every rank rank 0's seed, unless ``seed_everything`` has already seeded them all alike."""
    if "PL_GLOBAL_SEED" in os.environ:
        return
    seed = [int(torch.randint(0, 2**31 - 1, ()).item())]
    torch.distributed.broadcast_object_list(seed, src=0)
    seed_everything(seed[0], verbose=False)
    rank_zero_info(f"ColossalAIStrategy: seeded every rank with {seed[0]} so parameters initialise alike.")


@contextlib.contextmanager
def lazy_init_context(device: torch.device) -> Generator[None, None, None]:
    """Modules built inside are lazy: materialised on ``device`` one parameter at a time by GeminiDDP."""
    from colossalai.lazy import LazyInitContext

    with LazyInitContext(default_device=device):
        yield
