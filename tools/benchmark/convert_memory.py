"""Host memory and time of ``lightning-strategies convert`` on a large checkpoint.

``python -m tools.benchmark.convert_memory`` writes one full Lightning checkpoint of the GPT of model.py (``--size``:
its fp32 weights and AdamW's two moments after one step, on the CPU) and a ZeRO-2 folder of the same GPT after one step
(saved by the Trainer under ``deepspeed_stage_2``), then runs the command for each route, each in
a process of its own, sampling the resident memory of its process tree: the anonymous part (what the conversion
holds; ``RssAnon``) apart from the file-backed part (pages of the files it reads or writes mapped in, which the
kernel drops under pressure). Writes the peaks, the seconds (or the error a route ended with) and the checkpoint's
size to ``--out`` as JSON, with the versions, date and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from tools.benchmark.environment import versions
from tools.benchmark.memory_accuracy import TreeSampler
from tools.benchmark.model import GPT
from tools.benchmark.sizes import SIZES, VOCABULARY

# (route, source, --to): the full file into each layout, and the DCP folder back, through each package's converter;
# "low memory" is the fsdp package's sharded_to_full(low_memory=True), which the command chooses by itself where the
# folder is larger than half the memory available.
ROUTES = [
    ("full -> fsdp", "full.ckpt", "fsdp"),
    ("full -> deepspeed", "full.ckpt", "deepspeed"),
    ("fsdp -> full", "full -> fsdp", "full"),
    ("fsdp -> full, low memory", "full -> fsdp", "full"),
    ("fsdp -> deepspeed", "full -> fsdp", "deepspeed"),
    ("deepspeed -> full", "zero.ckpt", "full"),
]
# A ZeRO-2 folder as the Trainer saves it: the same GPT after one AdamW step under deepspeed_stage_2, one CPU process.
ZERO_SAVE = """
import sys
import torch
from lightning.pytorch import LightningModule, Trainer
from tools.benchmark.model import GPT
from tools.benchmark.sizes import SIZES, VOCABULARY

class Module(LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = GPT(SIZES[sys.argv[1]], length=16)

    def training_step(self, batch, batch_index):
        return self.model(batch)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)

tokens = torch.utils.data.DataLoader(torch.randint(0, VOCABULARY, (1, 17)), batch_size=1)
trainer = Trainer(strategy="deepspeed_stage_2", accelerator="cpu", devices=1, max_steps=1, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Module(), tokens)
trainer.save_checkpoint(sys.argv[2])
"""
LOW_MEMORY = (
    "import sys; from lightning_strategies_fsdp.checkpoint import sharded_to_full; "
    "sharded_to_full(sys.argv[1], sys.argv[2], low_memory=True)"
)


def write_checkpoint(size: str, path: Path) -> None:
    torch.manual_seed(0)
    model = GPT(SIZES[size], length=16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randint(0, VOCABULARY, (1, 17))).backward()
    optimizer.step()
    checkpoint = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()], "global_step": 1}
    torch.save(checkpoint, path)


def convert(source: Path, out: Path, to: str, low_memory: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "lightning_strategies.cli", "convert", str(source), str(out), "--to", to]
    if low_memory:
        command = [sys.executable, "-c", LOW_MEMORY, str(source), str(out)]
    began = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    anonymous, file_backed = (TreeSampler(process.pid, interval=0.05, kind=kind) for kind in ("RssAnon", "RssFile"))
    anonymous.start()
    file_backed.start()
    output, _ = process.communicate()
    peaks = {"anonymous_peak_bytes": anonymous.stop(), "file_backed_peak_bytes": file_backed.stop()}
    if process.returncode != 0:  # kept with the others: what fails at one commit may not at another
        return {"error": output.strip().splitlines()[-1] if output.strip() else f"exit {process.returncode}"}
    return {"seconds": round(time.perf_counter() - began, 1), **peaks}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark.convert_memory", description=__doc__)
    parser.add_argument("--size", default="350m", choices=sorted(SIZES))
    parser.add_argument("--folder", type=Path, required=True, help="where the checkpoints go (emptied first)")
    parser.add_argument("--out", type=Path, required=True)
    arguments = parser.parse_args(argv)
    shutil.rmtree(arguments.folder, ignore_errors=True)
    arguments.folder.mkdir(parents=True)
    full = arguments.folder / "full.ckpt"
    write_checkpoint(arguments.size, full)
    zero = arguments.folder / "zero.ckpt"
    subprocess.run([sys.executable, "-c", ZERO_SAVE, arguments.size, str(zero)], check=True)
    written = {"full.ckpt": full, "zero.ckpt": zero}
    results = {}
    for route, source, to in ROUTES:
        written[route] = arguments.folder / route.replace(" -> ", "-to-").replace(", ", "-").replace(" ", "-")
        results[route] = convert(written[source], written[route], to, low_memory=route.endswith("low memory"))
        print(route, results[route], flush=True)
    record = {
        "size": arguments.size, "checkpoint_bytes": full.stat().st_size, "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"), "commit": os.environ.get("COMMIT", ""), "versions": versions(),
        "routes": results,
    }  # fmt: skip
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
