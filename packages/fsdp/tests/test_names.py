"""Names resolve in fresh interpreters; bad arguments fail with the allowed values; the plugin stays light;
and the core conformance suite passes for every name on 2 CPU processes."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from lightning_strategies.parameters import ObsoleteParameterWarning
from lightning_strategies.testing import (
    assert_install_hints_match,
    assert_layout_identified_only_through,
    run_script,
)
from lightning_strategies_fsdp.options import ShardingOptions
from lightning_strategies_fsdp.strategy import FSDP2Strategy


def options_from_constructor(**arguments: object) -> ShardingOptions:
    """The options the strategies' constructor (which holds the defaults) parses from ``arguments``."""
    return FSDP2Strategy(**arguments).options


DISTRIBUTION = "lightning-strategies-fsdp"
NAMES = ("fsdp", "fsdp_cpu_offload", "fsdp_shard_grad_op", "fsdp_hybrid_shard", "fsdp_no_shard")

RESOLVE = """
import lightning, pytorch_lightning
from lightning.fabric import Fabric
names = {names!r}
for name in names:
    trainer = lightning.Trainer(strategy=name, accelerator="cpu", devices=2, logger=False)
    print("lightning", name, type(trainer.strategy).__name__, trainer.strategy.options.sharding_strategy)
    trainer = pytorch_lightning.Trainer(strategy=name, accelerator="cpu", devices=2, logger=False)
    print("pytorch_lightning", name, type(trainer.strategy).__name__,
          isinstance(trainer.strategy, pytorch_lightning.strategies.ParallelStrategy))
    fabric = Fabric(strategy=name, accelerator="cpu", devices=2)
    print("fabric", name, type(fabric.strategy).__name__)
"""


def test_every_name_resolves_in_a_fresh_interpreter() -> None:
    """No import of this package: the start-up hook of core makes the names work (Lightning's own
    "FSDP requires a GPU" guard included, which core lifts for replaced names)."""
    done = subprocess.run(
        [sys.executable, "-c", RESOLVE.format(names=NAMES)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = set(done.stdout.splitlines())
    expected_sharding = {
        "fsdp": "FULL_SHARD",
        "fsdp_cpu_offload": "FULL_SHARD",
        "fsdp_shard_grad_op": "SHARD_GRAD_OP",
        "fsdp_hybrid_shard": "HYBRID_SHARD",
        "fsdp_no_shard": "NO_SHARD",
    }
    for name in NAMES:
        assert f"lightning {name} FSDP2Strategy {expected_sharding[name]}" in lines
        assert f"pytorch_lightning {name} FSDP2Strategy True" in lines
        assert f"fabric {name} FSDP2FabricStrategy" in lines


def test_plugin_module_imports_nothing_heavy() -> None:
    code = (
        "import sys, lightning_strategies_fsdp.plugin\n"
        "heavy = [m for m in ('torch', 'lightning', 'pytorch_lightning') if m in sys.modules]\n"
        "print(heavy)"
    )
    done = run_script("-c", code, env={"LIGHTNING_STRATEGIES_AUTOLOAD": "0"})
    assert done.stdout.strip() == "[]", done.stderr


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"sharding_strategy": "ZERO3"}, ValueError, "'FULL_SHARD', 'SHARD_GRAD_OP', 'NO_SHARD', 'HYBRID_SHARD'"),
        ({"backward_prefetch": "SOMETIMES"}, ValueError, "None, 'BACKWARD_PRE', 'BACKWARD_POST'"),
        ({"cpu_offload": "yes"}, TypeError, "must be a bool, torch.distributed.fsdp.CPUOffload"),
        ({"mixed_precision": "bf16"}, TypeError, "MixedPrecisionPolicy"),
        ({"mixed_precision": {"param_type": torch.bfloat16}}, ValueError, "Allowed: param_dtype"),
        ({"auto_wrap_policy": 42}, TypeError, "set of nn.Module classes"),
        ({"device_mesh": (2, "x")}, TypeError, "(number of replicas, shard group size)"),
        ({"forward_prefetch": "yes"}, TypeError, "must be bool"),
        ({"param_init_fn": 3}, TypeError, "callable taking a module"),
        ({"flatten_parameters": True}, TypeError, "accepts: shard_placement_fn, ignored_params"),
    ],
)
def test_wrong_values_name_the_allowed_ones(arguments: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        options_from_constructor(**arguments)


def test_wrong_state_dict_type_is_refused() -> None:
    from lightning_strategies_fsdp.strategy import FSDP2Strategy

    with pytest.raises(ValueError, match="Choose one of: 'sharded', 'full'"):
        FSDP2Strategy(state_dict_type="local")


def test_fsdp1_values_map_onto_fsdp2() -> None:
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, CPUOffloadPolicy, MixedPrecision, ShardingStrategy

    options = options_from_constructor(
        sharding_strategy=ShardingStrategy.HYBRID_SHARD,
        cpu_offload=CPUOffload(offload_params=True),
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
    )
    assert (options.mesh_layout, options.reshard_after_forward) == ("hybrid", True)
    assert isinstance(options.offload_policy, CPUOffloadPolicy)
    assert options.mp_policy.param_dtype == torch.bfloat16
    assert options.mp_policy.reduce_dtype == torch.float32
    assert options_from_constructor(sharding_strategy="shard_grad_op").reshard_after_forward is False


def test_fsdp1_only_settings_warn() -> None:
    from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        options_from_constructor(
            backward_prefetch=BackwardPrefetch.BACKWARD_POST,
            mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16),
            device_id=0,
        )
    messages = [str(warning.message) for warning in caught if issubclass(warning.category, ObsoleteParameterWarning)]
    assert any("backward_prefetch" in message and "BACKWARD_PRE" in message for message in messages)
    assert any("buffer_dtype" in message for message in messages)
    assert any("device_id" in message for message in messages)


@pytest.mark.parametrize("value", ["BACKWARD_PRE", "backward_pre"])
def test_backward_prefetch_pre_warns_that_fsdp2_always_does_it(value: str) -> None:
    with pytest.warns(ObsoleteParameterWarning, match="FSDP2 always issues the next module's all-gather"):
        options_from_constructor(backward_prefetch=value)


def test_info_gives_every_parameter_its_meaning_and_fsdp1_mapping(capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_strategies.cli import main
    from lightning_strategies.describe import parameter_docs
    from lightning_strategies_fsdp.plugin import PARAMETERS, TRAINER_TARGET

    for target in (TRAINER_TARGET, "lightning_strategies_fsdp.fabric:FSDP2FabricStrategy"):
        assert {parameter.name for parameter in parameter_docs(target)} - {"kwargs"} <= set(PARAMETERS), target
    assert main(["info", "fsdp_shard_grad_op"]) == 0
    lines = capsys.readouterr().out.split("  parameters:\n")[1].splitlines()
    names = lines[0::2]
    assert len(names) >= len(PARAMETERS) - 2 and all(line.startswith("        ") for line in lines[1::2])
    assert "    sharding_strategy='SHARD_GRAD_OP'" in names
    assert lines[names.index("    backward_prefetch=None") * 2 + 1].strip().startswith("FSDP1: BackwardPrefetch.")


def test_hybrid_mesh_must_match_the_world_size() -> None:
    from lightning_strategies_fsdp.options import mesh_shape

    options = options_from_constructor(sharding_strategy="HYBRID_SHARD", device_mesh=(3, 1))
    with pytest.raises(ValueError, match="product of 2"):
        mesh_shape(options, world_size=2, num_nodes=1)
    assert mesh_shape(options_from_constructor(sharding_strategy="HYBRID_SHARD"), world_size=8, num_nodes=2) == (2, 4)


@pytest.mark.parametrize("name", NAMES)
def test_conformance_suite(name: str, tmp_path) -> None:
    conformance = pytest.importorskip("lightning_strategies.conformance")
    report = conformance.run_check(name, accelerator="cpu", devices=2, workdir=tmp_path)
    assert report.passed, str(report)


def test_an_offloading_cuda_mesh_gets_gloo_for_its_cpu_gradients() -> None:
    """The choice behind the several-GPU clipping test (tests/test_gpu.py), which only a GPU machine runs."""
    import torch

    from lightning_strategies_fsdp.sharding import mesh_backends

    offloading, plain = options_from_constructor(cpu_offload=True), options_from_constructor()
    assert mesh_backends(offloading, torch.device("cuda", 0), 2) == {0: "cpu:gloo,cuda:nccl", 1: "cpu:gloo,cuda:nccl"}
    assert mesh_backends(plain, torch.device("cuda", 0), 1) is None
    assert mesh_backends(offloading, torch.device("cpu"), 1) is None  # gloo already carries everything


def test_core_identifies_dcp_folders_only_through_this_plugin(tmp_path) -> None:
    from lightning_strategies_fsdp import plugin
    from lightning_strategies_fsdp.checkpoint_layout import DCP

    folder = tmp_path / "fsdp.ckpt"
    folder.mkdir()
    (folder / ".metadata").write_bytes(b"x")
    (folder / "__0_0.distcp").write_bytes(b"x")
    assert_layout_identified_only_through(plugin, "fsdp", DISTRIBUTION, DCP, [folder], not_matching=[tmp_path])


def test_cores_install_hints_list_exactly_the_names_this_package_registers():
    assert_install_hints_match(DISTRIBUTION)


def test_lightnings_own_fsdp2_names_stay_lightnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning 2.7 registers ``fsdp2`` and ``fsdp2_cpu_offload`` for its own FSDP2Strategy (stood in for here by
    its FSDPStrategy class): they stay Lightning's, beside this package's names, and are listed as Lightning's."""
    from lightning.pytorch.strategies import FSDPStrategy as LightningsClass
    from lightning.pytorch.strategies import StrategyRegistry

    import lightning_strategies
    from lightning_strategies.known import LIGHTNING_TRAINER_NAMES

    for name in ("fsdp2", "fsdp2_cpu_offload"):
        monkeypatch.setitem(StrategyRegistry, name, {"strategy": LightningsClass, "description": "", "init_params": {}})
    lightning_strategies.activate()  # as when Lightning's registry is imported
    assert StrategyRegistry["fsdp2"]["strategy"] is LightningsClass
    assert StrategyRegistry["fsdp2_cpu_offload"]["strategy"] is LightningsClass
    assert {"fsdp2", "fsdp2_cpu_offload"} <= LIGHTNING_TRAINER_NAMES
    assert type(StrategyRegistry.get("fsdp")) is FSDP2Strategy
