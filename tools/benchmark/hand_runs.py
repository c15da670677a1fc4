"""The backends driven by hand, without Lightning: what a strategy's overhead is measured against.

Each process is one rank; the harness sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT as torchrun would, so one process per device runs this module's ``measure``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tools.benchmark import optimizers
from tools.benchmark.catalogue import Run
from tools.benchmark.measure import RandomTokens, Recorder, Workload
from tools.benchmark.model import GPT
from tools.benchmark.sizes import SIZES

Step = Callable[[torch.Tensor], torch.Tensor]  # a batch in, its loss out, parameters updated
Save = Callable[[Path], None]  # writes model and optimizer state under a folder (every rank calls it)


def measure(workload: Workload, run: Run, started: float) -> dict[str, Any] | None:
    device = start_process(workload, run)
    builders = {
        "torch": torch_loop,
        "fsdp": fsdp_loop,
        "fsdp_cpu_offload": fsdp_loop,
        "deepspeed_stage_2": deepspeed_loop,
        "deepspeed_stage_2_offload": deepspeed_loop,
        "deepspeed_stage_3": deepspeed_loop,
        "deepspeed_stage_3_offload": deepspeed_loop,
        "gemini_cuda": gemini_loop,
        "gemini_cpu": gemini_loop,
        "gemini_auto": gemini_loop,
    }
    step, config, save = builders[run.name](workload, run, device)
    rank, world_size = dist_rank_and_size()
    # The same sequences as the Trainer's DistributedSampler gives this rank (without shuffling).
    sampler = range(rank, len(RandomTokens(workload)), world_size)
    loader = torch.utils.data.DataLoader(RandomTokens(workload), batch_size=workload.batch_size, sampler=sampler)
    recorder = Recorder(workload, device)
    first_step_at = time.perf_counter()
    for batch in loader:
        recorder.step_ended(step(batch.to(device, non_blocking=True)))
    if workload.checkpoint_dir:
        # As the Trainer runs do: one checkpoint after the last step, timed until every rank has written.
        folder = Path(workload.checkpoint_dir, "checkpoint")
        began = time.perf_counter()
        save(folder)
        if dist.is_initialized():
            dist.barrier()
        recorder.checkpoint_saved(began, time.perf_counter(), str(folder))
    result = recorder.result()  # on every rank: the memory peaks were gathered collectively
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return None
    return {**result, "setup_seconds": first_step_at - started, "backend_config": config}


def dist_rank_and_size() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def start_process(workload: Workload, run: Run) -> torch.device:
    """Select this rank's device and join the process group (every backend but plain PyTorch on one
    device needs one, even of size one)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if workload.accelerator == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if run.name != "torch" or workload.devices > 1:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend)
    torch.manual_seed(0)
    return device


def autocast(device: torch.device, precision: str) -> Any:
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def torch_loop(workload: Workload, run: Run, device: torch.device) -> tuple[Step, Any, Save]:
    """fp32 weights, bf16 autocast, fused AdamW; DistributedDataParallel over several devices."""
    with device:
        model: torch.nn.Module = GPT(SIZES[workload.size], workload.length, workload.activation_checkpointing)
    if workload.devices > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = optimizers.build(run.optimizer, model.parameters())

    def step(batch: torch.Tensor) -> torch.Tensor:
        with autocast(device, run.precision):
            loss = model(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    def save(folder: Path) -> None:
        if dist_rank_and_size()[0] == 0:
            folder.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, folder / "state.pt")

    return step, {"autocast": "bf16", "ddp": workload.devices > 1}, save


def fsdp_loop(workload: Workload, run: Run, device: torch.device) -> tuple[Step, Any, Save]:
    """FSDP2: created on the meta device, fully_shard on every block and then the root, allocated and
    initialised shard by shard. Parameters are gathered in bf16, gradients reduced in fp32, the fp32
    shards are the optimizer's master weights."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    offload = run.name == "fsdp_cpu_offload"
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        "offload_policy": CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload else OffloadPolicy(),
    }
    with torch.device("meta"):
        model = GPT(SIZES[workload.size], workload.length, workload.activation_checkpointing)
    for block in model.blocks:
        fully_shard(block, **policy)
    # The root's parameters (embeddings, final norm, head) are the first needed in backward: keeping
    # them gathered after forward saves an all-gather; our fsdp strategy does the same.
    fully_shard(model, reshard_after_forward=False, **policy)
    model.to_empty(device="cpu" if offload else device)
    model.init_weights()
    optimizer = optimizers.build(run.optimizer, model.parameters())

    def step(batch: torch.Tensor) -> torch.Tensor:
        loss = model(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    def save(folder: Path) -> None:
        # Sharded, each rank writing its own shards (torch.distributed.checkpoint), as our fsdp strategy saves.
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)

    config = {"mp_policy": "param bf16, reduce fp32", "root_reshard_after_forward": False, "cpu_offload": offload}
    return step, config, save


def deepspeed_config(run: Run, workload: Workload) -> dict[str, Any]:
    """The ZeRO config our deepspeed strategy builds for the same name (its defaults, written out)."""
    stage = 3 if "stage_3" in run.name else 2
    zero: dict[str, Any] = {
        "stage": stage,
        "contiguous_gradients": True,
        "overlap_comm": True,
        "reduce_bucket_size": 200_000_000,
    }
    if stage == 2:
        zero.update(allgather_partitions=True, reduce_scatter=True, allgather_bucket_size=200_000_000)
    else:
        zero["sub_group_size"] = 1_000_000_000_000
    if "offload" in run.name:
        zero["offload_optimizer"] = {"device": "cpu", "buffer_count": 4, "pin_memory": False}
        if stage == 3:
            zero["offload_param"] = {
                "device": "cpu",
                "buffer_count": 5,
                "buffer_size": 100_000_000,
                "max_in_cpu": 1_000_000_000,
                "pin_memory": False,
            }
    return {
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": True},
        "train_micro_batch_size_per_gpu": workload.batch_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
    }


def deepspeed_loop(workload: Workload, run: Run, device: torch.device) -> tuple[Step, Any, Save]:
    optimizers.plain_cuda_architectures()
    import deepspeed

    config = deepspeed_config(run, workload)
    if config["zero_optimization"]["stage"] == 3:
        # Partitioned as each module is created, as the strategy's configure_model context does.
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = GPT(SIZES[workload.size], workload.length, workload.activation_checkpointing)
    else:
        with device:
            model = GPT(SIZES[workload.size], workload.length, workload.activation_checkpointing)
    optimizer = optimizers.build(run.optimizer, model.parameters())
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    def step(batch: torch.Tensor) -> torch.Tensor:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
        return loss

    def save(folder: Path) -> None:
        engine.save_checkpoint(str(folder))

    return step, config, save


def gemini_plugin_arguments(run: Run) -> dict[str, Any]:
    """GeminiPlugin's arguments for each placement, as our colossalai strategy passes them by default."""
    arguments: dict[str, Any] = {
        "precision": "fp16" if run.precision == "16-mixed" else "bf16",
        # The strategy's chunk search: 64 Mi parameters wide in steps of 16 Ki (its 4096 grids), from
        # at least 32 Mi parameters. Without hidden_dim GeminiPlugin would step by 1 Ki and could pick
        # another chunk size than the strategy.
        "search_range_m": 64,
        "hidden_dim": 64 * 2**20 // 4096,
        "min_chunk_size_m": 32,
    }
    if run.name == "gemini_auto":
        arguments["placement_policy"] = "auto"
    else:
        offload = 1.0 if run.name == "gemini_cpu" else 0.0
        arguments.update(
            placement_policy="static", shard_param_frac=1.0, offload_optim_frac=offload, offload_param_frac=offload
        )
    if run.variant == "unpinned":
        arguments.update(pin_memory=False, enable_async_reduce=False)
    return arguments


def gemini_loop(workload: Workload, run: Run, device: torch.device) -> tuple[Step, Any, Save]:
    from colossalai.booster import Booster
    from colossalai.booster.plugin import GeminiPlugin
    from colossalai.lazy import LazyInitContext

    arguments = gemini_plugin_arguments(run)
    with LazyInitContext(default_device=device):
        model = GPT(SIZES[workload.size], workload.length, workload.activation_checkpointing)
    optimizer = optimizers.build(run.optimizer, model.parameters())
    booster = Booster(plugin=GeminiPlugin(**arguments))
    model, optimizer, *_ = booster.boost(model, optimizer)

    def step(batch: torch.Tensor) -> torch.Tensor:
        loss = model(batch)
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        return loss

    def save(folder: Path) -> None:
        # Gathered into one model file and one optimizer file, as our strategy's default ("full") saves.
        folder.mkdir(parents=True, exist_ok=True)
        booster.save_model(model, str(folder / "model.pt"))
        booster.save_optimizer(optimizer, str(folder / "optimizer.pt"))

    return step, arguments, save
