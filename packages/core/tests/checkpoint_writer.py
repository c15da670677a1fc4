"""Saves checkpoint after checkpoint under one name until killed (see test_checkpoints.py).

Version ``n`` is a folder of FILES files (or one file), each a tensor filled with ``n``: a
complete checkpoint has every file and one version throughout.
"""

import sys
from pathlib import Path

import torch

from lightning_strategies.checkpoints import staged_save

FILES = 4
target, kind = Path(sys.argv[1]), sys.argv[2]
version = 0
while True:
    version += 1
    payload = torch.full((256, 1024), float(version))  # 1 MiB a file: saves take long enough to be hit
    with staged_save(target) as staged:
        if kind == "folder":
            staged.mkdir()
            for index in range(FILES):
                torch.save({"weights": payload}, staged / f"shard_{index}.pt")
        else:
            torch.save({"weights": payload}, staged)
    print(version, flush=True)
