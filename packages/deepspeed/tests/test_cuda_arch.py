"""TORCH_CUDA_ARCH_LIST as GPU images set it (9.0a on H100/H200) must not crash DeepSpeed's op builder."""

from __future__ import annotations

import pytest

from lightning_strategies_deepspeed.cuda_arch import VARIABLE, normalize_arch_list, normalize_environment


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("9.0a", "9.0"),
        ("8.0;9.0a", "8.0;9.0"),
        ("8.0 8.6 9.0a+PTX", "8.0;8.6;9.0+PTX"),
        ("9.0;9.0a", "9.0"),
        ("9.0a;9.0+PTX", "9.0+PTX"),
        ("10.0f;12.0a", "10.0;12.0"),
        ("Hopper", "9.0+PTX"),
        ("Ampere;9.0a", "8.0;8.6+PTX;9.0"),
        ("7.5;8.0", "7.5;8.0"),
    ],
)
def test_normalize_arch_list(value, expected):
    assert normalize_arch_list(value) == expected


def test_every_normalized_entry_parses_the_way_deepspeed_parses_it():
    # DeepSpeed's builder does int() on each dotted part after dropping "+PTX".
    for entry in normalize_arch_list("7.0;8.0a;9.0a+PTX;Hopper;10.0f").split(";"):
        assert all(part.isdigit() for part in entry.split("+")[0].split("."))


def test_environment_rewritten_only_when_needed():
    environment = {VARIABLE: "9.0a"}
    assert normalize_environment(environment) == "9.0"
    assert environment[VARIABLE] == "9.0"
    untouched = {VARIABLE: "8.0;9.0"}
    assert normalize_environment(untouched) is None
    assert untouched == {VARIABLE: "8.0;9.0"}
    assert normalize_environment({}) is None


def test_deepspeed_builder_accepts_the_normalized_list(monkeypatch):
    """DeepSpeed's own FusedAdam arch parsing, on the value that crashed it, then after normalisation.

    Only the flag computation runs (no GPU, no compiler needed).
    """
    fused_adam = pytest.importorskip("deepspeed.ops.op_builder.fused_adam")
    builder = fused_adam.FusedAdamBuilder()
    builder.jit_mode = True
    builder._jit_arch_list = None  # DeepSpeed >= 0.19 reads a captured copy first; None falls back to the environment
    monkeypatch.setenv(VARIABLE, "9.0a")
    with pytest.raises(ValueError, match="invalid literal for int"):
        builder.compute_capability_args()
    normalize_environment()
    assert builder.compute_capability_args() is not None
