"""Throughput of ``Trainer(strategy="fsdp")`` against ``fully_shard`` driven by hand, same model and wrapping.

GPT 1.3B (d_model 2048, 24 layers, 16 heads, vocabulary 50304), bf16 mixed precision (bf16 compute,
fp32 shards, fp32 gradient reduction), 8 sequences of 1024 tokens per GPU and step, AdamW, 4 warm-up
steps then 12 timed steps. Both modes build the model on the meta device and shard every block and
the root with the same function (lightning_strategies_fsdp.sharding.shard_model).

    python packages/fsdp/benchmarks/gpt_throughput.py compare --out result.json          # 1 GPU
    python packages/fsdp/benchmarks/gpt_throughput.py compare --devices 2 --out r2.json  # 2 GPUs

``compare`` runs each mode in its own process and writes one JSON with both results and the ratio
trainer / by-hand tokens per second (the target is >= 0.97).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

VOCABULARY, WIDTH, LAYERS, HEADS, SEQUENCE = 50304, 2048, 24, 16, 1024
BATCH, WARMUP, TIMED = 8, 4, 12


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.out = nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, length, WIDTH))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attention = Attention()
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH, bias=False), nn.Linear(4 * WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, WIDTH)
        self.position = nn.Embedding(SEQUENCE, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCABULARY, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def loss_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, VOCABULARY), tokens[:, 1:].reshape(-1))


def batches(steps: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCABULARY, (BATCH, SEQUENCE + 1), generator=generator) for _ in range(steps)]


def summarize(mode: str, step_seconds: list[float], world_size: int, parameters: int, losses: list[float]) -> dict:
    timed = step_seconds[WARMUP:]
    tokens = BATCH * SEQUENCE * world_size * len(timed)
    return {
        "mode": mode,
        "tokens_per_second": tokens / sum(timed),
        "tokens_per_second_per_gpu": tokens / sum(timed) / world_size,
        "mean_step_seconds": sum(timed) / len(timed),
        "step_seconds": step_seconds,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "world_size": world_size,
        "parameters": parameters,
        "final_loss": losses[-1],
        "losses_finite": all(math.isfinite(loss) for loss in losses),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }


def run_by_hand(out: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from lightning_strategies_fsdp.options import mixed_precision_for, parse_options
    from lightning_strategies_fsdp.sharding import shard_model

    if "RANK" not in os.environ:  # a single process without torchrun
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("nccl")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = GPT()
    options = parse_options()
    mesh = init_device_mesh("cuda", (world_size,))
    shard_model(model, options, mesh, device, mixed_precision_for("bf16-mixed"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step_seconds, losses = [], []
    for tokens in batches(WARMUP + TIMED, seed=rank):
        torch.cuda.synchronize()
        start = time.perf_counter()
        tokens = tokens.to(device, non_blocking=True)
        loss = loss_of(model, tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step_seconds.append(time.perf_counter() - start)
        losses.append(float(loss))
    parameters = sum(param.numel() for param in model.parameters())
    if rank == 0:
        out.write_text(json.dumps(summarize("by_hand", step_seconds, world_size, parameters, losses), indent=1))
    dist.destroy_process_group()


def run_trainer(out: Path, devices: int) -> None:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model: GPT | None = None

        def configure_model(self) -> None:
            if self.model is None:
                torch.manual_seed(0)
                with torch.device("meta"):
                    self.model = GPT()

        def training_step(self, tokens: torch.Tensor, batch_index: int) -> torch.Tensor:
            return loss_of(self.model, tokens)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Timer(pl.Callback):
        def __init__(self) -> None:
            self.step_seconds: list[float] = []
            self.losses: list[float] = []

        def on_train_batch_start(self, trainer, module, batch, batch_index) -> None:
            torch.cuda.synchronize()
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_index) -> None:
            torch.cuda.synchronize()
            self.step_seconds.append(time.perf_counter() - self.start)
            self.losses.append(float(outputs["loss"]))

    timer = Timer()
    trainer = pl.Trainer(
        use_distributed_sampler=False,
        accelerator="cuda",
        devices=devices,
        strategy="fsdp",
        precision="bf16-mixed",
        max_steps=WARMUP + TIMED,
        gradient_clip_val=1.0,
        callbacks=[timer],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    rank = int(os.environ.get("LOCAL_RANK", 0))
    # Each process gets its own batches, as in the by-hand run: no sampler splitting a shared list.
    loader = DataLoader(batches(WARMUP + TIMED, seed=rank), batch_size=None)
    module = Module()
    trainer.fit(module, loader)
    parameters = sum(param.numel() for param in module.parameters())
    if trainer.is_global_zero:
        result = summarize("trainer", timer.step_seconds, trainer.world_size, parameters, timer.losses)
        result["strategy_class"] = f"{type(trainer.strategy).__module__}.{type(trainer.strategy).__name__}"
        out.write_text(json.dumps(result, indent=1))


def compare(out: Path, devices: int) -> None:
    results = {}
    for mode in ("by_hand", "trainer"):
        part = out.with_suffix(f".{mode}.json")
        if mode == "by_hand" and devices > 1:
            command = ["torchrun", f"--nproc-per-node={devices}", __file__, mode, "--out", str(part)]
        else:
            command = [sys.executable, __file__, mode, "--out", str(part), "--devices", str(devices)]
        subprocess.run(command, check=True)
        results[mode] = json.loads(part.read_text())
    results["ratio_trainer_over_by_hand"] = (
        results["trainer"]["tokens_per_second"] / results["by_hand"]["tokens_per_second"]
    )
    results["target"] = 0.97
    results["taken"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    out.write_text(json.dumps(results, indent=1))
    print(json.dumps({key: results[key] for key in ("ratio_trainer_over_by_hand", "target")}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("compare", "by_hand", "trainer"))
    parser.add_argument("--out", type=Path, default=Path("gpt_throughput.json"))
    parser.add_argument("--devices", type=int, default=1)
    args = parser.parse_args()
    if args.mode == "compare":
        compare(args.out, args.devices)
    elif args.mode == "by_hand":
        run_by_hand(args.out)
    else:
        run_trainer(args.out, args.devices)


if __name__ == "__main__":
    main()
