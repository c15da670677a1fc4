"""The attributes Lightning's DeepSpeedStrategy exposes beside its config, so code written against it
(``strategy.loss_scale``, ``strategy.DEEPSPEED_ENV_VAR``) keeps working. Shared by the Trainer and the Fabric
strategy.

The loss-scaling values live in ``parameters``, from which the config's fp16 section is completed at set-up:
a value set before fit takes effect, as on Lightning's strategy, and is checked as the constructor checks it.
"""

from __future__ import annotations

from typing import Any

from lightning_strategies_deepspeed import config as settings


class _Parameter:
    """One entry of the strategy's ``parameters``, read and set as an attribute of the same name."""

    name: str

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, strategy: Any, owner: type | None = None) -> Any:
        return self if strategy is None else strategy.parameters[self.name]

    def __set__(self, strategy: Any, value: Any) -> None:
        settings.validate_parameters({**strategy.parameters, self.name: value})
        strategy.parameters[self.name] = value


class LightningAttributesMixin:
    DEEPSPEED_ENV_VAR = settings.CONFIG_PATH_VARIABLE

    loss_scale = _Parameter()
    initial_scale_power = _Parameter()
    loss_scale_window = _Parameter()
    hysteresis = _Parameter()
    min_loss_scale = _Parameter()
