"""Names resolve through the real Lightning entry points once a registry is activated."""

from __future__ import annotations

import importlib.util
import pickle
import sys

import pytest

from lightning_strategies import activate, hookimpl
from lightning_strategies.errors import CapabilityError, StrategyLookupError


class DDPPlugin:
    """A plugin registering Lightning's own DDP under new names, so nothing else is needed."""

    @hookimpl
    def register_strategies(registry):
        registry.register(
            "team_ddp",
            "lightning.pytorch.strategies:DDPStrategy",
            description="DDP with our defaults",
            init_params={"find_unused_parameters": True},
            fabric_target="lightning.fabric.strategies:DDPStrategy",
            accelerators=("cpu", "cuda"),
            precisions=("32-true", "bf16-mixed"),
        )
        registry.register(
            "never_imported", "lightning_strategies_tests_missing.module:Strategy", accelerators=("cuda",)
        )


def _trainer(module, strategy, **options):
    return module.Trainer(strategy=strategy, logger=False, enable_checkpointing=False, devices=1, **options)


def test_lightning_trainer_resolves_a_registered_name(registry, add_plugin, lightning_registries):
    import lightning.pytorch as pl

    add_plugin(DDPPlugin)
    activate()
    trainer = _trainer(pl, "TEAM_DDP", accelerator="cpu")
    assert type(trainer.strategy).__module__.startswith("lightning.pytorch.")
    assert trainer.strategy._ddp_kwargs == {"find_unused_parameters": True}


def test_pytorch_lightning_trainer_gets_a_pytorch_lightning_class(registry, add_plugin, lightning_registries):
    import pytorch_lightning

    add_plugin(DDPPlugin)
    activate()
    trainer = _trainer(pytorch_lightning, "team_ddp", accelerator="cpu")
    assert isinstance(trainer.strategy, pytorch_lightning.strategies.DDPStrategy)


def test_fabric_resolves_where_a_fabric_class_is_registered(registry, add_plugin, lightning_registries):
    import lightning.fabric

    add_plugin(DDPPlugin)
    activate()
    fabric = lightning.fabric.Fabric(strategy="team_ddp", accelerator="cpu", devices=1)
    assert isinstance(fabric.strategy, lightning.fabric.strategies.DDPStrategy)


def test_capabilities_are_refused_before_the_class_is_imported(registry, add_plugin, lightning_registries):
    import lightning.pytorch as pl

    add_plugin(DDPPlugin)
    activate()
    with pytest.raises(CapabilityError, match="accelerator='cpu' is not supported"):
        _trainer(pl, "never_imported", accelerator="cpu")
    assert "lightning_strategies_tests_missing" not in sys.modules
    with pytest.raises(CapabilityError, match="precision='16-true'"):
        _trainer(pl, "team_ddp", accelerator="cpu", precision="16-true")


def test_unknown_names_in_the_trainer_get_close_matches(registry, add_plugin, lightning_registries):
    import lightning.pytorch as pl

    add_plugin(DDPPlugin)
    activate()
    with pytest.raises(StrategyLookupError, match="Did you mean: 'team_ddp'"):
        _trainer(pl, "team_dpp")


def test_project_names_not_installed_say_what_to_install(registry, lightning_registries):
    import lightning.pytorch as pl

    activate()
    with pytest.raises(StrategyLookupError, match="pip install lightning-strategies-colossalai-gemini"):
        _trainer(pl, "colossalai_cuda")


def test_builtin_names_stay_lightnings_without_a_replacement(registry, lightning_registries):
    import lightning.pytorch as pl

    activate()
    trainer = _trainer(pl, "ddp", accelerator="cpu")
    assert type(trainer.strategy) is pl.strategies.DDPStrategy


def test_a_declared_replacement_lifts_lightnings_cpu_refusal_of_the_name(registry, add_plugin, lightning_registries):
    import lightning.pytorch as pl

    class ReplacesFSDP:
        @hookimpl
        def register_strategies(registry):
            registry.register("fsdp", "lightning.pytorch.strategies:DDPStrategy", replaces_builtin=True)

    add_plugin(ReplacesFSDP)
    activate()
    try:
        trainer = _trainer(pl, "fsdp", accelerator="cpu")
        assert type(trainer.strategy) is pl.strategies.DDPStrategy
    finally:
        pl.strategies.FSDPStrategy._registered_strategies[:] = ["fsdp", "fsdp_cpu_offload"]


def test_a_typo_shows_our_error_alone(registry, lightning_registries):
    import lightning.pytorch as pl

    activate()
    with pytest.raises(StrategyLookupError) as error:
        _trainer(pl, "fsdpp")
    # Lightning's "invalid strategy name" is not chained in front of ours.
    assert error.value.__cause__ is None and error.value.__suppress_context__
    assert "Did you mean: 'fsdp'" in str(error.value)
    assert "lightning-strategies-xla" not in str(error.value)


def test_a_name_of_the_other_entry_point_says_which_one_has_it(registry, add_plugin, lightning_registries):
    import lightning.fabric
    import lightning.pytorch as pl

    activate()
    with pytest.raises(StrategyLookupError, match="built-in strategy of Fabric only; Trainer does not have it"):
        _trainer(pl, "deepspeed_stage_1_offload")

    class TrainerOnly:
        @hookimpl
        def register_strategies(registry):
            registry.register("trainer_only_ddp", "lightning.pytorch.strategies:DDPStrategy")

    add_plugin(TrainerOnly)
    activate()
    with pytest.raises(StrategyLookupError, match="works with Trainer only, not with Fabric") as error:
        lightning.fabric.Fabric(strategy="trainer_only_ddp", accelerator="cpu", devices=1)
    assert "Did you mean: 'trainer_only_ddp'" not in str(error.value)


@pytest.mark.parametrize(
    ("name", "accelerator", "distribution"),
    [
        ("deepspeed_stage_2", "cpu", "lightning-strategies-deepspeed"),  # Lightning's DeepSpeed is CUDA-only
        ("xla", "cpu", "lightning-strategies-xla"),
        pytest.param(
            "xla",
            "tpu",
            "lightning-strategies-xla",
            marks=pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla present"),
        ),  # Lightning's TPU accelerator asks for torch_xla
    ],
)
def test_a_builtin_name_of_a_missing_package_names_that_package(
    registry, lightning_registries, name, accelerator, distribution
):
    import lightning.pytorch as pl

    activate()
    with pytest.raises(StrategyLookupError, match=f"pip install {distribution}$") as error:
        _trainer(pl, name, accelerator=accelerator)
    assert "Lightning's own" in str(error.value)


def test_one_table_names_the_watched_modules_and_what_each_holds():
    import importlib

    import _lightning_strategies_autoload

    from lightning_strategies import watched_modules

    table = _lightning_strategies_autoload.WATCHED_MODULES
    assert set(watched_modules()) == set(table)
    assert set(watched_modules("xla accelerator")) == {
        "lightning.fabric.accelerators.xla",
        "lightning_fabric.accelerators.xla",
    }
    kinds = {"strategy registry", "connector", "xla accelerator"}
    assert {kind for _, kind, _ in table.values()} == kinds
    assert sum(len(watched_modules(kind)) for kind in kinds) == len(table)
    # Every row names a real Lightning module, in the namespace it says, holding the attribute it says.
    for module_name, (namespace, _, attribute) in table.items():
        assert module_name.startswith(namespace + "."), module_name
        assert importlib.util.find_spec(module_name) is not None, module_name
        assert hasattr(importlib.import_module(module_name), attribute), (module_name, attribute)


def test_lightnings_ddp_names_another_strategys_folder_instead_of_opening_it(registry, lightning_registries, tmp_path):
    """Issue 29 item 2: Lightning's ddp opened a DeepSpeed or DCP folder as a file (IsADirectoryError)."""
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel

    from lightning_strategies.errors import CheckpointError
    from lightning_strategies.testing import written_by_another_package

    activate()
    trainer = _trainer(pl, "ddp", accelerator="cpu", max_steps=1, enable_progress_bar=False)
    pickle.loads(pickle.dumps(trainer.strategy))  # ddp_spawn pickles it into the processes it starts
    (tmp_path / "other.ckpt").mkdir()
    refused = pytest.raises(CheckpointError, match=r"another package's checkpoint.*DDPStrategy reads one checkpoint")
    try:
        with written_by_another_package(tmp_path / "other.ckpt"), refused:
            trainer.fit(BoringModel(), ckpt_path=tmp_path / "other.ckpt")
    finally:
        # ddp joined a process group of one in this process, and a refused fit leaves it: later tests start their own.
        import torch.distributed

        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
