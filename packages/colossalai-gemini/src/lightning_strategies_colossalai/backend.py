"""Loading colossalai, which is installed beside this package rather than as its dependency.

colossalai 0.5.0 declares torch<=2.5.1, so pip would downgrade torch if this package depended on
it. Users install it with --no-deps (README.md, "Installing"); this module checks that it is there
and in the tested range, and says how to install it when it is not.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from packaging.specifiers import SpecifierSet

from lightning_strategies import MissingBackendError
from lightning_strategies.backends import require_backend

DISTRIBUTION = "lightning-strategies-colossalai-gemini"
SUPPORTED = SpecifierSet(">=0.5.0,<0.6")
INSTALL_HINT = (
    f'pip install "{DISTRIBUTION}[backend]" && BUILD_EXT=0 pip install --no-deps "colossalai{SUPPORTED}" '
    "(--no-deps keeps your torch: colossalai 0.5 declares torch<=2.5.1 but runs on current torch)"
)


def load_colossalai() -> ModuleType:
    """Import colossalai and its Gemini plugin, or raise MissingBackendError with the install line."""
    # The range is given here: colossalai cannot be a declared requirement (see above).
    colossalai = require_backend(
        "colossalai",
        backend_distribution="colossalai",
        strategy_distribution=DISTRIBUTION,
        install_hint=INSTALL_HINT,
        supported=str(SUPPORTED),
    )
    try:
        importlib.import_module("colossalai.booster.plugin")
    except ImportError as error:
        raise MissingBackendError(
            f"colossalai {colossalai.__version__} is installed but its Gemini plugin cannot be imported: {error}. "
            f'Install the packages it needs with: pip install "{DISTRIBUTION}[backend]"'
        ) from error
    return colossalai
