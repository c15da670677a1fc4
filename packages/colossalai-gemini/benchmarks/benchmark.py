"""GPT throughput with ColossalAI Gemini: Lightning (this strategy) against GeminiPlugin by hand.

    python benchmark.py trainer --size 1.3b --placement cuda      # Trainer(strategy=ColossalAIStrategy)
    python benchmark.py manual  --size 1.3b --placement cuda      # GeminiPlugin + Booster, no Lightning
    python benchmark.py search  --placement cpu                   # largest size that trains 2 steps

bf16 (fp16 for placement auto, which refuses bf16), batch 8 x 1024 tokens, 4 warm-up steps then 12
timed ones. Prints one JSON line with the device, versions and date; keep it in results/ beside this file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpt import GPT, SIZES, parameter_count

BATCH, LENGTH, WARMUP, TIMED = 8, 1024, 4, 12


def precision_for(placement: str) -> str:
    return "16-mixed" if placement == "auto" else "bf16-mixed"


def batches(count: int):
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, 50304, (BATCH, LENGTH + 1), generator=generator) for _ in range(count)]


def run_trainer(size: str, placement: str, steps: int) -> dict:
    import lightning as L
    from colossalai.nn.optimizer import HybridAdam
    from torch.utils.data import DataLoader

    from lightning_strategies_colossalai.strategy import ColossalAIStrategy

    class Timed(L.Callback):
        def __init__(self):
            self.times: list[float] = []

        def on_train_batch_end(self, trainer, *args):
            torch.cuda.synchronize()
            self.times.append(time.perf_counter())

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.gpt = None
            self.losses: list[float] = []

        def configure_model(self):
            if self.gpt is None:
                self.gpt = GPT(size, LENGTH + 1)

        def training_step(self, batch, batch_idx):
            loss = self.gpt(batch)
            self.losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self):
            return HybridAdam(self.parameters(), lr=1e-4)

    timer, module = Timed(), Module()
    trainer = L.Trainer(
        accelerator="cuda",
        devices=1,
        precision=precision_for(placement),
        max_steps=steps,
        strategy=ColossalAIStrategy(placement_policy=placement),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[timer],
    )
    trainer.fit(module, DataLoader(batches(steps), batch_size=None))
    return {
        "times": timer.times,
        "losses": module.losses,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
        "memory": trainer.strategy.memory_statistics(),
    }


def run_manual(size: str, placement: str, steps: int) -> dict:
    import colossalai  # noqa: F401
    import torch.distributed as dist
    from colossalai.booster import Booster
    from colossalai.booster.plugin import GeminiPlugin
    from colossalai.lazy import LazyInitContext
    from colossalai.nn.optimizer import HybridAdam

    from lightning_strategies_colossalai.options import GeminiSettings, placement_arguments

    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29512", rank=0, world_size=1)
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    with LazyInitContext(default_device=torch.device("cuda")):
        model = GPT(size, LENGTH + 1)
    optimizer = HybridAdam(model.parameters(), lr=1e-4)
    plugin = GeminiPlugin(
        precision="fp16" if placement == "auto" else "bf16",
        **placement_arguments(GeminiSettings(placement_policy=placement)),
    )
    model, optimizer, *_ = Booster(plugin=plugin).boost(model, optimizer)
    times, losses = [], []
    for batch in batches(steps):
        loss = model(batch.cuda())
        optimizer.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter())
        losses.append(float(loss.detach()))
    return {"times": times, "losses": losses, "peak_gpu_bytes": torch.cuda.max_memory_allocated()}


def summary(mode: str, size: str, placement: str, result: dict) -> dict:
    import colossalai
    import lightning

    times = result["times"]
    timed = times[WARMUP : WARMUP + TIMED + 1]
    seconds = (timed[-1] - timed[0]) / (len(timed) - 1) if len(timed) > 1 else float("nan")
    return {
        "mode": mode,
        "size": size,
        "parameters": parameter_count(size),
        "placement": placement,
        "precision": precision_for(placement),
        "tokens_per_second": BATCH * LENGTH / seconds,
        "seconds_per_step": seconds,
        "losses": result["losses"],
        "peak_gpu_gib": result["peak_gpu_bytes"] / 2**30,
        "memory": result.get("memory"),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "colossalai": colossalai.__version__,
        "lightning": lightning.__version__,
        "date": datetime.date.today().isoformat(),
    }


def search(placement: str) -> None:
    """Try sizes from small to large in fresh processes (an OOM can leave a process unusable)."""
    largest = None
    for size in SIZES:
        result = subprocess.run(
            [sys.executable, __file__, "trainer", "--size", size, "--placement", placement, "--steps", "2"],
            capture_output=True,
            text=True,
        )
        ok = result.returncode == 0
        print(
            json.dumps(
                {
                    "search": placement,
                    "size": size,
                    "trained": ok,
                    "error": None if ok else result.stderr.strip().splitlines()[-1:],
                }
            ),
            flush=True,
        )
        if not ok:
            break
        largest = size
    print(
        json.dumps(
            {
                "search": placement,
                "largest_size": largest,
                "parameters": parameter_count(largest) if largest else 0,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["trainer", "manual", "search"])
    parser.add_argument("--size", default="1.3b", choices=list(SIZES))
    parser.add_argument("--placement", default="cuda", choices=["cuda", "cpu", "auto"])
    parser.add_argument("--steps", type=int, default=WARMUP + TIMED + 1)
    arguments = parser.parse_args()
    if arguments.mode == "search":
        search(arguments.placement)
        return
    run = run_trainer if arguments.mode == "trainer" else run_manual
    result = run(arguments.size, arguments.placement, arguments.steps)
    print(json.dumps(summary(arguments.mode, arguments.size, arguments.placement, result)))


if __name__ == "__main__":
    main()
