"""The {{name}} strategy: Lightning's distributed data parallel with this package's logic on top.

It trains as generated, since everything it does not override comes from Lightning's
DDPStrategy. Your work goes where the comments say "Your logic".
"""

from __future__ import annotations

from typing import Any

# Import Lightning as lightning.pytorch, written out: lightning-strategies rewrites these
# imports to build the pytorch_lightning flavour of this class for pytorch_lightning users.
from lightning.pytorch.strategies import DDPStrategy
from lightning_strategies import check_type
from lightning_strategies.checkpoints import remove, staged_save
from lightning_strategies.ranks import ReportFailuresMixin, watch_ranks
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from typing_extensions import override


class {{class_name}}(ReportFailuresMixin, DDPStrategy):
    """Distributed data parallel training, registered as ``"{{name}}"``.

    Args:
        fp16_gradient_communication: send gradients between processes as float16, which
            halves the traffic of each all-reduce at the cost of gradient precision. An
            example of a parameter of your own: replace it with yours.
        **kwargs: every parameter of Lightning's ``DDPStrategy`` (``process_group_backend``,
            ``timeout``, ``find_unused_parameters``, ``ddp_comm_hook``, ...), passed on as given.
    """

    def __init__(self, fp16_gradient_communication: bool = False, **kwargs: Any) -> None:
        # Your logic: check your parameters here, so a wrong value fails when the Trainer is
        # built, with a message that says what to pass instead.
        check_type("{{name}}", "fp16_gradient_communication", fp16_gradient_communication, bool)
        if fp16_gradient_communication and kwargs.get("ddp_comm_hook") is not None:
            raise ValueError(
                "{{name}}: pass either fp16_gradient_communication=True or your own ddp_comm_hook, "
                "not both (DDP takes one communication hook, and fp16_gradient_communication is one)."
            )
        super().__init__(**kwargs)
        self.fp16_gradient_communication = fp16_gradient_communication

    @override
    def setup_distributed(self) -> None:
        super().setup_distributed()
        # When one rank fails, the others end at once and name it, instead of waiting in a
        # collective until the process group times out (ReportFailuresMixin tells them).
        watch_ranks(self.global_rank, self.world_size)

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        # Written aside and published whole by rank 0: a kill mid-save keeps the previous checkpoint.
        with staged_save(filepath, self.is_global_zero, self.barrier) as staged:
            if self.is_global_zero:
                self.checkpoint_io.save_checkpoint(checkpoint, staged, storage_options=storage_options)

    @override
    def remove_checkpoint(self, filepath: Any) -> None:
        if self.is_global_zero:
            remove(filepath)

    @override
    def configure_ddp(self) -> None:
        # Your logic: Lightning calls this in every process when fitting starts, once the
        # process group exists. Before super().configure_ddp(), self.model is the plain
        # LightningModule: change or replace layers there. After it, self.model is the
        # DistributedDataParallel wrapper: register communication hooks there.
        #
        # Other methods worth overriding: reduce / all_gather / broadcast / barrier (how
        # processes exchange values), optimizer_step, lightning_module_state_dict and
        # load_model_state_dict (what checkpoints hold), teardown (release what you took).
        # Run `lightning-strategies check {{name}} --accelerator cpu --devices 2` after each change.
        super().configure_ddp()
        if self.fp16_gradient_communication:
            # Registered here rather than passed on as ddp_comm_hook, which Lightning's
            # DDPStrategy applies on CUDA only: float16 all-reduce works over gloo on CPU too.
            self.model.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
