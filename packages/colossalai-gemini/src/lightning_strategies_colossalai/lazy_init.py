"""Building the model lazily, so Gemini materialises it chunk by chunk and alike on every rank.

Built directly on the GPU, a model would need all of its unsharded parameters there at once. Built in
``configure_model`` under ColossalAI's LazyInitContext, each parameter is materialised only as GeminiDDP
moves it into its (sharded) chunk. Every rank draws its own parameters from its random generator, so the
ranks must share a seed, or the shards of one model would come from different initialisations.

ColossalAI 0.5's lazy tensors predate ``transformers`` 5, whose models they cannot build as they are; the context
here mends three things, for as long as it lasts:

- An in-place op with another lazy tensor as its source (``buffer.copy_(value)``, how ``transformers`` sets rotary
  and position buffers) is recorded on the source too, so materialising either re-enters the other without end
  (``RecursionError``). The source is materialised first here; the op is then recorded on its target alone.
- The legacy constructors (``torch.LongTensor``) become plain functions, so a module imported inside the context
  whose annotations read ``torch.LongTensor | None`` fails (``TypeError``); they are given ``|`` back.
- ``from_pretrained`` is ColossalAI's replacement written for ``transformers`` 4; core's deferred loading builds the
  model lazily instead and its weights are read as each parameter materialises (``read_pretrained_when_built``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import typing
from collections.abc import Callable, Generator
from typing import Any

import torch
import torch.distributed
from lightning.fabric.utilities.seed import seed_everything
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_strategies.hugging_face import deferred_pretrained_loading, pretrained_tensors

# The legacy constructors ColossalAI replaces while a LazyInitContext is open (colossalai.lazy.lazy_init).
LEGACY_CONSTRUCTORS = ("FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "ByteTensor", "CharTensor",
                       "ShortTensor", "IntTensor", "LongTensor", "BoolTensor")  # fmt: skip


def seed_ranks_alike() -> None:
    """Give every rank rank 0's seed, unless ``seed_everything`` has already seeded them all alike."""
    if "PL_GLOBAL_SEED" in os.environ:
        return
    seed = [int(torch.randint(0, 2**31 - 1, ()).item())]
    torch.distributed.broadcast_object_list(seed, src=0)
    seed_everything(seed[0], verbose=False)
    rank_zero_info(f"ColossalAIStrategy: seeded every rank with {seed[0]} so parameters initialise alike.")


@contextlib.contextmanager
def lazy_init_context(device: torch.device, strategy: str = "colossalai") -> Generator[None, None, None]:
    """Modules built inside are lazy: materialised on ``device`` one parameter at a time by GeminiDDP."""
    from colossalai.lazy import LazyInitContext
    from colossalai.lazy.lazy_init import LazyTensor

    # Core's from_pretrained is entered after LazyInitContext, so it stands in for ColossalAI's while both are open.
    # Gemini refuses PEFT models (refusals.check_adapters): adapter loads are left to PEFT.
    with (
        LazyInitContext(default_device=device),
        _sources_materialised_first(LazyTensor),
        _typing_legacy_constructors(),
        deferred_pretrained_loading(strategy, adapters=False),
    ):
        yield


@contextlib.contextmanager
def _sources_materialised_first(lazy_tensor: Any) -> Generator[None, None, None]:
    original = lazy_tensor.__dict__["__torch_function__"]

    def torch_function(cls: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if (name.endswith("_") and not name.endswith("__")) or name == "__setitem__":
            for source in [*args[1:], *(kwargs or {}).values()]:
                if isinstance(source, lazy_tensor) and source._materialized_data is None:
                    source._materialize_data()
        return original.__func__(cls, func, types, args, kwargs)

    lazy_tensor.__torch_function__ = classmethod(torch_function)
    try:
        yield
    finally:
        lazy_tensor.__torch_function__ = original


class _LegacyConstructor:
    """ColossalAI's lazy stand-in for ``torch.LongTensor`` and its kind, which also forms type unions as the class
    it stands in for does (``torch.LongTensor | None`` in an annotation)."""

    def __init__(self, lazy: Callable[..., Any], original: type) -> None:
        self._lazy = lazy
        self._original = original
        functools.update_wrapper(self, lazy)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._lazy(*args, **kwargs)

    def __or__(self, other: Any) -> Any:
        return typing.Union[self._original, other]  # noqa: UP007  (other may be a string or a stand-in)

    def __ror__(self, other: Any) -> Any:
        return typing.Union[other, self._original]  # noqa: UP007


@contextlib.contextmanager
def _typing_legacy_constructors() -> Generator[None, None, None]:
    """Wraps the stand-ins LazyInitContext put in place, in its own table too, since it puts them back after every
    op it runs eagerly (``ConstructorManager.disable``)."""
    from colossalai.lazy.construction import ConstructorManager

    table = ConstructorManager.overwrites
    replaced = {name: table[name] for name in LEGACY_CONSTRUCTORS if name in table}
    for name, (lazy, original) in replaced.items():
        table[name] = (_LegacyConstructor(lazy, original), original)
        setattr(torch, name, table[name][0])
    try:
        yield
    finally:
        for name, entry in replaced.items():
            table[name] = entry
            setattr(torch, name, entry[0])


def read_pretrained_when_built(module: torch.nn.Module) -> None:
    """The pretrained weights of models built lazily by ``from_pretrained``, read as each parameter materialises:
    after whatever initialisation was recorded for it, its file's value is copied in (one tensor at a time, on every
    rank, before Gemini keeps its shard)."""
    from colossalai.lazy.lazy_init import LazyTensor

    for tensor, weights, original in pretrained_tensors(module):
        load = functools.partial(_copy_from_file, weights=weights, original=original)
        if isinstance(tensor, LazyTensor) and tensor._materialized_data is None:
            tensor._op_buffer.append((load, (tensor,), {}))
        else:  # materialised early (indexed while being built) or never lazy
            with torch.no_grad():
                load(tensor)


def _copy_from_file(tensor: torch.Tensor, weights: Any, original: str) -> torch.Tensor:
    with torch.no_grad():
        tensor.copy_(weights.read(original))
    return tensor
