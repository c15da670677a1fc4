"""The import paths of the seed pages and of Lightning 1.x: ``pytorch_lightning.strategies.ColossalAIStrategy`` and
``lightning.pytorch.strategies.ColossalAIStrategy`` give this package's class, in a fresh interpreter, with no
import of ours; ``lightning_colossalai`` (the retired lightning-colossalai project) fails with the import to use."""

from __future__ import annotations

import json
import os
from pathlib import Path

from lightning_strategies.testing import run_script

RESOLVE = """
import json, sys
import lightning.pytorch.strategies, pytorch_lightning.strategies
found = {"imported before use": [name for name in ("colossalai", "lightning_strategies_colossalai.strategy")
                                 if name in sys.modules]}
from lightning.pytorch.strategies import ColossalAIStrategy as ForLightning
from pytorch_lightning.strategies import ColossalAIStrategy as ForStandalone
found["lightning.pytorch"] = ForLightning.__module__ + ":" + ForLightning.__name__
found["pytorch_lightning"] = ForStandalone.__module__ + ":" + ForStandalone.__name__
found["a pytorch_lightning DDPStrategy"] = issubclass(ForStandalone, pytorch_lightning.strategies.DDPStrategy)
try:
    lightning.pytorch.strategies.NoSuchStrategy
except AttributeError as error:
    found["other names"] = str(error)
print(json.dumps(found))
"""

OLD_IMPORT = """
import json
from lightning_utilities.core.imports import package_available
try:
    from lightning_colossalai import ColossalAIStrategy
    found = {"imported": ColossalAIStrategy.__module__}
except ImportError as error:
    found = {"error": type(error).__name__, "message": str(error)}
found["available"] = package_available("lightning_colossalai")
print(json.dumps(found))
"""


def test_lightnings_paths_give_this_packages_classes_imported_on_first_use() -> None:
    found = json.loads(run_script("-c", RESOLVE).stdout.splitlines()[-1])
    assert found == {
        "imported before use": [],
        "lightning.pytorch": "lightning_strategies_colossalai.strategy:ColossalAIStrategy",
        "pytorch_lightning": (
            "lightning_strategies._mirror.pytorch_lightning.lightning_strategies_colossalai.strategy:ColossalAIStrategy"
        ),
        "a pytorch_lightning DDPStrategy": True,
        "other names": "module 'lightning.pytorch.strategies' has no attribute 'NoSuchStrategy'",
    }


def test_the_retired_module_fails_with_the_import_to_use() -> None:
    found = json.loads(run_script("-c", OLD_IMPORT).stdout.splitlines()[-1])
    assert found["error"] == "ModuleNotFoundError"
    assert found["message"].startswith("No module named 'lightning_colossalai': that is the lightning-colossalai")
    assert "from lightning.pytorch.strategies import ColossalAIStrategy" in found["message"]
    assert "from lightning_strategies_colossalai import ColossalAIStrategy" in found["message"]
    assert "pip install" not in found["message"]  # this package is installed
    assert found["available"] is False  # probes see it missing, as it is


def test_the_retired_project_still_answers_where_it_is_installed(tmp_path: Path) -> None:
    (tmp_path / "lightning_colossalai.py").write_text("class ColossalAIStrategy: ...\n")
    pythonpath = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    found = json.loads(run_script("-c", OLD_IMPORT, env={"PYTHONPATH": pythonpath}).stdout.splitlines()[-1])
    assert found == {"imported": "lightning_colossalai", "available": True}
