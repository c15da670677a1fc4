"""Which submodules get their own ``fully_shard`` call (or activation checkpointing): the selection lives with the
sharding code, and each form of policy Lightning users pass picks the same blocks."""

from __future__ import annotations

import functools

import pytest
from torch import nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, transformer_auto_wrap_policy

from lightning_strategies_fsdp import options, sharding


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(4, 2)


def test_module_selection_is_part_of_the_sharding_module_not_of_options() -> None:
    for name in ("block_classes", "default_blocks", "selected_modules"):
        assert callable(getattr(sharding, name))
        assert not hasattr(options, name), f"{name} belongs beside the sharding code"


@pytest.mark.parametrize(
    "policy",
    [
        {Block},
        ModuleWrapPolicy({Block}),
        functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}),
        lambda module, recurse, nonwrapped_numel: isinstance(module, Block),
        None,  # the default: repeated blocks of a ModuleList
    ],
    ids=["set", "ModuleWrapPolicy", "transformer_auto_wrap_policy", "fsdp1-callable", "default"],
)
def test_every_policy_form_selects_the_repeated_blocks(policy: object) -> None:
    model = Model()
    chosen = sharding.selected_modules(model, policy, sharding.default_blocks)
    assert chosen == list(model.blocks)


def test_no_policy_and_no_default_selects_nothing() -> None:
    assert sharding.selected_modules(Model(), None, default=None) == []
