"""Process group and device mesh set-up shared by the Trainer and the Fabric FSDP2 strategies.

Lightning's Trainer and Fabric strategies derive from different base classes with the same
attribute names (``parallel_devices``, ``local_rank``, ``cluster_environment``...), so this mixin
serves both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.utilities.distributed import _get_default_process_group_backend_for_device, _init_dist_connection
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.fabric.utilities.seed import reset_seed
from lightning_utilities.core.rank_zero import rank_zero_only as utilities_rank_zero_only

from lightning_strategies.ranks import watch_ranks
from lightning_strategies_fsdp.sharding import build_mesh

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


class ProcessGroupMixin:
    """One process per device; the device mesh follows the sharding options."""

    options: Any
    parallel_devices: list[torch.device] | None
    cluster_environment: Any
    local_rank: int
    node_rank: int
    global_rank: int
    world_size: int
    num_nodes: int
    _device_mesh: DeviceMesh | None
    _process_group_backend: str | None
    _timeout: Any

    @property
    def device_mesh(self) -> DeviceMesh:
        if self._device_mesh is None:
            raise RuntimeError("The device mesh exists once the processes are initialized (after setup_environment).")
        return self._device_mesh

    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None
        return self.parallel_devices[self.local_rank]

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # Every process is a data-parallel rank, hybrid sharding included.
        return {"num_replicas": self.num_nodes * self.num_processes, "rank": self.global_rank}

    def set_world_ranks(self) -> None:
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        # Both keep the process's rank as an attribute of the function, which their stubs do not declare.
        rank_zero_only.rank = utilities_rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]

    def connect_processes(self) -> None:
        """Join the process group and build the device mesh (from setup_environment)."""
        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = self._process_group_backend or _get_default_process_group_backend_for_device(
            self.root_device
        )
        assert self.cluster_environment is not None
        device_id = self.root_device if self.root_device.type != "cpu" else None
        _init_dist_connection(
            self.cluster_environment, self._process_group_backend, timeout=self._timeout, device_id=device_id
        )
        watch_ranks(self.global_rank, self.world_size)
        self._device_mesh = build_mesh(self.options, self.root_device, self.world_size, self.num_nodes)
