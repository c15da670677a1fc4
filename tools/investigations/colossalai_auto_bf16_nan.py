"""Narrowing down the NaN loss of GeminiPlugin placement "auto" with bf16 (the strategy refuses it).

    python -m tools.investigations.colossalai_auto_bf16_nan --size 1.3b --steps 8   # from the repository root

Drives GeminiPlugin by hand (no Lightning) with bf16 on one GPU, in one fresh process per variant:
  auto                    the failing combination as seen (async gradient reduction on)
  auto_sync_reduce        enable_async_reduce=False: tests the suspicion that a gradient chunk's
                          non-blocking copy to pinned CPU memory races with the freeing of its
                          CUDA storage (chunk.shard_move has no record_stream)
  static_full_offload     the "cpu" placement: gradients also go to CPU, without the memory tracer
  static_cuda             the "cuda" placement: nothing leaves the GPU (known to train)
Prints one JSON line per variant: losses, the first non-finite step, and whether the fp32 master
weights are finite after the run. If auto_sync_reduce trains, the strategy can lift its refusal by
passing enable_async_reduce=False for placement "auto".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1.3b")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--variant", choices=list(VARIANTS))
    arguments = parser.parse_args()
    if arguments.variant:
        print(json.dumps(run_variant(arguments.variant, arguments.size, arguments.steps)))
        return
    for variant in VARIANTS:
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
