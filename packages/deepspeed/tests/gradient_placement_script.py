"""Trains a small model on one CPU process with ZeRO-3 offloading half of the optimizer states, 2 micro-batches
an optimizer step, five ways, and writes each way's losses, final weights and gradient slots (run by
test_gradient_buffers.py):

- "kept": the strategy as shipped. On a CPU run backward produces gradients where every sub-group's fp32
  gradient lives, so every slot is kept in its sub-group's fp32 gradient.
- "hosted": as if backward ran on a GPU (a stand-in: no GPU here), so every slot goes to the 16-bit host buffer.
- "hosted-fp32": the same with offloaded_gradients_in_fp32, so every slot goes into its sub-group's fp32 gradient
  on the host.
- "hosted-accumulating": the same with offloaded_gradients_on_gpu, so every slot goes to one 16-bit buffer where
  backward runs (the CPU here, standing in for the GPU), copied to the fp32 gradients once an optimizer step.
- "deepspeed": DeepSpeed's own all-parameter buffer, left in place.

The model is four linear layers, or with a second argument a tiny Hugging Face ``transformers`` model of that
family from the conformance kit ("gpt2": tied input and output embeddings, so one parameter takes gradients
from two places in a micro-batch; "llama").
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, TensorDataset

from lightning_strategies.conformance.launching import end_process_group
from lightning_strategies_deepspeed import body, gradient_buffers
from lightning_strategies_deepspeed.strategy import DeepSpeedStrategy

SLOTS = gradient_buffers._SLOTS


class Layers(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(4)))
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(self.layers(inputs), targets)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(self.parameters(), lr=0.01)


class CausalLanguageModel(LightningModule):
    """A tiny model of a ``transformers`` family, its own initialisation, trained on random token ids."""

    def __init__(self, family: str) -> None:
        super().__init__()
        import transformers

        from lightning_strategies.conformance.hugging_face import tiny_config

        self.model = transformers.AutoModelForCausalLM.from_config(tiny_config(family))
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        (tokens,) = batch
        loss = self.model(input_ids=tokens, labels=tokens).loss
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(self.parameters(), lr=0.01)


def model_and_data(family: str | None) -> tuple[LightningModule, TensorDataset]:
    if family is None:
        return Layers(), TensorDataset(torch.randn(24, 32), torch.randn(24, 32))
    from lightning_strategies.conformance.hugging_face import LENGTH, VOCABULARY

    # One batch of four sequences, six times: random tokens are learnt only where they come again.
    return CausalLanguageModel(family), TensorDataset(torch.randint(0, VOCABULARY, (4, LENGTH)).repeat(6, 1))


placements: list[gradient_buffers.GradientPlacement | None] = []


def placement_for(way: str):
    """The strategy's placement call for ``way``, recording what it returns."""
    device = torch.device("cuda") if way.startswith("hosted") else None

    def place(optimizer, training_device, in_fp32=False, accumulate_on=None):
        if way == "deepspeed":
            placement = None
        else:
            placement = gradient_buffers.keep_gradients_with_their_optimizer(
                optimizer,
                device or training_device,
                pin=False,
                in_fp32=in_fp32 or way == "hosted-fp32",
                accumulate_on=training_device if way == "hosted-accumulating" else accumulate_on,
            )
        placements.append(placement)
        return placement

    return place


def train(way: str, family: str | None) -> dict:
    body.keep_gradients_with_their_optimizer = placement_for(way)
    seed_everything(7)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        strategy=DeepSpeedStrategy(stage=3, offload_optimizer=0.5, sub_group_size=300),
        max_steps=3,
        accumulate_grad_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model, data = model_and_data(family)
    trainer.fit(model, DataLoader(data, batch_size=4))
    optimizer = trainer.strategy.model.optimizer
    slots = getattr(optimizer, SLOTS)
    gradients = [group.grad for group in optimizer.fp32_partitioned_groups_flat]
    in_fp32_gradient = [
        any(slot.untyped_storage().data_ptr() == gradient.untyped_storage().data_ptr() for gradient in gradients)
        for slot in slots.values()
    ]
    buffer = optimizer.grad_partitions_flat_buffer
    weights = torch.cat([group.detach().flatten() for group in optimizer.fp32_partitioned_groups_flat])
    return {
        "losses": model.losses,
        "weights": weights.tolist(),
        "slots": len(slots),
        "slots_in_fp32_gradients": sum(in_fp32_gradient),
        "deepspeed_buffer_elements": 0 if buffer is None else buffer.numel(),
        "placement": None if placements[-1] is None else dataclasses.asdict(placements[-1]),
        "parameter_elements": sum(group.numel() for group in optimizer.fp32_partitioned_groups_flat),
        "tied_embeddings": tied(model),
    }


def tied(model: LightningModule) -> bool | None:
    """Whether the Hugging Face model's output embedding is still its input embedding after training."""
    if not isinstance(model, CausalLanguageModel):
        return None
    return model.model.get_output_embeddings().weight is model.model.get_input_embeddings().weight


def main() -> None:
    family = sys.argv[2] if len(sys.argv) > 2 else None
    if family:
        # Before the first way seeds its run, so that no import draws from one way's random state alone.
        importlib.import_module("transformers")
    ways = ("kept", "hosted", "hosted-fp32", "hosted-accumulating", "deepspeed")
    results = {way: train(way, family) for way in ways}
    with open(sys.argv[1], "w") as file:
        json.dump(results, file)


if __name__ == "__main__":
    main()
    end_process_group()  # before exit, so that gloo's threads cannot abort it
