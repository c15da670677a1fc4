"""Checkpoints written under ddp, fsdp, deepspeed and colossalai resumed under one another by ``ckpt_path`` alone,
on the machine's several GPUs (run by tests/test_cross_strategy_gpu.py; Lightning launches the other ranks).

Usage: python cross_strategy.py OUT_FOLDER DEVICES PHASE (one of PHASES, below)

TinyGPT's data and loss with a model of linear layers (ZeRO-3 and FSDP2's meta-device build take it as it is;
torch's MultiheadAttention suits neither), bf16-mixed, Adam: torch's under ddp, fsdp and deepspeed, HybridAdam
(which ColossalAI requires; the same update) under colossalai. Each source strategy trains 2 epochs of 3 batches
uninterrupted, and 1 epoch that saves at its end; each checkpoint is resumed under colossalai_cuda, and
ColossalAI's under the others, and the others' under one another (ZeRO-2 and ZeRO-3 included), for the second
epoch. A control resumes ddp's checkpoint with its Adam moments emptied. The saves run in one launch (ColossalAI's
first), the resumes under colossalai in a second, those of ColossalAI's checkpoints in a third and the rest in a
fourth, so that no colossalai run follows another backend's in its process. Rank 0
writes OUT_FOLDER/<run>.pt for every run: its losses, or its error. A resume under colossalai also records the
weights and Adam moments Gemini holds once restored (by parameter name). Beside them,
OUT_FOLDER/reference-<source>.pt holds each checkpoint's own weights and moments by name, read
through the convert command's one-file form.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_gpt import VOCAB, WIDTH, TinyGPT

from lightning_strategies import get_registry
from lightning_strategies.checkpoints import keyed_by_name
from lightning_strategies.checkpoints.convert import convert
from lightning_strategies_colossalai.checkpoint_state import fp32_chunk_transfers

# name -> (strategy name, options, TinyGPT's optimizer)
SOURCES: dict[str, tuple[str, dict[str, Any], str]] = {
    "ddp": ("ddp", {}, "adam"),
    "fsdp": ("fsdp", {}, "adam"),
    "deepspeed_stage_2": ("deepspeed_stage_2", {}, "adam"),
    "deepspeed_stage_3": ("deepspeed_stage_3", {}, "adam"),
    "colossalai-full": ("colossalai_cuda", {"state_dict_type": "full"}, "hybrid"),
    "colossalai-sharded": ("colossalai_cuda", {"state_dict_type": "sharded"}, "hybrid"),
}
COLOSSALAI = ("colossalai-full", "colossalai-sharded")
SOURCES = {name: SOURCES[name] for name in sorted(SOURCES, key=lambda name: name not in COLOSSALAI)}
OTHERS = [name for name in SOURCES if name not in COLOSSALAI]
PAIRS = (
    [(source, "colossalai-full") for source in SOURCES]
    + [(source, target) for source in COLOSSALAI for target in OTHERS]
    + [(source, target) for source in OTHERS for target in OTHERS if source != target]
)
PHASES = ("saves", "resumes-under-colossalai", "resumes-of-colossalai", "resumes-among-the-others")


def phase_of(source: str, target: str) -> str:
    """The launch a resume runs in: no colossalai run may follow another backend's in its process."""
    if target in COLOSSALAI:
        return "resumes-under-colossalai"
    return "resumes-of-colossalai" if source in COLOSSALAI else "resumes-among-the-others"


class LinearGPT(TinyGPT):
    def configure_model(self) -> None:
        if self.net is not None:
            return
        torch.manual_seed(0)
        self.net = torch.nn.ModuleDict(
            {
                "embed": torch.nn.Embedding(VOCAB, WIDTH),
                "blocks": torch.nn.Sequential(
                    torch.nn.Linear(WIDTH, 4 * WIDTH),
                    torch.nn.GELU(),
                    torch.nn.Linear(4 * WIDTH, WIDTH),
                    torch.nn.LayerNorm(WIDTH),
                ),
                "head": torch.nn.Linear(WIDTH, VOCAB),
            }
        )


class RecordRestored(L.Callback):
    """Under colossalai: the fp32 master weights and Adam's states as restored, by parameter name (rank 0)."""

    def __init__(self) -> None:
        self.restored: dict[str, Any] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = trainer.strategy.gemini_optimizer.state_dict(only_rank_0=True)  # every rank takes part in gathering
        with fp32_chunk_transfers(trainer.strategy._gemini_model):
            weights = trainer.strategy._gemini_model.state_dict(only_rank_0=True)
        if not trainer.is_global_zero:
            return
        # One param group built from parameters(): Gemini numbers them in the module's order. Named here apart from
        # the strategy's own mapping (optimizer_positions), which this checks.
        names = dict(enumerate(name for name, _ in pl_module.named_parameters()))
        self.restored = {
            "weights": {key: value.detach().float().cpu() for key, value in weights.items()},
            "states": {
                names[number]: {key: value.detach().cpu() for key, value in states.items()}
                for number, states in state["state"].items()
            },
        }


def fit(out: Path, devices: int, name: str, epochs: int, resume: Path | None = None) -> dict[str, Any]:
    strategy_name, options, optimizer = SOURCES[name]
    L.seed_everything(7)
    record = RecordRestored()
    trainer = L.Trainer(
        accelerator="cuda",
        devices=devices,
        precision="bf16-mixed",
        max_epochs=epochs,
        limit_train_batches=3,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
        strategy=get_registry().resolve(strategy_name, **options) if options else strategy_name,
        callbacks=[record] if name in COLOSSALAI and resume is not None else [],
    )
    model = LinearGPT(optimizer=optimizer)
    trainer.fit(model, ckpt_path=resume)
    return {"trainer": trainer, "losses": model.losses, "restored": record.restored}


def reference(checkpoint: Path, scratch: Path) -> dict[str, Any]:
    """The checkpoint's weights and Adam states by parameter name, from its one-file form."""
    full = scratch / "full.ckpt"
    converted = convert(checkpoint, full, "full")
    loaded = torch.load(converted.written or checkpoint, weights_only=False, map_location="cpu")
    (optimizer,) = loaded["optimizer_states"]
    return {
        "weights": {key: value.float() for key, value in loaded["state_dict"].items()},
        "states": keyed_by_name(optimizer, list(loaded["state_dict"]))["state"],
    }


def run(out: Path, key: str, work: Any, *arguments: Any, **options: Any) -> None:
    """``work(*arguments, **options)``, its result (or error) written by rank 0 as ``out/key.pt``."""
    try:
        result = work(*arguments, **options)
    except Exception as error:  # one failing run must not hide the others' results
        result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-4000:]}
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        result.pop("trainer", None)
        torch.save(result, out / f"{key}.pt")


def first_half(out: Path, devices: int, name: str) -> dict[str, Any]:
    result = fit(out / "runs", devices, name, epochs=1)
    result["trainer"].save_checkpoint(out / f"{name}.ckpt")
    return result


def resume_without_adam_moments(out: Path, devices: int) -> dict[str, Any]:
    """The control: ddp's checkpoint with its optimizer's states emptied, which Adam then starts afresh, resumed for
    the second epoch; the rest of the run (weights, loop state) resumes as saved. What a resume that lost Adam's
    moments gives. Each process writes the same file (atomically), so that none reads it before it is whole."""
    saved = torch.load(out / "ddp.ckpt", weights_only=False, map_location="cpu")
    for optimizer in saved["optimizer_states"]:
        optimizer["state"] = {}
    control = out / "ddp-without-moments.ckpt"
    staged = control.with_suffix(f".{os.getpid()}")
    torch.save(saved, staged)
    staged.replace(control)
    return fit(out / "runs", devices, "ddp", epochs=2, resume=control)


def main() -> None:
    out, devices, phase = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    out.mkdir(parents=True, exist_ok=True)
    if phase == "saves":
        for name in SOURCES:
            run(out, f"uninterrupted-{name}", fit, out / "runs", devices, name, epochs=2)
            run(out, f"first-half-{name}", first_half, out, devices, name)
            if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
                (out / f"scratch-{name}").mkdir()
                run(out, f"reference-{name}", reference, out / f"{name}.ckpt", out / f"scratch-{name}")
        run(out, "without-moments-ddp", resume_without_adam_moments, out, devices)
        return
    for source, target in PAIRS:
        if phase_of(source, target) == phase:
            resume = out / f"{source}.ckpt"
            run(out, f"{source}-to-{target}", fit, out / "runs", devices, target, epochs=2, resume=resume)


if __name__ == "__main__":
    main()
