"""Names that exist whether or not their package is installed: this project's packages, and
Lightning's own built-in strategies. Used for install hints and for the built-in replacement
policy without importing Lightning; tests keep both lists honest against the real packages.

Lightning's built-in names are read from the installed Lightning's registries once it has
imported them (as it has whenever a Trainer or Fabric resolves a name), so a name a newer
Lightning adds (2.7's ``fsdp2``) is known as Lightning's; until then, and for the names a package
of ours replaced there, Lightning 2.6's names stand in.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Set

import _lightning_strategies_autoload

# Lightning's seven DeepSpeed names: the deepspeed package replaces every one of them and adds none.
_DEEPSPEED_NAMES = (
    "deepspeed",
    "deepspeed_stage_1",
    "deepspeed_stage_2",
    "deepspeed_stage_2_offload",
    "deepspeed_stage_3",
    "deepspeed_stage_3_offload",
    "deepspeed_stage_3_offload_nvme",
)

# The layouts `lightning-strategies convert --to` writes: "full" is core's one file, the others are named by the
# strategies that resume them, each written through its package's CheckpointFormat (convert_name).
CONVERT_TARGETS = ("full", "fsdp", "deepspeed", "colossalai")

# distribution -> the strategy names it registers (design.md, "Names").
PROJECT_PACKAGES: dict[str, tuple[str, ...]] = {
    "lightning-strategies-colossalai-gemini": (
        "colossalai",
        "colossalai_cuda",
        "colossalai_cpu",
        "colossalai_auto",
    ),
    "lightning-strategies-deepspeed": _DEEPSPEED_NAMES,
    "lightning-strategies-fsdp": (
        "fsdp",
        "fsdp_cpu_offload",
        "fsdp_shard_grad_op",
        "fsdp_hybrid_shard",
        "fsdp_no_shard",
    ),
    "lightning-strategies-xla": ("xla", "xla_debug", "single_xla", "xla_fsdp"),
}

# Strategy names Lightning 2.6 registers itself, per entry point: the Trainer (lightning.pytorch)
# and Fabric (lightning.fabric) do not accept the same names.
_LIGHTNING_26_SHARED = frozenset(
    {
        "ddp",
        "ddp_find_unused_parameters_true",
        "ddp_fork",
        "ddp_notebook",
        "ddp_spawn",
        *_DEEPSPEED_NAMES,
        "fsdp",
        "fsdp_cpu_offload",
        "single_tpu",
        "single_xla",
        "xla",
    }
)
_LIGHTNING_26 = {
    "Trainer": _LIGHTNING_26_SHARED
    | {
        "ddp_find_unused_parameters_false",
        "ddp_fork_find_unused_parameters_false",
        "ddp_fork_find_unused_parameters_true",
        "ddp_notebook_find_unused_parameters_false",
        "ddp_notebook_find_unused_parameters_true",
        "ddp_spawn_find_unused_parameters_false",
        "ddp_spawn_find_unused_parameters_true",
        "single_device",
        "xla_debug",
    },
    "Fabric": _LIGHTNING_26_SHARED | {"deepspeed_stage_1_offload", "dp", "xla_fsdp"},
}
_ENTRY_POINTS = {
    "lightning.pytorch": "Trainer",
    "pytorch_lightning": "Trainer",
    "lightning.fabric": "Fabric",
    "lightning_fabric": "Fabric",
}
_LIGHTNING_PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric")


def _installed_lightning_names(entry_point: str) -> set[str]:
    """The names the imported registries of ``entry_point`` hold for Lightning's own classes (ours are factories)."""
    names: set[str] = set()
    for module_name, (namespace, kind, attribute) in _lightning_strategies_autoload.WATCHED_MODULES.items():
        module = sys.modules.get(module_name)
        if kind != "strategy registry" or _ENTRY_POINTS[namespace] != entry_point or module is None:
            continue
        for name, entry in list(getattr(module, attribute, {}).items()):
            strategy = entry.get("strategy")
            if isinstance(strategy, type) and strategy.__module__.split(".")[0] in _LIGHTNING_PACKAGES:
                names.add(name)
    return names


class _LightningNames(Set[str]):
    """Lightning's built-in names of some entry points, read anew on each use (registries fill as Lightning is
    imported): its imported registries' own, with Lightning 2.6's."""

    def __init__(self, *entry_points: str) -> None:
        self._entry_points = entry_points

    def _names(self) -> set[str]:
        names: set[str] = set()
        for entry_point in self._entry_points:
            names |= _LIGHTNING_26[entry_point] | _installed_lightning_names(entry_point)
        return names

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._names()))

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return f"LightningNames({', '.join(self._entry_points)}: {sorted(self._names())})"


LIGHTNING_TRAINER_NAMES: Set[str] = _LightningNames("Trainer")
LIGHTNING_FABRIC_NAMES: Set[str] = _LightningNames("Fabric")
LIGHTNING_BUILTIN_NAMES: Set[str] = _LightningNames("Trainer", "Fabric")

# The accelerators Lightning's own strategy behind a name runs on, for the built-in names this
# project's packages replace: where such a package is missing, Lightning's strategy answers the
# name, and on any other accelerator it fails only later, with advice that leads nowhere.
_LIGHTNING_26_NAMES = _LIGHTNING_26["Trainer"] | _LIGHTNING_26["Fabric"]
LIGHTNING_BUILTIN_ACCELERATORS: dict[str, tuple[str, ...]] = {
    **{name: ("cuda",) for name in _LIGHTNING_26_NAMES if name.startswith(("deepspeed", "fsdp"))},
    **{name: ("tpu",) for name in _LIGHTNING_26_NAMES if "xla" in name or "tpu" in name},
}


def lightning_builtin_entry_points(name: str) -> tuple[str, ...]:
    """The Lightning entry points ("Trainer", "Fabric") that have ``name`` built in."""
    return tuple(
        entry_point
        for entry_point, names in (("Trainer", LIGHTNING_TRAINER_NAMES), ("Fabric", LIGHTNING_FABRIC_NAMES))
        if name in names
    )


def providing_distribution(name: str) -> str | None:
    """The project distribution that registers ``name``, or None."""
    for distribution, names in PROJECT_PACKAGES.items():
        if name in names:
            return distribution
    return None
