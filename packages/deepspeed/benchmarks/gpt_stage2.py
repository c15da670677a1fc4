"""Throughput of Trainer(strategy="deepspeed_stage_2") against the DeepSpeed engine driven by hand.

GPT of 1.3B parameters, bf16, batches of 8 x 1024 tokens, 4 warm-up and 12 timed steps, the same
DeepSpeed config for both. Prints (and writes with --out) tokens/s and peak GPU memory as JSON.

    python packages/deepspeed/benchmarks/gpt_stage2.py --out gpt_stage2.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, Dataset

WARMUP, TIMED, BATCH, LENGTH, VOCABULARY = 4, 12, 8, 1024, 50304
CONFIG = {
    "zero_optimization": {"stage": 2, "contiguous_gradients": True, "overlap_comm": True,
                          "reduce_bucket_size": 200_000_000, "allgather_bucket_size": 200_000_000},
    "bf16": {"enabled": True},
    "train_micro_batch_size_per_gpu": BATCH,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 0.0,
    "zero_allow_untested_optimizer": True,
}  # fmt: skip


class GPT(LightningModule):
    def __init__(self, width: int = 2048, layers: int = 24, heads: int = 16) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCABULARY, width)
        self.position = torch.nn.Embedding(LENGTH, width)
        layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, VOCABULARY, bias=False)
        self.head.weight = self.embedding.weight  # tied, as in GPT: 1.31B parameters in all

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device, dtype=self.head.weight.dtype)
        return self.head(self.blocks(self.embedding(tokens) + self.position(positions), mask=mask, is_causal=True))

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        logits = self(batch[:, :-1])
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.loss(batch)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class RandomTokens(Dataset):
    def __len__(self) -> int:
        return BATCH * (WARMUP + TIMED)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randint(0, VOCABULARY, (LENGTH + 1,), generator=torch.Generator().manual_seed(index))


class Timer(Callback):
    def __init__(self) -> None:
        self.start = 0.0
        self.losses: list[float] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if batch_idx == WARMUP:
            torch.cuda.synchronize()
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def with_trainer() -> dict:
    from lightning_strategies_deepspeed.strategy import DeepSpeedStrategy

    seed_everything(0)
    torch.cuda.reset_peak_memory_stats()
    timer = Timer()
    trainer = Trainer(accelerator="cuda", devices=1, strategy=DeepSpeedStrategy(config=dict(CONFIG)), precision="bf16-mixed",
                      max_steps=WARMUP + TIMED, callbacks=[timer], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(GPT(), DataLoader(RandomTokens(), batch_size=BATCH))
    torch.cuda.synchronize()
    return result(time.perf_counter() - timer.start, timer.losses)


def by_hand() -> dict:
    import deepspeed

    seed_everything(0)
    torch.cuda.reset_peak_memory_stats()
    model = GPT()
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4), config=dict(CONFIG))
    losses, start = [], 0.0
    for index, batch in enumerate(DataLoader(RandomTokens(), batch_size=BATCH)):
        if index == WARMUP:
            torch.cuda.synchronize()
            start = time.perf_counter()
        loss = engine.module.loss(batch.cuda())
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    return result(time.perf_counter() - start, losses)


def result(seconds: float, losses: list[float]) -> dict:
    return {
        "tokens_per_second": round(BATCH * LENGTH * TIMED / seconds, 1),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "last_loss": losses[-1],
        "finite": all(loss == loss for loss in losses),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["trainer", "by-hand", "both"], default="both")
    parser.add_argument("--out", default=None)
    arguments = parser.parse_args()
    import deepspeed
    import lightning

    report = {
        "device": torch.cuda.get_device_name(0),
        "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__, "lightning": lightning.__version__,
                     "python": platform.python_version()},  # fmt: skip
        "workload": {"model": "GPT 1.31B (24 layers x 2048, tied embeddings)", "precision": "bf16", "batch": BATCH, "tokens": LENGTH,
                     "warmup_steps": WARMUP, "timed_steps": TIMED, "strategy": "deepspeed_stage_2"},  # fmt: skip
        "date": time.strftime("%Y-%m-%d"),
    }
    # Separate processes would be fairer for peak memory; within one, run each once and reset the stats.
    if arguments.mode in ("trainer", "both"):
        report["trainer"] = with_trainer()
        torch.cuda.empty_cache()
    if arguments.mode in ("by-hand", "both"):
        report["by_hand"] = by_hand()
    text = json.dumps(report, indent=2)
    print(text)
    if arguments.out:
        with open(arguments.out, "w") as file:
            file.write(text + "\n")


if __name__ == "__main__":
    main()
