"""ZeRO-3 with part of the optimizer offloaded keeps each gradient where its optimizer step reads it, on
DeepSpeed's real engine on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import clean_environment

from lightning_strategies_deepspeed import gradient_buffers

HERE = Path(__file__).parent


def train_every_way(folder: Path, family: str | None = None) -> dict:
    out = folder / "result.json"
    command = [sys.executable, str(HERE / "gradient_placement_script.py"), str(out), *([family] if family else [])]
    result = subprocess.run(command, capture_output=True, text=True, env=clean_environment(), timeout=900)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def ways(tmp_path_factory):
    return train_every_way(tmp_path_factory.mktemp("placement"))


@pytest.mark.parametrize(("way", "side"), [("kept", "kept_elements"), ("hosted-fp32", "host_elements")])
def test_gradients_accumulate_in_the_fp32_gradient_of_their_sub_group(ways, way, side):
    run = ways[way]
    assert run["slots"] == 8  # four layers, a weight and a bias each
    assert run["slots_in_fp32_gradients"] == run["slots"]
    # DeepSpeed's all-parameter host buffer is gone, and no 16-bit copy took its place.
    assert run["deepspeed_buffer_elements"] == 0
    assert run["placement"][side] == run["parameter_elements"]
    assert run["placement"]["replaced_elements"] == ways["deepspeed"]["deepspeed_buffer_elements"]


def test_gradients_of_offloaded_sub_groups_get_a_host_buffer_of_their_size(ways):
    hosted = ways["hosted"]
    assert hosted["slots_in_fp32_gradients"] == 0
    assert hosted["deepspeed_buffer_elements"] == hosted["parameter_elements"]
    assert hosted["placement"]["host_elements"] == hosted["parameter_elements"]
    assert not hosted["placement"]["host_in_fp32"] and ways["hosted-fp32"]["placement"]["host_in_fp32"]


def test_offloaded_gradients_on_gpu_accumulate_in_a_buffer_where_backward_runs(ways):
    """The buffer is on the training device (the CPU stands in for the GPU here), the fp32 gradients on the host
    receive the sum once a step, and nothing of the offloaded share sits in a host slot."""
    run = ways["hosted-accumulating"]
    assert run["slots_in_fp32_gradients"] == 0
    assert run["deepspeed_buffer_elements"] == run["parameter_elements"]
    assert run["placement"]["device_elements"] == run["parameter_elements"]
    assert run["placement"]["host_elements"] == run["placement"]["kept_elements"] == 0


@pytest.mark.parametrize("way", ["kept", "hosted", "hosted-fp32", "hosted-accumulating"])
def test_training_is_what_deepspeeds_own_buffers_give(ways, way):
    reference = ways["deepspeed"]
    assert len(reference["losses"]) == 6  # 3 optimizer steps of 2 micro-batches
    assert ways[way]["losses"] == reference["losses"]
    assert ways[way]["weights"] == reference["weights"]


@pytest.mark.parametrize(("family", "tied"), [("gpt2", True), ("llama", False)])
def test_hugging_face_models_train_alike_wherever_their_gradients_accumulate(tmp_path, family, tied):
    """transformers' own modules through every placement: GPT-2's Conv1D layers and its tied input and output
    embeddings, one parameter taking gradients from two places in each micro-batch, and Llama's untied ones. Each
    gives the losses and weights of DeepSpeed's own buffers, exactly, and holds the slots it promises."""
    pytest.importorskip("transformers")
    runs = train_every_way(tmp_path, family)
    assert {run["tied_embeddings"] for run in runs.values()} == {tied}
    reference = runs["deepspeed"]
    assert len(reference["losses"]) == 6 and reference["losses"][-1] < reference["losses"][0]
    for way in ("kept", "hosted", "hosted-fp32", "hosted-accumulating"):
        assert runs[way]["losses"] == reference["losses"], way
        assert runs[way]["weights"] == reference["weights"], way
        assert runs[way]["slots"] == reference["slots"] > 0
    elements = reference["parameter_elements"]
    assert runs["hosted-accumulating"]["placement"]["device_elements"] == elements
    assert runs["hosted"]["placement"]["host_elements"] == runs["hosted-fp32"]["placement"]["host_elements"] == elements
    assert runs["kept"]["placement"]["kept_elements"] == elements


@pytest.mark.parametrize(
    ("attributes", "applies"),
    [
        ({}, True),
        ({"offload_optimizer": False}, False),
        ({"swap_optimizer": True}, False),  # NVMe: gradients are swapped to disk
        ({"dtype": torch.float16}, False),  # fp16's overflow check reads DeepSpeed's one buffer
        ({"dtype": torch.bfloat16}, True),
    ],
)
def test_it_applies_to_host_offload_without_fp16(attributes, applies):
    optimizer = _zero_3_optimizer(**{gradient_buffers._SLOTS: {}, **attributes})
    assert gradient_buffers.applies(optimizer) is applies
    if not applies:
        assert gradient_buffers.keep_gradients_with_their_optimizer(optimizer, torch.device("cpu")) is None


def test_other_optimizers_are_left_alone():
    optimizer = SimpleNamespace(offload_optimizer=True, swap_optimizer=False, dtype=torch.float32)  # not ZeRO-3
    assert gradient_buffers.applies(optimizer) is False


def test_a_zero_3_optimizer_without_the_slots_warns_what_is_lost():
    """A DeepSpeed that renamed the name-mangled slots: DeepSpeed's own buffer stays, and the user is told."""
    with pytest.warns(UserWarning, match=r"__param_id_to_grad_partition.*gradient_buffers\.py.*2 bytes per"):
        assert gradient_buffers.applies(_zero_3_optimizer()) is False


def _zero_3_optimizer(**attributes):
    """An object whose class is named as DeepSpeed's ZeRO-3 optimizer, offloading to host memory in fp32."""
    stage_3 = type(gradient_buffers._STAGE_3, (SimpleNamespace,), {})
    return stage_3(**{"offload_optimizer": True, "swap_optimizer": False, "dtype": torch.float32, **attributes})


def test_where_cuda_refuses_to_pin_it_warns_and_goes_on_pageable():
    from lightning_strategies.pinned import PinningError

    def refuse():
        raise PinningError("CUDA could not page-lock 1.00 GiB of host memory.")

    with pytest.warns(UserWarning, match="stay in pageable memory.*offload_optimizer=<ratio>"):
        assert gradient_buffers._pinned(refuse) is False
    assert gradient_buffers._pinned(lambda: None) is True


def test_gradients_sent_to_the_host_every_micro_batch_come_with_what_to_try():
    hosted = gradient_buffers.GradientPlacement(10, 2**29, 2**29 + 10, host_in_fp32=False, pinned=True)
    hint = gradient_buffers.accumulation_hint(hosted, 8, 2)
    assert hint and "each of the 8 micro-batches" in hint and "offloaded_gradients_on_gpu=True" in hint
    assert "1.0 GiB more GPU memory" in hint
    assert gradient_buffers.accumulation_hint(hosted, 1, 2) is None  # no accumulation, one trip a step anyway
    on_gpu = gradient_buffers.GradientPlacement(10, 0, 2**29 + 10, False, True, device_elements=2**29)
    assert gradient_buffers.accumulation_hint(on_gpu, 8, 2) is None
