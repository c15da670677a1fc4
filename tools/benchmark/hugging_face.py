"""A Hugging Face Llama through a strategy name: seconds from ``trainer.fit`` to the first step, tokens/s, MFU at
the dense peak, GPU and host peaks. The model is built in ``configure_model`` as users write it, from its config or
with ``from_pretrained`` from a local folder (``--write-pretrained`` makes one of random weights first).

    python -m tools.benchmark.hugging_face --size 8b --strategy fsdp --devices 4 --out results.jsonl
    python -m tools.benchmark.hugging_face --size 8b --strategy lightning:fsdp ...      # Lightning's built-in
    python -m tools.benchmark.hugging_face --size 8b --write-pretrained /tmp/llama-8b  # then --pretrained it
    python -m tools.benchmark.hugging_face --size 8b --strategy fsdp --compile ...      # each decoder layer compiled
    python -m tools.benchmark.hugging_face --size 8b --strategy fsdp --compile --float8 tensorwise ...

Rank 0 appends one JSON record to ``--out`` with the device, versions, date and commit (``BENCHMARK_GIT_COMMIT``
where the checkout has no git, or a copy of it carries another commit's git metadata).

``--compile`` compiles each decoder layer in ``configure_model``, before the strategy shards it, and trains without
Hugging Face's key-value cache: with the cache (``use_cache``, on by default in training too) each layer reads its
own ``layer_idx``, so every layer compiles once more (one graph per layer; past dynamo's recompile limit, 8, the
rest run uncompiled), where without it one graph serves all. ``--no-cache`` alone is the baseline to compare with.

``--float8`` converts the decoder layers' linear layers to torchao's float8 training (``convert_to_float8_training``,
dynamic tensorwise scales; the output layer stays in bf16) in ``configure_model``, before compiling, as a user opts
in: ``all-gather`` also has FSDP2 gather those weights in float8. MFU stays counted against the bf16 dense peak, so
that float8 and bf16 runs compare by it.

``--text DIR`` trains on the bytes of the ``.py`` files under DIR (token ids 0 to 255, windows one after another)
instead of random tokens, from which a model learns nothing: loss curves to compare, bf16 against float8 say, with
another ``--seed`` for the spread between two runs alike. The record then keeps every step's loss.

    python -m tools.benchmark.hugging_face --size 1b --strategy fsdp --devices 2 --compile --steps 500 \\
        --lr 1e-4 --text "$(python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')" --float8 tensorwise
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, Dataset

from lightning_strategies.speed import flops_per_token, whole_numel

# Llama 3 shapes (https://huggingface.co/meta-llama): width, MLP width, layers, heads, key-value heads, tied embeddings.
SIZES = {
    "tiny": (64, 128, 2, 4, 2, False),
    "1b": (2048, 8192, 16, 32, 8, True),
    "8b": (4096, 14336, 32, 32, 8, False),
}
VOCABULARY = {"tiny": 128, "1b": 128256, "8b": 128256}
BUILTINS = ("lightning:fsdp", "lightning:deepspeed_stage_3")


def llama_config(size: str) -> Any:
    import transformers

    width, mlp, layers, heads, kv_heads, tied = SIZES[size]
    return transformers.LlamaConfig(
        vocab_size=VOCABULARY[size], hidden_size=width, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=tied,
        max_position_embeddings=8192, rope_theta=500000.0, attn_implementation="sdpa",
    )  # fmt: skip


class Tokens(Dataset):
    def __init__(self, size: str, length: int, count: int) -> None:
        self.size, self.length, self.count = size, length, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randint(0, VOCABULARY[self.size], (self.length,), generator=torch.Generator().manual_seed(index))


class Text(Dataset):
    """Windows of ``length`` bytes, one after another, of the ``.py`` files under ``folder`` (sorted by path), as
    token ids 0 to 255 (modulo a smaller vocabulary)."""

    def __init__(self, folder: Path, length: int, count: int, vocabulary: int) -> None:
        needed = length * count
        data = bytearray()
        for file in sorted(folder.rglob("*.py")):
            data += file.read_bytes()
            if len(data) >= needed:
                break
        if len(data) < needed:
            raise SystemExit(
                f"--text {folder}: its .py files hold {len(data):,} bytes, and {needed:,} are needed "
                f"({count} sequences of {length}). Give a larger folder, or fewer --steps."
            )
        self.tokens = torch.frombuffer(data[:needed], dtype=torch.uint8)
        self.length, self.count, self.vocabulary = length, count, vocabulary

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.tokens[index * self.length : (index + 1) * self.length].long() % self.vocabulary


class Llama(LightningModule):
    def __init__(
        self, size: str, pretrained: str | None, optimizer: str, batch: int, length: int, steps: int,
        compile_layers: bool = False, use_cache: bool = True, float8: str | None = None, lr: float = 1e-5,
        text: Path | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.size, self.pretrained, self.optimizer_name = size, pretrained, optimizer
        self.batch, self.length, self.steps = batch, length, steps
        self.compile_layers, self.use_cache, self.float8 = compile_layers, use_cache, float8
        self.lr, self.text = lr, text
        self.model: Any = None
        self.parameters_whole = 0
        self.flops_per_token = 0

    def configure_model(self) -> None:
        if self.model is not None:
            return
        import transformers

        if self.pretrained:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(self.pretrained, dtype=torch.float32)
        else:
            self.model = transformers.AutoModelForCausalLM.from_config(llama_config(self.size), dtype=torch.float32)
        # Counted as SpeedMonitor counts them, so the MFU recorded here is the one users log. Counted now, while
        # every parameter still tells its whole size (ZeRO-3's ds_numel, a lazy or meta tensor's shape): once set
        # up, Gemini's chunks and FSDP1's flat shards leave the module's parameters empty or partial.
        self.parameters_whole = sum(whole_numel(parameter) for parameter in self.model.parameters())
        self.flops_per_token = flops_per_token(self.model, self.length)
        if self.float8:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training

            config = Float8LinearConfig(enable_fsdp_float8_all_gather=self.float8 == "all-gather")
            convert_to_float8_training(self.model.model, config=config)
        if self.compile_layers:  # compiled when first called; sharded by the strategy before that
            for layer in self.model.model.layers:
                layer.compile()

    def training_step(self, batch: torch.Tensor, batch_index: int) -> torch.Tensor:
        return self.model(input_ids=batch, labels=batch, use_cache=self.use_cache).loss

    def configure_optimizers(self) -> Any:
        if self.optimizer_name == "hybrid":
            from colossalai.nn.optimizer import HybridAdam

            return HybridAdam(self.parameters(), lr=self.lr)
        if self.optimizer_name == "deepspeed_cpu_adam":
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(self.parameters(), lr=self.lr, adamw_mode=True)
        return torch.optim.AdamW(self.parameters(), lr=self.lr, fused=self.device.type == "cuda")

    def train_dataloader(self) -> DataLoader:
        if self.text is not None:  # each sequence once
            count = self.batch * self.steps * self.trainer.world_size
            return DataLoader(Text(self.text, self.length, count, VOCABULARY[self.size]), batch_size=self.batch)
        return DataLoader(Tokens(self.size, self.length, self.batch * self.steps * 8), batch_size=self.batch)


class Timeline(Callback):
    """When the first step starts, each step's end (GPU synchronised), and every step's loss."""

    def __init__(self, fit_called: float) -> None:
        self.fit_called = fit_called
        self.first_step: float | None = None
        self.step_ends: list[float] = []
        self.losses: list[float] = []

    def on_train_batch_start(self, trainer: Trainer, module: LightningModule, batch: Any, batch_index: int) -> None:
        if self.first_step is None:
            self.first_step = time.perf_counter()

    def on_train_batch_end(
        self, trainer: Trainer, module: LightningModule, outputs: Any, batch: Any, index: int
    ) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.step_ends.append(time.perf_counter())
        self.losses.append(float(outputs["loss"]))


class MachineMemory(threading.Thread):
    """The machine's used memory (MemTotal - MemAvailable), sampled every 0.2 s: what all ranks hold together."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.baseline = self.used()
        self.peak = self.baseline
        self.running = True

    @staticmethod
    def used() -> int:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return (int(fields["MemTotal"].split()[0]) - int(fields["MemAvailable"].split()[0])) * 1024

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.used())
            time.sleep(0.2)


def strategy_for(name: str, options: dict[str, Any]) -> Any:
    if options:  # the name's own settings, some replaced: as registered in Lightning's registry
        from lightning.pytorch.strategies import StrategyRegistry

        entry = StrategyRegistry[name]
        return entry["strategy"](**{**entry["init_params"], **options})
    if name == "lightning:fsdp":
        from lightning.pytorch.strategies import FSDPStrategy
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        return FSDPStrategy(auto_wrap_policy={LlamaDecoderLayer}, sharding_strategy="FULL_SHARD")
    if name == "lightning:deepspeed_stage_3":
        from lightning.pytorch.strategies import DeepSpeedStrategy

        return DeepSpeedStrategy(stage=3)
    return name


def write_pretrained(size: str, folder: Path) -> None:
    """A Hugging Face folder of the size's shape with random bf16 weights (std 0.02), shard by shard from the GPU."""
    import transformers
    from safetensors.torch import save_file

    config = llama_config(size)
    with torch.device("meta"):
        skeleton = transformers.AutoModelForCausalLM.from_config(config)
    folder.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    shard_bytes, index = 0, 0
    names = [name for name in skeleton.state_dict() if name not in (skeleton.all_tied_weights_keys or {})]
    for name in [*names, None]:
        if name is None or shard_bytes > 4 * 2**30:
            file = f"model-{index:05d}.safetensors"
            save_file(shard, str(folder / file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, file))
            shard, shard_bytes, index = {}, 0, index + 1
        if name is None:
            break
        tensor = skeleton.state_dict()[name]
        value = torch.randn(tensor.shape, device=device, dtype=torch.bfloat16) * 0.02
        if name.endswith("norm.weight"):
            value = torch.ones(tensor.shape, device=device, dtype=torch.bfloat16)
        shard[name] = value.cpu()
        shard_bytes += shard[name].numel() * 2
    total = sum(int(value.numel()) * 2 for value in skeleton.state_dict().values())
    index_file = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_file, indent=1))
    config.dtype = torch.bfloat16
    config.save_pretrained(folder)


def evict_from_page_cache(folder: Path) -> None:
    """Drop the folder's files from the page cache, so that loading them reads the disk (as after a reboot, or from
    a checkpoint written by another machine). Written back first: the kernel drops clean pages only."""
    for file in sorted(folder.iterdir()):
        descriptor = os.open(file, os.O_RDONLY)
        try:
            os.fsync(descriptor)
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark.hugging_face")
    parser.add_argument("--size", choices=sorted(SIZES), default="8b")
    parser.add_argument("--strategy", default="fsdp", help=f"a strategy name, or {' / '.join(BUILTINS)}")
    parser.add_argument(
        "--options", type=json.loads, default="{}", help="JSON: the strategy's settings to replace, by name"
    )
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--accelerator", default="cuda")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--batch", type=int, default=4, help="sequences per device and step")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--pretrained", help="a folder to load with from_pretrained (default: build from the config)")
    parser.add_argument(
        "--cold", action="store_true", help="drop --pretrained's files from the page cache first: a read from disk"
    )
    parser.add_argument("--write-pretrained", help="write a folder of random weights of --size there, and stop")
    parser.add_argument("--compile", action="store_true", help="compile each decoder layer; implies --no-cache")
    parser.add_argument("--no-cache", action="store_true", help="train without Hugging Face's key-value cache")
    parser.add_argument(
        "--float8", choices=("tensorwise", "all-gather"), help="float8 matmuls through torchao in the decoder layers"
    )
    parser.add_argument("--lr", type=float, default=1e-5, help="the optimizer's learning rate, constant")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds torch, numpy and random: the initialisation of a model from its config",
    )
    parser.add_argument("--text", type=Path, help="train on the bytes of the .py files under this folder")
    parser.add_argument("--out", default="hugging_face.jsonl")
    arguments = parser.parse_args(argv)
    if arguments.write_pretrained:
        started = time.perf_counter()
        write_pretrained(arguments.size, Path(arguments.write_pretrained))
        print(f"wrote {arguments.write_pretrained} in {time.perf_counter() - started:.1f} s")
        return

    if not isinstance(arguments.options, dict) or (arguments.options and arguments.strategy in BUILTINS):
        parser.error("--options takes a JSON object of settings, for a strategy name of this project")
    if arguments.float8 == "all-gather" and not arguments.strategy.startswith("fsdp"):
        parser.error("--float8 all-gather gathers float8 weights through FSDP2: pick one of this project's fsdp names")
    if arguments.text is not None and not arguments.text.is_dir():
        parser.error(f"--text {arguments.text} is not a folder: give one that holds .py files")
    if arguments.steps < 1:
        parser.error("--steps must be 1 or more")
    if arguments.cold and not arguments.pretrained:
        parser.error("--cold drops the --pretrained folder from the page cache: give --pretrained too")
    # Lightning starts the other local ranks by running this script again, with LOCAL_RANK set: only the first run
    # evicts, before any rank reads. Under a launcher that sets LOCAL_RANK in every process (torchrun) none does,
    # and the record says so.
    arguments.evicted = arguments.cold and "LOCAL_RANK" not in os.environ
    if arguments.evicted:
        evict_from_page_cache(Path(arguments.pretrained))
    seed_everything(arguments.seed, verbose=False)
    memory = MachineMemory()
    memory.start()
    # What each backend's offload needs: DeepSpeed refuses torch's optimizers with an offload of its own.
    optimizer = "adamw"
    if arguments.strategy.startswith("colossalai"):
        optimizer = "hybrid"
    elif "deepspeed" in arguments.strategy and arguments.options.get(
        "offload_optimizer", "offload" in arguments.strategy
    ):
        optimizer = "deepspeed_cpu_adam"
    module = Llama(
        arguments.size, arguments.pretrained, optimizer, arguments.batch, arguments.length, arguments.steps,
        compile_layers=arguments.compile, use_cache=not (arguments.no_cache or arguments.compile),
        float8=arguments.float8, lr=arguments.lr, text=arguments.text,
    )  # fmt: skip
    trainer = Trainer(
        strategy=strategy_for(arguments.strategy, arguments.options), accelerator=arguments.accelerator,
        devices=arguments.devices,
        precision=arguments.precision, max_steps=arguments.steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=True,
    )  # fmt: skip
    fit_called = time.perf_counter()
    timeline = Timeline(fit_called)
    trainer.callbacks.append(timeline)
    trainer.fit(module)
    memory.running = False
    record(arguments, trainer, module, timeline, memory)


def record(
    arguments: argparse.Namespace, trainer: Trainer, module: Llama, timeline: Timeline, memory: MachineMemory
) -> None:
    from tools.benchmark import environment, measure

    device = trainer.strategy.root_device
    peaks = measure.memory_peaks(device)
    if not trainer.is_global_zero:
        return
    parameters, flops = module.parameters_whole, module.flops_per_token
    timed = timeline.step_ends[2:]  # the first steps warm up kernels and allocators
    seconds = (timed[-1] - timed[0]) / (len(timed) - 1) if len(timed) > 1 else None
    tokens = arguments.batch * arguments.length * trainer.world_size
    peak = measure.peak_bf16_flops(measure.device_name(device)) if device.type == "cuda" else None
    throughput = tokens / seconds if seconds else None
    facts = environment.collect()
    result = {
        "strategy": arguments.strategy, "options": arguments.options, "size": arguments.size,
        "steps": arguments.steps, "compiled_layers": arguments.compile, "use_cache": module.use_cache,
        "float8": arguments.float8, "lr": arguments.lr, "seed": arguments.seed,
        "data": str(arguments.text) if arguments.text else "random tokens",
        "data_bytes": tokens * arguments.steps if arguments.text else None,  # each sequence once
        "environment": environment.recorded_settings(),
        "parameters": parameters, "devices": trainer.world_size,
        "source": "from_pretrained" if arguments.pretrained else "from_config",
        "page_cache": ("evicted" if arguments.evicted else "as found") if arguments.pretrained else None,
        "precision": arguments.precision,
        "tokens_per_step": tokens, "setup_seconds": round((timeline.first_step or 0) - timeline.fit_called, 1),
        "tokens_per_second": round(throughput) if throughput else None,
        "mfu": round(throughput * flops / trainer.world_size / peak, 4) if throughput and peak else None,
        "first_loss": timeline.losses[0] if timeline.losses else None,
        "last_loss": timeline.losses[-1] if timeline.losses else None,
        "losses": [round(loss, 4) for loss in timeline.losses] if arguments.text else None,
        "peak_gpu_reserved_gib": round((peaks["peak_gpu_reserved_bytes"] or 0) / 2**30, 1),
        "peak_rank_rss_gib": round(peaks["peak_host_rss_bytes"] / 2**30, 1),
        "machine_memory_rise_gib": round((memory.peak - memory.baseline) / 2**30, 1),
        **facts,
    }  # fmt: skip
    with open(arguments.out, "a") as out:
        out.write(json.dumps(result) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
