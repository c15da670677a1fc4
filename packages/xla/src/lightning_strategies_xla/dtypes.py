"""Half precision on XLA by converting modules and inputs, the way torch_xla 2.9 asks for it.

Lightning 2.6's XLA precision plugins set ``XLA_USE_BF16``/``XLA_USE_F16``. torch_xla 2.9 warns
that ``XLA_USE_BF16`` is deprecated ("convert your model to bf16 directly") and no longer reads
``XLA_USE_F16`` at all, so "16-true" silently trained in float32. The mixin here converts the
module, the inputs and the default dtype instead, and is shared by the Trainer and Fabric plugins.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, cast

import torch
from lightning.fabric.plugins.precision.utils import _convert_fp_tensor, _DtypeContextManager
from lightning.fabric.utilities.apply_func import apply_to_collection

from lightning_strategies import check_choice

if TYPE_CHECKING:
    from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT_STR

PRECISION_DTYPES = {"32-true": torch.float32, "bf16-true": torch.bfloat16, "16-true": torch.float16}
# The variables Lightning's own XLA plugins set; see forget_stock_environment().
_STOCK_ENVIRONMENT = ("XLA_USE_BF16", "XLA_USE_F16")


def forget_stock_environment() -> None:
    """Undo what Lightning's stock XLA precision plugin set while the connector built it.

    The connector constructs that plugin before a strategy can swap it for ours; left in place,
    XLA_USE_BF16 would downcast every float tensor behind our back and print torch_xla's warning.
    """
    for variable in _STOCK_ENVIRONMENT:
        os.environ.pop(variable, None)


class DtypeConversionMixin:
    """Puts modules, new tensors and float inputs in the dtype the precision flag names."""

    precision: _PRECISION_INPUT_STR  # as Lightning's precision plugins, which this mixes into, declare it
    _desired_dtype: torch.dtype

    def _choose_precision(self, precision: str) -> None:
        check_choice("XLAPrecision", "precision", precision, tuple(PRECISION_DTYPES))
        self.precision = cast("_PRECISION_INPUT_STR", precision)  # one of ours: check_choice refused the rest
        self._desired_dtype = PRECISION_DTYPES[precision]

    @property
    def _is_half(self) -> bool:
        return self._desired_dtype != torch.float32

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(dtype=self._desired_dtype) if self._is_half else module

    def tensor_init_context(self) -> AbstractContextManager:
        return _DtypeContextManager(self._desired_dtype) if self._is_half else nullcontext()

    def module_init_context(self) -> AbstractContextManager:
        return self.tensor_init_context()

    def forward_context(self) -> AbstractContextManager:
        return self.tensor_init_context()

    def convert_input(self, data: Any) -> Any:
        if not self._is_half:
            return data
        return apply_to_collection(data, function=_convert_fp_tensor, dtype=torch.Tensor, dst_type=self._desired_dtype)

    def convert_output(self, data: Any) -> Any:
        if not self._is_half:
            return data
        default = torch.get_default_dtype()
        return apply_to_collection(data, function=_convert_fp_tensor, dtype=torch.Tensor, dst_type=default)
