"""Loading colossalai, which is installed beside this package rather than as its dependency.

colossalai 0.5.0 declares torch<=2.5.1, so pip would downgrade torch if this package depended on
it. Users install it with --no-deps (README.md, "Installing"); this module checks that it is there
and in the tested range, and says how to install it when it is not.

Importing colossalai changes the process for good: it sets ``CUDA_DEVICE_MAX_CONNECTIONS=1`` in ``os.environ``
(for its tensor-parallel overlap, which Gemini does not use), which the strategy's teardown puts back, and it
silences torch's learning-rate scheduler warnings, which is undone at once (Lightning shows them for every other
strategy too).
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

from packaging.specifiers import SpecifierSet

from lightning_strategies import MissingBackendError
from lightning_strategies.backends import require_backend
from lightning_strategies.environment_changes import EnvironmentChanges

DISTRIBUTION = "lightning-strategies-colossalai-gemini"
SUPPORTED = SpecifierSet(">=0.5.0,<0.6")
INSTALL_HINT = (
    f'pip install "{DISTRIBUTION}[backend]" && BUILD_EXT=0 pip install --no-deps "colossalai{SUPPORTED}" '
    "(--no-deps keeps your torch: colossalai 0.5 declares torch<=2.5.1 but runs on current torch)"
)

# What importing colossalai changed in os.environ, put back by undo_import_changes.
_import_changes = EnvironmentChanges()


def load_colossalai() -> ModuleType:
    """Import colossalai and its Gemini plugin, or raise MissingBackendError with the install line."""
    # The range is given here: colossalai cannot be a declared requirement (see above).
    with _import_changes.recording(), warnings.catch_warnings():
        colossalai = require_backend(
            "colossalai",
            backend_distribution="colossalai",
            strategy_distribution=DISTRIBUTION,
            install_hint=INSTALL_HINT,
            supported=str(SUPPORTED),
        )
    try:
        with _import_changes.recording(), warnings.catch_warnings():
            importlib.import_module("colossalai.booster.plugin")
    except ImportError as error:
        raise MissingBackendError(
            f"colossalai {colossalai.__version__} is installed but its Gemini plugin cannot be imported: {error}. "
            f'Install the packages it needs with: pip install "{DISTRIBUTION}[backend]"'
        ) from error
    return colossalai


def undo_import_changes() -> None:
    """Put back what importing colossalai set in ``os.environ``: called at the strategy's teardown."""
    _import_changes.restore()
