"""Narrowing down the NaN loss of GeminiPlugin placement "auto" with bf16 (the strategy refuses it).

    python -m tools.investigations.colossalai_auto_bf16_nan --size 1.3b --steps 8   # from the repository root

Drives GeminiPlugin by hand (no Lightning) with bf16 on one GPU, in one fresh process per variant:
  auto                    the failing combination as seen (async gradient reduction on)
  auto_sync_reduce        enable_async_reduce=False: tests the suspicion that a gradient chunk's
                          non-blocking copy to pinned CPU memory races with the freeing of its
                          CUDA storage (chunk.shard_move has no record_stream)
  static_full_offload     the "cpu" placement: gradients also go to CPU, without the memory tracer
  static_cuda             the "cuda" placement: nothing leaves the GPU (known to train)
  trainer_auto            the same model through Trainer(strategy=ColossalAIStrategy(placement_policy="auto"),
                          precision="bf16-mixed") (unpinned, so no async reduce: the strategy's default;
                          when it ran, the strategy's refusal of auto+bf16 was switched off for the run)
  trainer_auto_pinned     the same with pin_memory=True (async reduce on, as when the NaN was seen)
Prints one JSON line per variant: losses, the first non-finite step, and whether the fp32 master
weights are finite after the run.

Result (sixth session, one H200, torch 2.11, ColossalAI 0.5.0, 1.3B, 8 steps, commits f625960 and f6e214d): every
variant trained to finite losses, the two through the Trainer included (11.24 to 11.16; by hand 11.23 to 11.17).
The NaN was not ColossalAI's and no longer happens through the strategy, so the refusal is lifted; its cause, in
the strategy's first version, was not found.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from typing import Any

import torch

from tools.benchmark.model import GPT
from tools.benchmark.sizes import SIZES

VARIANTS = {
    "auto": {"placement_policy": "auto"},
    "auto_sync_reduce": {"placement_policy": "auto", "enable_async_reduce": False},
    "static_full_offload": {
        "placement_policy": "static",
        "offload_optim_frac": 1.0,
        "offload_param_frac": 1.0,
    },
    "static_cuda": {"placement_policy": "static"},
}
THROUGH_TRAINER = {"trainer_auto": {}, "trainer_auto_pinned": {"pin_memory": True}}


def run_variant(variant: str, size: str, steps: int) -> dict:
    import torch.distributed as dist
    from colossalai.booster import Booster
    from colossalai.booster.plugin import GeminiPlugin
    from colossalai.lazy import LazyInitContext
    from colossalai.nn.optimizer import HybridAdam

    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29513", rank=0, world_size=1)
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    with LazyInitContext(default_device=torch.device("cuda")):
        model = GPT(SIZES[size], 1024)
    optimizer = HybridAdam(model.parameters(), lr=1e-4)
    plugin = GeminiPlugin(precision="bf16", **VARIANTS[variant])
    model, optimizer, *_ = Booster(plugin=plugin).boost(model, optimizer)
    generator = torch.Generator().manual_seed(0)
    losses, first_bad = [], None
    for step in range(steps):
        batch = torch.randint(0, 50304, (8, 1025), generator=generator).cuda()
        loss = model(batch)
        optimizer.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        if first_bad is None and not torch.isfinite(loss.detach()):
            first_bad = step
    masters = [chunk.paired_chunk for chunk in optimizer.chunk16_set]
    finite_masters = all(
        bool(torch.isfinite(c.cpu_shard if c.cpu_shard is not None else c.cuda_shard).all())
        for c in masters
        if (c.cpu_shard is not None or c.cuda_shard is not None)
    )
    return {
        "variant": variant,
        "size": size,
        "losses": losses,
        "first_non_finite_step": first_bad,
        "master_weights_finite": finite_masters,
    }


def run_through_trainer(variant: str, size: str, steps: int) -> dict:
    """The same model, data and optimizer through Lightning and the strategy."""
    from lightning.pytorch import Trainer

    from lightning_strategies_colossalai.strategy import ColossalAIStrategy
    from tools.benchmark.lightning_runs import GPTModule
    from tools.benchmark.measure import Workload

    losses: list[float] = []

    class Recorded(GPTModule):
        def on_train_batch_end(self, outputs: Any, *arguments: Any) -> None:
            losses.append(float(outputs["loss"]))

    torch.manual_seed(0)
    module = Recorded(Workload(run=variant, size=size), "hybrid_adam")
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 50304, (1025,), generator=generator) for _ in range(8 * steps)]
    strategy = ColossalAIStrategy(placement_policy="auto", **THROUGH_TRAINER[variant])
    trainer = Trainer(accelerator="cuda", devices=1, strategy=strategy, precision="bf16-mixed", max_steps=steps,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False)  # fmt: skip
    trainer.fit(module, torch.utils.data.DataLoader(batches, batch_size=8))
    bad = [step for step, loss in enumerate(losses) if not math.isfinite(loss)]
    return {"variant": variant, "size": size, "losses": losses, "first_non_finite_step": bad[0] if bad else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1.3b")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--variant", choices=[*VARIANTS, *THROUGH_TRAINER])
    arguments = parser.parse_args()
    if arguments.variant:
        run = run_through_trainer if arguments.variant in THROUGH_TRAINER else run_variant
        print(json.dumps(run(arguments.variant, arguments.size, arguments.steps)))
        return
    for variant in [*VARIANTS, *THROUGH_TRAINER]:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                __spec__.name,  # run as a module, so tools.benchmark imports from the repository root
                "--variant",
                variant,
                "--size",
                arguments.size,
                "--steps",
                str(arguments.steps),
            ],
            capture_output=True,
            text=True,
        )
        lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
        print(
            lines[-1] if lines else json.dumps({"variant": variant, "error": result.stderr.strip()[-500:]}),
            flush=True,
        )


if __name__ == "__main__":
    main()
