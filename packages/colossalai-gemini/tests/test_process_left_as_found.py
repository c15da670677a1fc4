"""The colossalai names leave the process as they found it, as far as the CPU can show: Gemini trains only on
CUDA, so what is checked here is what registering the names, building the strategies (and refusing the CPU) and
importing colossalai touch."""

from __future__ import annotations

import json

from lightning_strategies.testing import run_script

VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
NAMES = ("colossalai", "colossalai_cuda", "colossalai_cpu", "colossalai_auto")

PROBE = """
import json, sys
from lightning_strategies.testing import process_state, raised_by, state_changes
import lightning.pytorch  # activation fills Lightning's registries here, as it should
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import StrategyRegistry

before = process_state()
for name in json.loads(sys.argv[1]):
    StrategyRegistry.get(name)
    assert raised_by(lambda: Trainer(strategy=name, accelerator="cpu", logger=False)) is not None
built = state_changes(before, process_state())

from lightning_strategies_colossalai.backend import load_colossalai, undo_import_changes

before = process_state()
load_colossalai()
imported = state_changes(before, process_state())
undo_import_changes()
print(json.dumps({"built": built, "imported": imported, "after teardown": state_changes(before, process_state())}))
"""


def test_building_the_strategies_changes_nothing_and_colossalais_import_is_undone_at_teardown() -> None:
    found = json.loads(run_script("-c", PROBE, json.dumps(NAMES), unset=[VARIABLE]).stdout.splitlines()[-1])
    assert found["built"] == {}
    # What the import sets is what teardown (undo_import_changes) puts back; the warnings filter it adds is
    # dropped at once.
    assert found["imported"] == {f"os.environ[{VARIABLE!r}]": [None, "1"]}
    assert found["after teardown"] == {}
