"""A small GPT trained with DeepSpeed strategy names on GPUs (used by test_gpu.py).

One launch runs a list of runs one after the other in the same processes, as users do in
notebooks and sweeps: each run is a new Trainer, and a run that resumes saves, then fits, tests and
resumes with yet another Trainer. One launch per group also keeps the GPU tier short, since every
launch pays for importing DeepSpeed and setting up NCCL again.
"""

from __future__ import annotations

import argparse
import json
import math
import traceback
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, Dataset

from lightning_strategies.conformance.launching import end_process_group
from lightning_strategies_deepspeed.gradient_buffers import _SLOTS


class Tokens(Dataset):
    def __init__(self, vocabulary: int, length: int, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        # A learnable pattern: each next token is the previous plus one.
        starts = torch.randint(0, vocabulary, (count, 1), generator=generator)
        self.data = (starts + torch.arange(length + 1)) % vocabulary

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]


class TinyGPT(LightningModule):
    def __init__(self, vocabulary: int = 256, width: int = 128, layers: int = 2, heads: int = 4, length: int = 64,
                 config_optimizer: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.length = length
        self.config_optimizer = config_optimizer
        self.embedding = torch.nn.Embedding(vocabulary, width)
        self.position = torch.nn.Embedding(length, width)
        layer = torch.nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(width, vocabulary)
        self.losses: list[float] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        hidden = self.embedding(tokens) + self.position(positions)
        return self.head(self.blocks(hidden, mask=mask, is_causal=True))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        self.losses.append(loss.item())
        return loss

    def test_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        logits = self(batch[:, :-1])
        self.log("test_loss", torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten()))

    def configure_optimizers(self):
        if self.config_optimizer:
            return None  # the DeepSpeed config's optimizer is used
        if self.trainer.strategy.config.get("zero_optimization", {}).get("offload_optimizer"):
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(self.parameters(), lr=1e-3)
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def build_strategy(run: dict, nvme_path: str):
    """The strategy name, or its class built with the options a run needs beyond the name."""
    name = run["strategy"]
    if not (name.endswith("nvme") or run.get("config_optimizer") or run.get("offload_ratio")):
        return name
    from lightning_strategies import get_registry

    entry = get_registry().entry(name)
    options = dict(entry.init_params)
    if name.endswith("nvme"):
        options["nvme_path"] = nvme_path
    if run.get("config_optimizer"):
        optimizer = {"type": "AdamW", "params": {"lr": 1e-3}}
        options = {"config": {"zero_optimization": {"stage": 2}, "optimizer": optimizer}}
    if run.get("offload_ratio"):
        # Sub-groups of about a tenth of TinyGPT, so that the ratio splits them between the GPU and the host.
        options.update(offload_optimizer=run["offload_ratio"], sub_group_size=50_000)
    if run.get("fp32_host_gradients"):
        options["offloaded_gradients_in_fp32"] = True
    if run.get("gradients_on_gpu"):
        options["offloaded_gradients_on_gpu"] = True
    return entry.load_class()(**options)


class GradientNorms(Callback):
    """The global gradient norm DeepSpeed computed (before clipping) at each step."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_train_batch_end(self, trainer, *args) -> None:
        norm = trainer.strategy.deepspeed_engine.get_global_grad_norm()
        self.norms.append(float(norm) if norm is not None else math.nan)


def fit(run: dict, nvme_path: str, steps: int, ckpt_path: str | None = None) -> tuple[Trainer, TinyGPT, GradientNorms]:
    seed_everything(0)
    model = TinyGPT(config_optimizer=run.get("config_optimizer", False))
    norms = GradientNorms()
    trainer = Trainer(
        accelerator=run.get("accelerator", "cuda"), devices=run["devices"], strategy=build_strategy(run, nvme_path),
        precision=run.get("precision", "bf16-mixed"), max_steps=steps, gradient_clip_val=run.get("clip"),
        accumulate_grad_batches=run.get("accumulate", 1), logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[norms],
    )  # fmt: skip
    trainer.fit(model, DataLoader(Tokens(256, 64, 1024), batch_size=8, shuffle=True), ckpt_path=ckpt_path)
    return trainer, model, norms


def perform(run: dict, folder: Path) -> dict:
    """One run: fit; where asked, save, then resume with a new Trainer to twice the steps and test."""
    from deepspeed.accelerator import get_accelerator

    steps = run.get("steps", 10)
    folder.mkdir(parents=True, exist_ok=True)
    trainer, model, norms = fit(run, str(folder), steps, ckpt_path=run.get("resume_from"))
    first, last = sum(model.losses[:3]) / 3, sum(model.losses[-3:]) / 3
    result = {"first_loss": first, "last_loss": last, "finite": all(map(math.isfinite, model.losses)),
              "global_step": trainer.global_step, "steps_run": len(model.losses),
              "deepspeed_accelerator": get_accelerator().device_name(), "grad_norms": norms.norms,
              "world_size": trainer.world_size,
              "config": json.loads(json.dumps(trainer.strategy.config, default=str)),
              "gradient_slots": gradient_slots(trainer.strategy.model.optimizer)}  # fmt: skip
    if run.get("resume"):
        checkpoint = folder / "run.ckpt"
        trainer.save_checkpoint(checkpoint)
        result["saved_tag_file"] = (checkpoint / "latest").is_file()
        result["checkpoint"] = str(checkpoint)
        resumed, resumed_model, _ = fit(run, str(folder), 2 * steps, ckpt_path=str(checkpoint))
        result["resumed_global_step"], result["resumed_steps_run"] = resumed.global_step, len(resumed_model.losses)
        result["resumed_world_size"] = resumed.world_size
        result["resumed_last_loss"] = sum(resumed_model.losses[-3:]) / 3
        result["resumed_gradient_slots"] = gradient_slots(resumed.strategy.model.optimizer)
        result["test_loss"] = float(resumed.test(resumed_model, DataLoader(Tokens(256, 64, 64), batch_size=8),
                                                 verbose=False)[0]["test_loss"])  # fmt: skip
    return result


def gradient_slots(optimizer) -> dict:
    """Elements of ZeRO-3's per-parameter gradient slots on each device type, their dtypes, and whether the host
    ones are page-locked (empty where the optimizer has no such slots)."""
    slots = getattr(optimizer, _SLOTS, {})
    found: dict = {}
    for slot in slots.values():
        found[slot.device.type] = found.get(slot.device.type, 0) + slot.numel()
    host = [slot for slot in slots.values() if slot.device.type == "cpu"]
    found["host_pinned"] = bool(host) and all(slot.is_pinned() for slot in host)
    found["dtypes"] = {
        side: sorted({str(slot.dtype) for slot in slots.values() if slot.device.type == side})
        for side in ("cpu", "cuda")
    }
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", required=True, help="JSON list of runs: strategy, devices, precision, steps, "
                        "accelerator, clip, resume, resume_from (a checkpoint to fit from), config_optimizer, "
                        "offload_ratio, accumulate, fp32_host_gradients, gradients_on_gpu")  # fmt: skip
    parser.add_argument("--folder", required=True, help="NVMe offload and checkpoints go below it")
    parser.add_argument("--out", required=True, help="JSON results, one per run, written after each run")
    arguments = parser.parse_args()
    results: dict[str, dict] = {}
    for run in json.loads(arguments.runs):
        key = run_key(run)
        folder = Path(arguments.folder) / key
        try:
            result = perform(run, folder)
        except Exception as error:  # one failing run must not hide the others' results
            result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-4000:]}
        if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            continue
        results[key] = result
        Path(arguments.out).write_text(json.dumps(results))


def run_key(run: dict) -> str:
    options = [run.get("precision", "bf16-mixed")]
    options += [f"clip{run['clip']}"] if run.get("clip") else []
    options += ["fused"] if run.get("config_optimizer") else []
    options += [f"offload{run['offload_ratio']}"] if run.get("offload_ratio") else []
    options += [f"accumulate{run['accumulate']}"] if run.get("accumulate") else []
    options += ["fp32-host-gradients"] if run.get("fp32_host_gradients") else []
    options += ["gradients-on-gpu"] if run.get("gradients_on_gpu") else []
    options += ["resumed"] if run.get("resume_from") else []
    return "-".join([run["strategy"], f"{run['devices']}gpu", *options])


if __name__ == "__main__":
    main()
    end_process_group()  # before exit, so that gloo's threads cannot abort it
