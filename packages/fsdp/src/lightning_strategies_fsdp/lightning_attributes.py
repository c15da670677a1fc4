"""The attributes Lightning's FSDPStrategy exposes (FSDP1 objects), read from this package's FSDP2 settings, so code
written against Lightning's strategy (``trainer.strategy.cpu_offload.offload_params``,
``strategy.mixed_precision_config.param_dtype``) keeps working. Shared by the Trainer and the Fabric strategy."""

from __future__ import annotations

from typing import Any

from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, MixedPrecisionPolicy, ShardingStrategy

from lightning_strategies_fsdp.options import ShardingOptions, mixed_precision_for


class LightningAttributesMixin:
    options: ShardingOptions
    mixed_precision: Any  # the argument as given, as Lightning keeps it

    def _precision_flag(self) -> str:
        raise NotImplementedError

    @property
    def sharding_strategy(self) -> ShardingStrategy:
        """FSDP1's enum member for the sharding strategy passed (as an enum or a name), FULL_SHARD by default."""
        return ShardingStrategy[self.options.sharding_strategy]

    @property
    def cpu_offload(self) -> CPUOffload:
        """FSDP1's ``CPUOffload``: ``offload_params`` is whether shards live in host memory. The FSDP2 policy in
        use (with its ``pin_memory``) is ``options.offload_policy``."""
        return CPUOffload(offload_params=isinstance(self.options.offload_policy, CPUOffloadPolicy))

    @property
    def mixed_precision_config(self) -> MixedPrecisionPolicy | None:
        """The FSDP2 policy sharded modules use: the ``mixed_precision`` argument, else the one the precision flag
        implies (None for full precision). It has FSDP1 ``MixedPrecision``'s ``param_dtype`` and ``reduce_dtype``."""
        return self.options.mp_policy or mixed_precision_for(self._precision_flag())
