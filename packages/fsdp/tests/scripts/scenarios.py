"""Real FSDP2 training on CPU processes, grouped so one launch of 2 processes covers many cases.

Lightning launches the other processes by re-running this command line, so every group is a
script run. Each scenario writes a JSON result (rank 0) into OUT_DIR; the tests assert on it.
FSDP_SCENARIO_DEVICES sets how many processes (2 by default; the GPU tier runs up to 4 GPUs).

    python scenarios.py GROUP OUT_DIR [--devices N] [--checkpoint PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import pickle
import shutil
import unittest.mock
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader, TensorDataset

from lightning_strategies.conformance.launching import end_process_group
from lightning_strategies.testing import QUIET_TRAINER

WIDTH = 16
# The GPU tier runs the same groups on CUDA devices.
ACCELERATOR = os.environ.get("FSDP_SCENARIO_ACCELERATOR", "cpu")
# Processes (devices) per launch: the CPU tier's 2, or the GPU machine's several GPUs (up to 4).
DEVICES = int(os.environ.get("FSDP_SCENARIO_DEVICES", "2"))
NAMES = ("fsdp", "fsdp_cpu_offload", "fsdp_shard_grad_op", "fsdp_hybrid_shard", "fsdp_no_shard")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class TinyTransformer(pl.LightningModule):
    def __init__(
        self, meta_init: bool = False, compile_backend: str | None = None, lr: float = 0.01, optimizer: str = "adamw"
    ) -> None:
        super().__init__()
        self.save_hyperparameters()  # as in the reproduction of Lightning-AI/pytorch-lightning#20373
        self.blocks: nn.ModuleList | None = None
        self.seen_compute_dtypes: set[str] = set()
        if not meta_init:
            self.build()

    def build(self) -> None:
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(WIDTH, 1)

    def configure_model(self) -> None:
        if self.blocks is None:
            with torch.device("meta"):  # the strategy materializes it shard by shard
                self.build()
        if self.hparams.compile_backend:
            for block in self.blocks:
                block.compile(backend=self.hparams.compile_backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        self.seen_compute_dtypes.add(str(self.head.weight.dtype))  # the all-gathered (compute) weight
        return self.head(x)[:, 0].clone()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x).float(), y.float())
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x).float(), y.float()), sync_dist=True)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.hparams.optimizer == "sgd":  # keeps no per-parameter state, as Lightning's BoringModel's
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class HeldNetwork(pl.LightningModule):
    """Its layers held in attributes and called by the steps, as a LightningModule holding a Hugging Face model
    calls it: the LightningModule (FSDP's root) runs no forward of its own, so after an evaluation step the
    root's parameters (the head's) stay unsharded, no backward following to reshard them."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(WIDTH, 1)

    def loss(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.head(self.blocks(x))[:, 0], y)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("loss", self.loss(batch), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.head(self.blocks(batch[0]))[:, 0]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Note:
    """An object of the user's own in a checkpoint: loading with weights_only=True refuses it."""


class NotedModule(TinyTransformer):
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["note"] = Note()


class WeightsAtStart(Callback):
    """Full weights and optimizer step count when training (re)starts: what a resume loaded."""

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.weights = full_weights(module)
        optimizer = trainer.optimizers[0]
        self.optimizer_steps = sorted({float(state["step"]) for state in optimizer.state.values()} or {0.0})


def full_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """A snapshot: for replicated placements on CPU the state dict aliases the live parameters."""
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {key: value.detach().clone() for key, value in state.items()}


def data(samples: int = 32) -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, WIDTH, generator=generator)
    return TensorDataset(x, x.sum(dim=1).tanh())


def loader(samples: int = 32) -> DataLoader:
    return DataLoader(data(samples), batch_size=4, shuffle=False)


def one_batch_loader() -> DataLoader:
    """One step per epoch on 2 or 4 processes, so every step sees the same data however Lightning's loops
    count batches on resume (a plain DataLoader restarts its epoch; resuming at an epoch boundary
    Lightning ran one extra batch of the finished epoch, seen while writing these tests)."""
    return loader(samples=8)


def zero_inside_a_record(folder: Path, shard: str, count: int = 5000) -> None:
    """Zeros over the middle of the largest record in a DCP shard file, its length and every record's header kept:
    what only a checksum sees (the issue's 5,000 zero bytes)."""
    metadata = pickle.loads((folder / ".metadata").read_bytes())
    records = [item for item in metadata.storage_data.values() if item.relative_path == shard]
    largest = max(records, key=lambda item: item.length)
    count = min(count, largest.length // 2)
    start = largest.offset + (largest.length - count) // 2
    data = bytearray((folder / shard).read_bytes())
    data[start : start + count] = bytes(count)
    (folder / shard).write_bytes(bytes(data))


def trainer(strategy: Any, steps: int, devices: int = DEVICES, **kwargs: Any) -> pl.Trainer:
    options = dict(accelerator=ACCELERATOR, devices=devices, strategy=strategy, max_steps=steps, **QUIET_TRAINER)
    options.update(gradient_clip_val=1.0, limit_val_batches=2, enable_checkpointing=False, deterministic=True)
    options.update(kwargs)
    return pl.Trainer(**options)


def strategy(name: str, **kwargs: Any) -> Any:
    from lightning_strategies import get_registry

    return get_registry().resolve(name, **kwargs)


def summary(trainer_: pl.Trainer, module: TinyTransformer) -> dict[str, Any]:
    from torch.distributed.fsdp import FSDPModule

    metrics = trainer_.callback_metrics
    return {
        "strategy_class": f"{type(trainer_.strategy).__module__}.{type(trainer_.strategy).__name__}",
        "global_step": trainer_.global_step,
        "train_loss": float(metrics["train_loss"]) if "train_loss" in metrics else None,
        "val_loss": float(metrics["val_loss"]) if "val_loss" in metrics else None,
        "param_types": sorted({type(param).__name__ for param in module.parameters()}),
        "param_dtypes": sorted({str(param.dtype) for param in module.parameters()}),
        "param_devices": sorted({param.device.type for param in module.parameters()}),
        "compute_dtypes": sorted(module.seen_compute_dtypes),
        "mesh_shape": list(trainer_.strategy.device_mesh.shape),
        "sharded_modules": sum(isinstance(sub, FSDPModule) for sub in module.modules()),
        "placements": sorted({str(param.placements) for param in module.parameters()}),
    }


class Results:
    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, result: dict[str, Any]) -> None:
        if torch.distributed.get_rank() == 0:
            (self.out / f"{name}.json").write_text(json.dumps(result, indent=1))

    def weights(self, name: str, weights: dict[str, torch.Tensor]) -> None:
        if torch.distributed.get_rank() == 0:
            torch.save(weights, self.out / f"{name}.pt")


def equal_weights(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    return first.keys() == second.keys() and all(torch.equal(first[key], second[key]) for key in first)


# Groups ------------------------------------------------------------------------------------------


def group_names(results: Results, args: argparse.Namespace) -> None:
    """Every registered name: fit, sharded checkpoint, resume in a new Trainer, full export."""
    variants = [(name, name, {}) for name in NAMES]
    # One node: the default mesh is 1 replica x DEVICES shards. Also 2 replicas of DEVICES // 2 shards:
    # 2x1 on 2 processes, a real 2x2 replicate x shard mesh on 4.
    replicas = 2 if DEVICES % 2 == 0 else DEVICES
    mesh = (replicas, DEVICES // replicas)
    variants.append((f"fsdp_hybrid_shard_{mesh[0]}x{mesh[1]}", "fsdp_hybrid_shard", {"device_mesh": mesh}))
    for label, name, kwargs in variants:
        pl.seed_everything(7)
        module = TinyTransformer()
        first = trainer(strategy(name, **kwargs) if kwargs else name, steps=2)
        first.fit(module, loader(), loader())
        path = results.out / f"{label}.ckpt"
        first.save_checkpoint(path)
        saved = full_weights(module)
        result = summary(first, module)

        resumed_module = TinyTransformer()
        at_start = WeightsAtStart()
        second = trainer(strategy(name, **kwargs) if kwargs else name, steps=4, callbacks=[at_start])
        second.fit(resumed_module, loader(), loader(), ckpt_path=path)
        result.update(
            checkpoint_is_folder=path.is_dir(),
            resumed_weights_equal_saved=equal_weights(at_start.weights, saved),
            resumed_optimizer_steps=at_start.optimizer_steps,
            resumed_global_step=second.global_step,
            resumed_train_loss=float(second.callback_metrics["train_loss"]),
        )
        results.write(label, result)


def group_precision(results: Results, args: argparse.Namespace) -> None:
    for precision in ("32-true", "bf16-mixed", "16-mixed", "bf16-true"):
        pl.seed_everything(7)
        module = TinyTransformer()
        run = trainer("fsdp", steps=2, precision=precision)
        run.fit(module, loader(), loader())
        results.write(f"precision_{precision}", summary(run, module))
    # An explicit MixedPrecisionPolicy wins over the precision flag.
    from torch.distributed.fsdp import MixedPrecisionPolicy

    pl.seed_everything(7)
    module = TinyTransformer()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    run = trainer(strategy("fsdp", mixed_precision=policy), steps=2)
    run.fit(module, loader(), loader())
    results.write("precision_policy", summary(run, module))


def _is_checkpointed(module: nn.Module) -> bool:
    from torch.distributed._composable.contract import _get_registry

    return "checkpoint" in (_get_registry(module) or {})


def _param_init(module: nn.Module) -> None:
    for parameter in module.parameters(recurse=False):
        nn.init.constant_(parameter, 0.01)


def group_features(results: Results, args: argparse.Namespace) -> None:
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

    cases: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
        # label: (strategy kwargs, module kwargs, trainer kwargs)
        "meta_init": ({}, {"meta_init": True}, {}),
        "param_init_fn": ({"param_init_fn": _param_init}, {"meta_init": True}, {}),
        "activation_checkpointing": ({"activation_checkpointing_policy": {Block}}, {}, {}),
        # aot_eager: inductor on CPU would compile C++ on every test run; the GPU tier uses inductor.
        "compile": ({}, {"compile_backend": "aot_eager"}, {}),
        "forward_prefetch": ({"forward_prefetch": True, "backward_prefetch": "BACKWARD_PRE"}, {}, {}),
        "wrap_set": ({"auto_wrap_policy": {Block}}, {}, {}),
        "wrap_module_policy": ({"auto_wrap_policy": ModuleWrapPolicy({nn.Linear})}, {}, {}),
        "wrap_size_based": (
            {"auto_wrap_policy": functools.partial(size_based_auto_wrap_policy, min_num_params=500)},
            {},
            {},
        ),
        "wrap_callable": ({"auto_wrap_policy": lambda module, recurse, nonwrapped_numel: False}, {}, {}),
        "accumulate": ({}, {}, {"accumulate_grad_batches": 2}),
        "obsolete_fsdp1_knobs": ({"limit_all_gathers": False, "use_orig_params": False}, {}, {}),
    }
    for label, (strategy_kwargs, module_kwargs, trainer_kwargs) in cases.items():
        pl.seed_everything(7)
        module = TinyTransformer(**module_kwargs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = trainer(strategy("fsdp", **strategy_kwargs), steps=2, **trainer_kwargs)
        run.fit(module, loader(), loader())
        result = summary(run, module)
        weights = full_weights(module)
        result["all_finite"] = all(bool(torch.isfinite(value).all()) for value in weights.values())
        result["checkpointed_blocks"] = sum(_is_checkpointed(block) for block in module.blocks)
        result["compiled_blocks"] = sum(
            getattr(block, "_compiled_call_impl", None) is not None for block in module.blocks
        )
        result["warnings"] = [str(warning.message) for warning in caught if "has no effect" in str(warning.message)]
        if label == "param_init_fn":
            # param_init_fn ran on the materialized (sharded) parameters; AdamW moved them from 0.01.
            start = TinyTransformer()
            result["differs_from_default_init"] = not equal_weights(weights, full_weights(start))
        results.write(label, result)

    # sync_module_states: processes start from different weights; rank 0's must win.
    rank = int(torch.distributed.get_rank()) if torch.distributed.is_initialized() else 0
    torch.manual_seed(100 + rank)
    module = TinyTransformer()
    rank_zero_start = [module.state_dict() if rank == 0 else None]
    torch.distributed.broadcast_object_list(rank_zero_start, src=0)
    at_start = WeightsAtStart()
    run = trainer(strategy("fsdp", sync_module_states=True), steps=1, callbacks=[at_start])
    run.fit(module, loader(), loader())
    expected = {key: value for key, value in rank_zero_start[0].items()}
    results.write("sync_module_states", {"start_equals_rank0": equal_weights(at_start.weights, expected)})


def group_reference(results: Results, args: argparse.Namespace) -> None:
    """2N uninterrupted steps, and N steps with a ModelCheckpoint checkpoint and a full export."""
    pl.seed_everything(7)
    module = TinyTransformer()
    trainer("fsdp", steps=8, limit_val_batches=0).fit(module, one_batch_loader(), one_batch_loader())
    results.weights("uninterrupted_8", full_weights(module))

    pl.seed_everything(7)
    module = TinyTransformer()
    checkpoints = ModelCheckpoint(dirpath=results.out / "every_4", every_n_train_steps=4, save_top_k=-1)
    run = trainer("fsdp", steps=4, callbacks=[checkpoints], enable_checkpointing=True, limit_val_batches=0)
    run.fit(module, one_batch_loader(), one_batch_loader())
    run.save_checkpoint(results.out / "sharded_4")
    results.weights("weights_4", full_weights(module))

    # The same 4 steps with state_dict_type="full": one file any program can read.
    pl.seed_everything(7)
    module = TinyTransformer()
    run = trainer(strategy("fsdp", state_dict_type="full"), steps=4, limit_val_batches=0)
    run.fit(module, one_batch_loader(), one_batch_loader())
    run.save_checkpoint(results.out / "full_4.ckpt")
    results.weights("full_weights_4", full_weights(module))
    results.write("reference", {"model_checkpoint": checkpoints.last_model_path or checkpoints.best_model_path})


def group_resume(results: Results, args: argparse.Namespace) -> None:
    """A new process resumes the N-step checkpoint and trains to 2N."""
    pl.seed_everything(7)
    module = TinyTransformer()
    at_start = WeightsAtStart()
    run = trainer("fsdp", steps=8, callbacks=[at_start], devices=args.devices, limit_val_batches=0)
    run.fit(module, one_batch_loader(), one_batch_loader(), ckpt_path=args.checkpoint)
    results.weights(f"resumed_8_{args.tag}", full_weights(module))
    results.weights(f"resumed_start_{args.tag}", at_start.weights)
    results.write(
        f"resume_{args.tag}",
        {
            "global_step": run.global_step,
            "optimizer_steps_at_start": at_start.optimizer_steps,
            "world_size": run.world_size,
        },
    )


class InjectedFailure(OSError):
    """Stands for a full disk or a lost mount half way through a save."""


@contextlib.contextmanager
def dcp_index_write_fails() -> Any:
    """DCP writes every shard, then fails on rank 0 writing its index (.metadata); it tells every rank."""
    from torch.distributed.checkpoint import FileSystemWriter

    def finish(self: Any, *args: Any, **kwargs: Any) -> None:
        raise InjectedFailure("injected: no space left on device")

    with unittest.mock.patch.object(FileSystemWriter, "finish", finish):
        yield


@contextlib.contextmanager
def full_file_write_fails() -> Any:
    """Rank 0 writes half of the full checkpoint file, then every rank fails."""
    from lightning_strategies_fsdp import checkpoint as checkpoints

    real_save_full = checkpoints.save_full

    def save_full(path: Path, checkpoint: dict[str, Any], rank: int, write: Any = None) -> None:
        real_save_full(path, checkpoint, rank, write)
        if rank == 0:
            written = path.read_bytes()
            path.write_bytes(written[: len(written) // 2])
        raise InjectedFailure("injected: no space left on device")

    with unittest.mock.patch.object(checkpoints, "save_full", save_full):
        yield


def group_reliability(results: Results, args: argparse.Namespace) -> None:
    """A save failing half way keeps the previous checkpoint as "last"; bad checkpoints are refused on
    every rank. Run with the failed-rank watchdog off: the refusals are caught here and the run goes on."""
    from lightning_strategies.errors import CheckpointError
    from lightning_strategies.testing import written_by_another_package

    failures = {"sharded": dcp_index_write_fails, "full": full_file_write_fails}
    for kind, failing_save in failures.items():
        folder = results.out / kind
        pl.seed_everything(7)
        module = TinyTransformer()
        first = trainer(strategy("fsdp", state_dict_type=kind), steps=2, limit_val_batches=0)
        first.fit(module, one_batch_loader(), one_batch_loader())
        first.save_checkpoint(folder / "last.ckpt")
        saved = full_weights(module)

        second = trainer(strategy("fsdp", state_dict_type=kind), steps=4, limit_val_batches=0)
        second.fit(TinyTransformer(), one_batch_loader(), one_batch_loader(), ckpt_path=folder / "last.ckpt")
        try:
            with failing_save():
                second.save_checkpoint(folder / "last.ckpt")
            save_error = None
        except BaseException as error:  # DCP's CheckpointException is a BaseException
            save_error = type(error).__name__

        at_start = WeightsAtStart()
        finder = ModelCheckpoint(dirpath=folder, save_top_k=0)  # finds "last" as Lightning does
        third = trainer(strategy("fsdp", state_dict_type=kind), steps=4, limit_val_batches=0,
                        callbacks=[finder, at_start], enable_checkpointing=True)  # fmt: skip
        third.fit(TinyTransformer(), one_batch_loader(), one_batch_loader(), ckpt_path="last")
        staging = folder / ".lightning-strategies-staging"
        results.write(
            f"failed_save_{kind}",
            {
                "save_error": save_error,
                "visible": sorted(path.name for path in folder.iterdir() if not path.name.startswith(".")),
                "staged_left": sorted(path.name for path in staging.iterdir()) if staging.is_dir() else [],
                "resumed_from": Path(third.ckpt_path).name,
                "resumed_weights_equal_saved": equal_weights(at_start.weights, saved),
                "resumed_optimizer_steps": at_start.optimizer_steps,
            },
        )

    # Bad checkpoints through trainer.fit on 2 processes: every rank raises the same error, none hangs.
    damaged = results.out / "damaged.ckpt"
    zeroed = results.out / "zeroed.ckpt"  # the 5,000 zero bytes inside a shard: only a checksum sees them
    deepspeed = results.out / "deepspeed"
    if torch.distributed.get_rank() == 0:
        shutil.copytree(results.out / "sharded" / "last.ckpt", damaged)
        shard = damaged / "__1_0.distcp"
        shard.write_bytes(shard.read_bytes()[:100])
        shutil.copytree(results.out / "sharded" / "last.ckpt", zeroed)
        zero_inside_a_record(zeroed, "__1_0.distcp")
        (deepspeed / "checkpoint").mkdir(parents=True)
        (deepspeed / "latest").write_text("checkpoint")
        torch.save({"module": {}}, deepspeed / "checkpoint" / "mp_rank_00_model_states.pt")
    torch.distributed.barrier()
    refusals = {}
    for label, path in {"truncated_shard": damaged, "zeroed_shard": zeroed, "foreign_folder": deepspeed}.items():
        run = trainer("fsdp", steps=4, limit_val_batches=0)
        # Only this package is installed here: the package whose folder this is, is stood in for.
        foreign = written_by_another_package(deepspeed) if label == "foreign_folder" else contextlib.nullcontext()
        try:
            with foreign:
                run.fit(TinyTransformer(), one_batch_loader(), one_batch_loader(), ckpt_path=path)
            refusals[label] = None
        except CheckpointError as error:
            refusals[label] = str(error)
        every_rank = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(every_rank, refusals[label] is not None)
        refusals[f"{label}_on_every_rank"] = all(every_rank)
    results.write("refusals", refusals)


def fabric_steps(fabric: Any, model: nn.Module, optimizer: Any, x: torch.Tensor, steps: int = 3) -> list[float]:
    """Train ``steps`` steps on the loss ``model(x).pow(2).mean()``; returns each step's loss."""
    losses = []
    for _ in range(steps):
        loss = model(x).pow(2).mean()
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    return losses


def group_fabric(results: Results, args: argparse.Namespace) -> None:
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator=ACCELERATOR, devices=DEVICES, strategy="fsdp")
    fabric.launch()
    fabric.seed_everything(7)
    model = fabric.setup(Block())
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=0.01))
    x = torch.randn(8, WIDTH, device=fabric.device)
    losses = fabric_steps(fabric, model, optimizer, x)
    path = results.out / "fabric.ckpt"
    fabric.save(path, {"model": model, "optimizer": optimizer, "step": 3})
    saved = full_weights(model)
    # One more step, then a save that fails half way: the checkpoint of step 3 must stay.
    fabric.backward(model(x).pow(2).mean())
    optimizer.step()
    try:
        with dcp_index_write_fails():
            fabric.save(path, {"model": model, "optimizer": optimizer, "step": 4})
        save_error = None
    except BaseException as error:  # DCP's CheckpointException is a BaseException
        save_error = type(error).__name__

    fabric.seed_everything(99)
    restored = fabric.setup(Block())
    restored_optimizer = fabric.setup_optimizers(torch.optim.AdamW(restored.parameters(), lr=0.01))
    state = {"model": restored, "optimizer": restored_optimizer, "step": 0}
    fabric.load(path, state)
    # Lightning's way: model and optimizer set up together; the optimizer must update the shards.
    fabric.seed_everything(7)
    joint_model = Block()
    joint_optimizer = torch.optim.SGD(joint_model.parameters(), lr=0.1)
    joint_model, joint_optimizer = fabric.setup(joint_model, joint_optimizer)
    joint_start = full_weights(joint_model)
    joint_losses = fabric_steps(fabric, joint_model, joint_optimizer, x)
    joint_optimizer_params = {id(param) for group in joint_optimizer.param_groups for param in group["params"]}
    results.write(
        "fabric_joint_setup",
        {
            "losses": joint_losses,
            "weights_changed": not equal_weights(full_weights(joint_model), joint_start),
            "optimizer_holds_the_sharded_parameters": joint_optimizer_params
            == {id(param) for param in joint_model.parameters()},
        },
    )
    # A user's CheckpointIO writes and reads full checkpoints (Fabric's connector sets it on the strategy so).
    io = CountingCheckpointIO()
    fabric.strategy.checkpoint_io = io
    fabric.strategy.state_dict_type = "full"
    joint_saved = full_weights(joint_model)
    fabric.save(results.out / "fabric_io.ckpt", {"model": joint_model, "optimizer": joint_optimizer})
    fabric.backward(joint_model(x).pow(2).mean())
    joint_optimizer.step()
    fabric.load(results.out / "fabric_io.ckpt", {"model": joint_model, "optimizer": joint_optimizer})
    results.write(
        "fabric_checkpoint_io",
        {"calls": io.calls, "loaded_weights_equal": equal_weights(full_weights(joint_model), joint_saved)},
    )
    fabric.strategy.state_dict_type = "sharded"

    strategy_ = fabric.strategy
    results.write(
        "fabric_attributes",
        {
            "sharding_strategy": repr(strategy_.sharding_strategy),
            "cpu_offload": repr(strategy_.cpu_offload),
            "mixed_precision_config": repr(strategy_.mixed_precision_config),
        },
    )

    results.write(
        "fabric",
        {
            "strategy_class": type(fabric.strategy).__name__,
            "losses": losses,
            "loaded_weights_equal": equal_weights(full_weights(restored), saved),
            "loaded_step": state["step"],
            "optimizer_state_loaded": len(restored_optimizer.state) > 0,
            "checkpoint_is_folder": path.is_dir(),
            "failed_save_error": save_error,
            "world_size": fabric.world_size,
        },
    )


class CountingCheckpointIO(TorchCheckpointIO):
    """A user's CheckpointIO: counts its calls and marks what it writes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        self.calls.append("save")
        super().save_checkpoint({**checkpoint, "written_by": "CountingCheckpointIO"}, path, storage_options)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> Any:
        self.calls.append("load")
        checkpoint = super().load_checkpoint(path, weights_only=weights_only)
        checkpoint.pop("written_by")  # only a file this plugin wrote has it
        return checkpoint


def _resume_from(path: Path, kind: str = "sharded", steps: int = 4, **trainer_kwargs: Any) -> dict[str, Any]:
    at_start = WeightsAtStart()
    run = trainer(strategy("fsdp", state_dict_type=kind), steps=steps, limit_val_batches=0, callbacks=[at_start],
                  **trainer_kwargs)  # fmt: skip
    run.fit(TinyTransformer(optimizer="sgd"), one_batch_loader(), one_batch_loader(), ckpt_path=path)
    return {"global_step": run.global_step, "weights": at_start.weights, "lr": run.optimizers[0].param_groups[0]["lr"]}


def _refusal(action: Any) -> str | None:
    """The error every rank raised (None if none did), after checking that all ranks agree."""
    try:
        action()
        error = None
    except Exception as caught:
        error = f"{type(caught).__name__}: {caught}"
    every_rank = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(every_rank, error is not None)
    return error if all(every_rank) == any(every_rank) else f"only some ranks raised: {every_rank}"


def repeated_loads(out: Path) -> dict[str, Any]:
    """validate, test and predict one after another on one Trainer and model, each with ckpt_path= (issue 29, item 6).
    The calls alternate two checkpoints (a, b) of each kind, so each must load its own weights: what it gives is
    compared with what the model that saved the checkpoint gives."""
    from lightning_strategies_fsdp.checkpoint import sharded_to_full

    expected = {}
    for label, seed in (("a", 1), ("b", 2)):
        pl.seed_everything(seed)
        module = HeldNetwork()
        run = trainer("fsdp", steps=2)
        run.fit(module, one_batch_loader())
        run.save_checkpoint(out / f"repeated_{label}")
        expected[label] = _evaluated(run, module)
        if torch.distributed.get_rank() == 0:
            sharded_to_full(out / f"repeated_{label}", out / f"repeated_{label}.ckpt")
        torch.distributed.barrier()
    pl.seed_everything(3)
    module, loading = HeldNetwork(), trainer("fsdp", steps=2)
    calls = [("validate", "a"), ("test", "b"), ("predict", "a"), ("validate", "b"), ("test", "a"), ("predict", "b")]
    results = {}
    for kind, suffix in (("full", ".ckpt"), ("sharded", "")):
        for call, label in calls:
            try:
                got = _evaluated(loading, module, call, ckpt_path=out / f"repeated_{label}{suffix}")[call]
                results[f"{kind}_{call}_{label}"] = got == expected[label][call]
            except Exception as error:
                results[f"{kind}_{call}_{label}"] = f"{type(error).__name__}: {error}"
    return results


def trusted_objects(out: Path) -> dict[str, str | None]:
    """A checkpoint holding an object of the user's own (issue 29, item 5): the Trainer's weights_only=False never
    reaches this strategy (Lightning drops it for strategies that load after setup), and what the refusal advises
    instead must work. Each entry: the error every rank raised, or None."""

    def resume(path: Path, kind: str, **fit: Any) -> None:
        run = trainer(strategy("fsdp", state_dict_type=kind), steps=4, limit_val_batches=0)
        run.fit(TinyTransformer(optimizer="sgd"), one_batch_loader(), one_batch_loader(), ckpt_path=path, **fit)

    def validate(path: Path, kind: str, **load: Any) -> None:
        trainer(strategy("fsdp", state_dict_type=kind), steps=4).validate(
            TinyTransformer(), one_batch_loader(), ckpt_path=path, **load
        )

    found = {}
    for kind in ("full", "sharded"):
        path = out / f"noted_{kind}"
        pl.seed_everything(7)
        run = trainer(strategy("fsdp", state_dict_type=kind), steps=2, limit_val_batches=0)
        run.fit(NotedModule(optimizer="sgd"), one_batch_loader(), one_batch_loader())
        run.save_checkpoint(path)
        for name, action in (("fit", resume), ("validate", validate)):
            found[f"{name}_{kind}_weights_only_false"] = _refusal(lambda: action(path, kind, weights_only=False))  # noqa: B023
            with torch.serialization.safe_globals([Note]):
                found[f"{name}_{kind}_safe_globals"] = _refusal(lambda: action(path, kind))  # noqa: B023
    return found


def _evaluated(run: pl.Trainer, module: pl.LightningModule, *calls: str, **load: Any) -> dict[str, Any]:
    """The loss validate and test report and the predictions, each as a list of floats (rank 0's)."""
    given = {}
    for call in calls or ("validate", "test", "predict"):
        if call == "predict":
            given[call] = torch.cat(run.predict(module, one_batch_loader(), **load)).tolist()
        else:
            given[call] = getattr(run, call)(module, one_batch_loader(), **load)[0]["loss"]
    return given


def group_dropin(results: Results, args: argparse.Namespace) -> None:
    """What Lightning's FSDPStrategy resumes, ours resumes; what it refuses, ours refuses (issue 16).
    Plain SGD keeps no per-parameter optimizer state. Run with the failed-rank watchdog off: refusals are caught."""
    from lightning_strategies_fsdp.checkpoint import sharded_to_full

    def first_run(kind_or_strategy: Any, path: Path, **save: Any) -> dict[str, torch.Tensor]:
        pl.seed_everything(7)
        module = TinyTransformer(optimizer="sgd", lr=0.05)
        run = trainer(kind_or_strategy, steps=2, limit_val_batches=0)
        run.fit(module, one_batch_loader(), one_batch_loader())
        run.save_checkpoint(path, **save)
        return full_weights(module)

    out = results.out
    cases = {
        "full": (strategy("fsdp", state_dict_type="full"), out / "full.ckpt"),
        "sharded": ("fsdp", out / "sharded"),
        "ddp": ("ddp", out / "ddp.ckpt"),
    }
    resumed = {}
    full_weights_by_case = {}
    for label, (kind, path) in cases.items():
        saved = full_weights_by_case[label] = first_run(kind, path)
        result = _resume_from(path)
        resumed[label] = {
            "global_step": result["global_step"],
            "weights_equal_saved": equal_weights(result["weights"], saved),
            "lr": result["lr"],
        }
        if label == "sharded":
            converted = out / "sharded_as_full.ckpt"
            if torch.distributed.get_rank() == 0:
                sharded_to_full(path, converted)
            torch.distributed.barrier()
            result = _resume_from(converted)
            resumed["converted"] = {
                "global_step": result["global_step"],
                "weights_equal_saved": equal_weights(result["weights"], saved),
                "lr": result["lr"],
            }
    # The other way, as Lightning tests its own: DDP resumes the full checkpoint (optimizer states keyed by name).
    at_start = WeightsAtStart()
    ddp = trainer("ddp", steps=4, limit_val_batches=0, callbacks=[at_start])
    ddp.fit(TinyTransformer(optimizer="sgd"), one_batch_loader(), one_batch_loader(), ckpt_path=cases["full"][1])
    resumed["full_by_ddp"] = {
        "global_step": ddp.global_step,
        "weights_equal_saved": equal_weights(at_start.weights, full_weights_by_case["full"]),
        "lr": ddp.optimizers[0].param_groups[0]["lr"],
    }
    results.write("dropin_resume", resumed)
    results.write("dropin_repeated_loads", repeated_loads(out))
    results.write("dropin_trusted_objects", trusted_objects(out))

    # Without optimizer states, fit refuses (as Lightning's FSDPStrategy); validate loads the weights.
    refusals = {}
    for kind in ("sharded", "full"):
        path = out / f"weights_only_{kind}"
        first_run(strategy("fsdp", state_dict_type=kind), path, weights_only=True)
        refusals[f"fit_{kind}"] = _refusal(lambda: _resume_from(path, kind))  # noqa: B023
        validating = trainer(strategy("fsdp", state_dict_type=kind), steps=4)
        refusals[f"validate_{kind}"] = _refusal(
            lambda: validating.validate(TinyTransformer(), one_batch_loader(), ckpt_path=path)  # noqa: B023
        )
    # Edited full checkpoints: the optimizer states removed (the schedulers' kept), or those of two optimizers.
    full = torch.load(out / "full.ckpt", weights_only=False)
    edits = {
        "no_optimizer_states": {key: value for key, value in full.items() if key != "optimizer_states"},
        "two_optimizers": {**full, "optimizer_states": full["optimizer_states"] * 2},
    }
    for label, edited in edits.items():
        if torch.distributed.get_rank() == 0:
            torch.save(edited, out / f"{label}.ckpt")
        torch.distributed.barrier()
        refusals[f"fit_{label}"] = _refusal(lambda: _resume_from(out / f"{label}.ckpt", "full"))  # noqa: B023
    results.write("dropin_refusals", refusals)

    # A user's CheckpointIO writes and reads the full checkpoint, as Lightning's FSDPStrategy writes it.
    io = CountingCheckpointIO()
    path = out / "through_io.ckpt"
    saved = first_run(strategy("fsdp", state_dict_type="full", checkpoint_io=io), path)
    resumed_io = CountingCheckpointIO()
    result = _resume_from(path, "full", plugins=[resumed_io])
    results.write(
        "dropin_checkpoint_io",
        {
            "save_calls": io.calls,
            "load_calls": resumed_io.calls,
            "weights_equal_saved": equal_weights(result["weights"], saved),
            "global_step": result["global_step"],
        },
    )


GROUPS = {
    "names": group_names,
    "precision": group_precision,
    "features": group_features,
    "reference": group_reference,
    "resume": group_resume,
    "fabric": group_fabric,
    "reliability": group_reliability,
    "dropin": group_dropin,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("group", choices=sorted(GROUPS))
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=DEVICES)
    parser.add_argument("--checkpoint")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    GROUPS[args.group](Results(args.out), args)
    # A Trainer whose fit was refused inside a context manager lives on in a reference cycle with the exception's
    # traceback, and its device mesh with the mesh's process groups.
    end_process_group()


if __name__ == "__main__":
    main()
