"""Which strategy fits a model on this machine: the workload and machine descriptions plugins answer
with memory predictions, and the ranking of their answers.

Core knows no backend: each strategy package predicts its own peaks through the
``memory_plan_candidates`` hook. What lives here is what every model shares: the shape of a GPT-style
decoder, the machine, the bytes per element of a precision, and how much of a device is usable.
Importing this module imports neither torch nor Lightning.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from lightning_strategies.hooks import plugins_of
from lightning_strategies.registry import get_registry

# What a strategy package's memory model may use (the rest is core's own arithmetic and ranking).
__all__ = [
    "CHOICE_MARGIN",
    "GIB",
    "Candidate",
    "Machine",
    "ModelShape",
    "Plan",
    "StateBytes",
    "Workload",
    "activation_bytes",
    "candidate",
    "fits_machine",
    "host_base_bytes",
    "parse_count",
    "plan",
    "smallest_fitting_fraction",
    "with_choice_margin",
]

GIB = 2**30

# Memory a process uses that no model predicts. All three are estimates, to be fitted against the GPU
# measurements of tools/benchmark's memory mode (docs/which-strategy.md shows the table).
# The CUDA context (kernels, cuBLAS workspaces) lives outside torch's allocator, so it is not part of
# max_memory_allocated, but it occupies the device.
CUDA_CONTEXT_BYTES = int(0.75 * GIB)
# The caching allocator reserves more than it hands out (blocks split and cached between steps).
ALLOCATOR_FRAGMENTATION = 0.08
# Resident memory of one training process without model state on the host: torch, CUDA libraries, Lightning.
# Measured on an H200 (torch 2.11 + CUDA 13, 2026-11-23): 1.4 GiB before configure_model, 1.7 to 2.1 GiB
# after the first step of strategies that keep nothing on the host.
HOST_PROCESS_BASE_BYTES = int(2.0 * GIB)
# What is left of host memory for training: the kernel, page cache and other processes keep the rest.
HOST_HEADROOM = 0.08
# Below this much free GPU memory a plan advises expandable segments: on an H100, 10.6B through Gemini planned at
# 67.6 of 79 GiB ran out of memory in its first backward with 60 GiB allocated and 15 GiB reserved but unused, and
# trained with them (64.6 GiB at the peak); plans leaving 21 GiB of an H200 trained without them.
EXPANDABLE_SEGMENTS_BELOW_BYTES = 15 * GIB

# Activations of a GPT block, bytes per token and unit of width, in 16-bit: the count of Korthikanti et al.
# 2022 ("Reducing activation recomputation in large transformer models") without its s x s attention
# terms, which scaled_dot_product_attention's fused kernels do not store. An estimate, to be fitted.
ACTIVATION_BYTES_PER_TOKEN_WIDTH = 34
# Output logits per token and vocabulary entry: the low-precision logits, their fp32 copy for the loss
# and the fp32 gradient of the loss. An estimate, to be fitted.
LOGITS_BYTES_PER_TOKEN_ENTRY = 10

PRECISIONS = ("bf16-mixed", "16-mixed", "32-true", "bf16-true", "16-true")

# GPT-3's model shapes (Brown et al. 2020, table 2.1): (layers, width, heads). A bare parameter count
# is given the shape of the nearest of these, with the width scaled to match the count.
GPT3_SHAPES = (
    (12, 768, 12),
    (24, 1024, 16),
    (24, 1536, 16),
    (24, 2048, 16),
    (32, 2560, 32),
    (32, 4096, 32),
    (40, 5120, 40),
    (96, 12288, 96),
)
DEFAULT_VOCABULARY = 50304  # GPT-2's 50257 rounded up to a multiple of 128


def parse_count(text: str | int | float) -> int:
    """``"13B"``, ``"6.7b"``, ``"350M"``, ``"1.3e9"`` or a number -> a parameter count."""
    if isinstance(text, (int, float)):
        return int(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbt]?)\s*", text.lower())
    if match is None:
        raise ValueError(f"Cannot read {text!r} as a parameter count; write e.g. 13B, 6.7B, 350M or 1.3e9.")
    scale = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}[match.group(2)]
    return int(float(match.group(1)) * scale)


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A GPT-style decoder: pre-norm blocks of attention and a 4x MLP, learned positions, untied head."""

    layers: int
    hidden: int
    vocabulary: int = DEFAULT_VOCABULARY
    heads: int | None = None

    def block_tensors(self) -> list[int]:
        """Elements of one block's tensors in module order: a norm, q/k/v, the output projection, a norm and the
        MLP's two layers (weights, then biases)."""
        h = self.hidden
        return [h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h]

    def block_parameters(self) -> int:
        return sum(self.block_tensors())

    def tensor_sizes(self, sequence_length: int) -> list[int]:
        """Elements of each parameter tensor in module order: token and position embeddings, the blocks, the final
        norm and the head. Backends that split the model between sub-groups or buckets by tensor follow this."""
        h = self.hidden
        return [
            self.vocabulary * h,
            sequence_length * h,
            *self.block_tensors() * self.layers,
            h,
            h,
            self.vocabulary * h,
        ]

    def parameters(self, sequence_length: int) -> int:
        return sum(self.tensor_sizes(sequence_length))

    @classmethod
    def for_parameters(cls, parameters: int, vocabulary: int = DEFAULT_VOCABULARY) -> ModelShape:
        """The GPT-3-like shape with about ``parameters`` parameters (layers of the nearest GPT-3 size)."""
        if parameters <= 0:
            raise ValueError(f"A model needs a positive parameter count, not {parameters}.")

        def size(layers: int, hidden: int) -> int:
            return 12 * layers * hidden**2 + 2 * vocabulary * hidden

        layers, _, _ = min(GPT3_SHAPES, key=lambda shape: abs(math.log(size(shape[0], shape[1]) / parameters)))
        # Solve 12 L h^2 + 2 V h = P for h, rounded to a multiple of 128 as real models are.
        a, b = 12 * layers, 2 * vocabulary
        hidden = (-b + math.sqrt(b * b + 4 * a * parameters)) / (2 * a)
        return cls(layers=layers, hidden=max(128, round(hidden / 128) * 128), vocabulary=vocabulary)


@dataclasses.dataclass(frozen=True)
class Workload:
    """What is trained: the model, the tokens per step and device, precision and optimizer.

    ``parameters`` is the count the memory of model states follows; ``shape`` the decoder the
    activations follow (derived from the count when not given).
    """

    parameters: int
    shape: ModelShape
    sequence_length: int = 1024
    micro_batch: int = 8
    precision: str = "bf16-mixed"
    optimizer: str = "adam"  # "adam" (two fp32 moments) or "sgd" (one momentum buffer)
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is not one of: {', '.join(PRECISIONS)}.")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer={self.optimizer!r}: the planner models 'adam' and 'sgd'.")
        if self.sequence_length < 1 or self.micro_batch < 1:
            raise ValueError("sequence_length and micro_batch must be at least 1.")

    @classmethod
    def build(
        cls,
        parameters: int | str | None = None,
        layers: int | None = None,
        hidden: int | None = None,
        vocabulary: int = DEFAULT_VOCABULARY,
        heads: int | None = None,
        **options: Any,
    ) -> Workload:
        """From a parameter count, a shape, or both (the count wins for model states)."""
        sequence_length = options.get("sequence_length", 1024)
        if layers is not None and hidden is not None:
            shape = ModelShape(layers, hidden, vocabulary, heads)
            count = parse_count(parameters) if parameters is not None else shape.parameters(sequence_length)
        elif parameters is not None:
            count = parse_count(parameters)
            shape = ModelShape.for_parameters(count, vocabulary)
            if layers is not None or hidden is not None:
                shape = dataclasses.replace(shape, layers=layers or shape.layers, hidden=hidden or shape.hidden)
        else:
            raise ValueError("Give the parameter count (e.g. params='13B') or both layers and hidden.")
        return cls(parameters=count, shape=shape, **options)

    @property
    def low_precision_bytes(self) -> int:
        """Bytes per element of the weights the forward pass uses."""
        return 4 if self.precision == "32-true" else 2

    @property
    def mixed(self) -> bool:
        """fp32 master weights beside low-precision working weights."""
        return self.precision.endswith("-mixed")

    @property
    def optimizer_state_bytes(self) -> int:
        """Bytes per parameter of the optimizer's own state (fp32 moments)."""
        return 8 if self.optimizer == "adam" else 4

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.sequence_length

    def state_bytes(self) -> StateBytes:
        """Bytes per parameter of each model state, before any partitioning or offloading."""
        working = self.low_precision_bytes
        return StateBytes(
            weights=working,
            gradients=working,
            # 16-bit "true" precisions are planned like mixed ones: DeepSpeed and Gemini keep fp32 masters
            # there too, and a plan that overestimates a torch optimizer's bf16 moments errs safe.
            master=0 if self.precision == "32-true" else 4,
            optimizer=self.optimizer_state_bytes,
        )


@dataclasses.dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter: working weights, their gradients, fp32 master weights, optimizer moments.

    bf16-mixed with Adam: 2 + 2 + 4 + 8 = 16 bytes, the figure ZeRO's paper starts from. A strategy that
    keeps fp32 weights and casts per layer (FSDP2's MixedPrecisionPolicy) stores the same 16 bytes as
    fp32 weights, fp32 gradients and moments.
    """

    weights: int
    gradients: int
    master: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.master + self.optimizer

    @property
    def optimizer_side(self) -> int:
        """What an optimizer offload moves: master weights and moments."""
        return self.master + self.optimizer


def activation_bytes(workload: Workload) -> int:
    """Peak bytes of activations on one GPU for one micro-batch, from the model's shape.

    With activation checkpointing each block keeps only its input, and one block at a time holds its
    full activations while it is recomputed in backward.
    """
    shape, tokens = workload.shape, workload.tokens
    scale = 2 if workload.precision == "32-true" else 1
    per_block = ACTIVATION_BYTES_PER_TOKEN_WIDTH * tokens * shape.hidden * scale
    if workload.activation_checkpointing:
        blocks = shape.layers * workload.low_precision_bytes * tokens * shape.hidden + per_block
    else:
        blocks = shape.layers * per_block
    return blocks + LOGITS_BYTES_PER_TOKEN_ENTRY * tokens * shape.vocabulary * scale


@dataclasses.dataclass(frozen=True)
class Machine:
    """The devices one node offers: GPUs (count and memory each), host memory, NVMe space for offloading."""

    gpus: int
    gpu_memory_bytes: int
    host_memory_bytes: int
    nvme_bytes: int = 0
    detected: tuple[str, ...] = ()  # which fields were read from this machine, not given

    @property
    def gpu_budget_bytes(self) -> int:
        """What torch's allocator can hand out per GPU: the card less the CUDA context and fragmentation."""
        return int((self.gpu_memory_bytes - CUDA_CONTEXT_BYTES) * (1 - ALLOCATOR_FRAGMENTATION))

    @property
    def host_budget_bytes(self) -> int:
        return int(self.host_memory_bytes * (1 - HOST_HEADROOM))

    @classmethod
    def detect(
        cls,
        gpus: int | None = None,
        gpu_memory_bytes: int | None = None,
        host_memory_bytes: int | None = None,
        nvme_bytes: int = 0,
    ) -> Machine:
        """This machine, with any field given overriding what is found."""
        detected = []
        if gpus is None or gpu_memory_bytes is None:
            found_gpus, found_memory = _cuda_devices()
            if gpus is None:
                gpus = found_gpus
                detected.append("gpus")
            if gpu_memory_bytes is None:
                gpu_memory_bytes = found_memory
                detected.append("gpu_memory")
        if host_memory_bytes is None:
            host_memory_bytes = host_memory()
            detected.append("host_memory")
        return cls(gpus, gpu_memory_bytes, host_memory_bytes, nvme_bytes, tuple(detected))


def _cuda_devices() -> tuple[int, int]:
    """(count, memory of the smallest) of the CUDA devices, or (0, 0) without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return 0, 0
    if not torch.cuda.is_available():
        return 0, 0
    count = torch.cuda.device_count()
    memory = min(torch.cuda.get_device_properties(index).total_memory for index in range(count))
    return count, memory


def host_memory(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """Host memory this process may use: MemTotal, or a container's cgroup limit where lower."""
    total = 0
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
                break
    except OSError:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = 0
    for limit_file in (cgroup / "memory.max", cgroup / "memory" / "memory.limit_in_bytes"):
        try:
            text = limit_file.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (total == 0 or int(text) < total):
            total = int(text)
    return total


@dataclasses.dataclass
class Candidate:
    """One strategy name with settings, and what it would use.

    ``gpu_peak_gib`` is the predicted ``torch.cuda.max_memory_allocated`` of each device; ``host_peak_gib``
    the predicted peak resident memory of all of the node's training processes together.
    ``offloaded_fraction`` is the share of model-state bytes (weights, gradients, optimizer states) kept in
    host memory or on NVMe. ``preference`` orders a package's own candidates of equal offload (lower runs
    faster, as far as its author knows).
    """

    strategy: str
    settings: dict[str, Any]
    gpu_peak_gib: float
    host_peak_gib: float
    fits: bool
    offloaded_fraction: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)
    preference: int = 0
    nvme_gib: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        for key in ("gpu_peak_gib", "host_peak_gib", "nvme_gib"):
            record[key] = round(record[key], 2)
        record["offloaded_fraction"] = round(self.offloaded_fraction, 3)
        return record

    def strategy_object(self, namespace: str = "lightning.pytorch", **overrides: Any) -> Any:
        """The strategy instance, ready for ``Trainer(strategy=...)`` (or Fabric, with that namespace)."""
        return get_registry().resolve(self.strategy, namespace=namespace, **{**self.settings, **overrides})


def candidate(
    strategy: str,
    settings: dict[str, Any],
    gpu_peak_bytes: float,
    host_peak_bytes: float,
    machine: Machine,
    offloaded_fraction: float = 0.0,
    notes: Iterable[str] = (),
    preference: int = 0,
    nvme_bytes: float = 0.0,
) -> Candidate:
    """A Candidate from byte counts, with ``fits`` judged the same way for every package."""
    fits = fits_machine(gpu_peak_bytes, host_peak_bytes, machine, nvme_bytes)
    notes = list(notes)
    free = machine.gpu_memory_bytes - gpu_peak_bytes
    if fits and free < EXPANDABLE_SEGMENTS_BELOW_BYTES and not expandable_segments_set():
        notes.append(
            f"leaves {free / GIB:.0f} GiB of each GPU free: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "before training starts, or fragmentation may run it out of memory"
        )
    return Candidate(
        strategy,
        dict(settings),
        gpu_peak_bytes / GIB,
        host_peak_bytes / GIB,
        fits,
        offloaded_fraction,
        notes,
        preference,
        nvme_bytes / GIB,
    )


def expandable_segments_set() -> bool:
    """Whether this process's environment asks torch's allocator for expandable segments."""
    return "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()


def fits_machine(gpu_peak_bytes: float, host_peak_bytes: float, machine: Machine, nvme_bytes: float = 0.0) -> bool:
    return (
        machine.gpus > 0
        and gpu_peak_bytes <= machine.gpu_budget_bytes
        and host_peak_bytes <= machine.host_budget_bytes
        and nvme_bytes <= machine.nvme_bytes
    )


def host_base_bytes(processes: int) -> int:
    """Resident memory of ``processes`` training processes before the model: one per GPU used."""
    return HOST_PROCESS_BASE_BYTES * max(1, processes)


# The share of each GPU a package's memory model keeps free beyond its prediction when it chooses how much to
# offload, so that a prediction a little low still trains. One value for every package, so that their
# choices are equally cautious and the ranking compares like with like.
CHOICE_MARGIN = 0.05


def with_choice_margin(machine: Machine) -> Machine:
    """``machine`` with CHOICE_MARGIN less GPU memory: what to pass to ``smallest_fitting_fraction``."""
    return dataclasses.replace(machine, gpu_memory_bytes=int(machine.gpu_memory_bytes * (1 - CHOICE_MARGIN)))


def smallest_fitting_fraction(
    predict: Callable[[float], tuple[float, float]], machine: Machine, steps: int = 20
) -> float | None:
    """The smallest offload fraction (0, 1/steps, ..., 1) whose (GPU, host) peaks fit ``machine``.

    ``predict(fraction)`` returns the two peaks in bytes. Packages use this to choose Gemini's
    offload fractions or DeepSpeed's offload ratio; None when not even full offload fits.
    """
    for step in range(steps + 1):
        fraction = step / steps
        gpu, host = predict(fraction)
        if fits_machine(gpu, host, machine):
            return fraction
    return None


@dataclasses.dataclass
class Plan:
    """Ranked candidates for one workload on one machine; where none fits, what would."""

    workload: Workload
    machine: Machine
    candidates: list[Candidate]
    suggestions: list[str]
    problems: list[str] = dataclasses.field(default_factory=list)  # plugins whose hook failed

    @property
    def fitting(self) -> list[Candidate]:
        return [candidate for candidate in self.candidates if candidate.fits]

    def best(self) -> Candidate:
        """The first candidate that fits, or an error saying what would make one fit."""
        if not self.fitting:
            raise ValueError(nothing_fits_message(self))
        return self.fitting[0]

    def best_strategy(self, namespace: str = "lightning.pytorch", **overrides: Any) -> Any:
        """The best candidate's strategy object, ready for the Trainer."""
        return self.best().strategy_object(namespace, **overrides)


def rank(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Fitting first; then least offloaded (offloading costs step time); then the package's preference;
    then the smaller GPU peak (more room for a larger batch)."""
    return sorted(
        candidates,
        key=lambda c: (not c.fits, round(c.offloaded_fraction, 3), c.preference, c.gpu_peak_gib, c.strategy),
    )


def nothing_fits_message(plan: Plan) -> str:
    workload, machine = plan.workload, plan.machine
    text = (
        f"No installed strategy fits {workload.parameters / 1e9:.2f}B parameters "
        f"(micro-batch {workload.micro_batch} x {workload.sequence_length} tokens, {workload.precision}) on "
        f"{machine.gpus} GPU(s) of {machine.gpu_memory_bytes / GIB:.0f} GiB with {machine.host_memory_bytes / GIB:.0f} "
        "GiB of host memory."
    )
    if machine.gpus == 0:
        return text + (
            " No CUDA device was found here: pass --gpus N and --gpu-memory GiB (gpus= and gpu_memory_gib= from "
            "Python) to plan for the machine you will train on."
        )
    if not plan.candidates:
        return text + " No installed package answered: pip install a strategy package with a memory model."
    if plan.suggestions:
        text += " What would: " + "; ".join(plan.suggestions) + "."
    return text


Ask = Callable[[Workload, Machine], list[Candidate]]


def suggestions(workload: Workload, machine: Machine, ask: Ask) -> list[str]:
    """Changes to the workload or machine under which some candidate fits, each with the first that does.

    Tried one at a time, each as far as it must go: activation checkpointing, smaller micro-batches,
    more GPUs (up to 64), NVMe space for offloading.
    """

    def first_fit(trial_workload: Workload, trial_machine: Machine) -> Candidate | None:
        fitting = [c for c in ask(trial_workload, trial_machine) if c.fits]
        return rank(fitting)[0] if fitting else None

    found = []
    if not workload.activation_checkpointing:
        trial = dataclasses.replace(workload, activation_checkpointing=True)
        if best := first_fit(trial, machine):
            found.append(f"activation checkpointing ({best.strategy} {settings_text(best)})")
    micro_batch = workload.micro_batch // 2
    while micro_batch >= 1:
        trial = dataclasses.replace(workload, micro_batch=micro_batch)
        if best := first_fit(trial, machine):
            found.append(f"micro-batch {micro_batch} ({best.strategy} {settings_text(best)})")
            break
        micro_batch //= 2
    if machine.gpu_memory_bytes > 0:
        gpus = max(1, machine.gpus) * 2
        while gpus <= 64:
            # More GPUs of the same kind; host memory grows with them only when they are on other nodes,
            # which the planner does not model, so it stays the node's.
            if best := first_fit(workload, dataclasses.replace(machine, gpus=gpus)):
                found.append(f"{gpus} GPUs of this kind ({best.strategy} {settings_text(best)})")
                break
            gpus *= 2
    if machine.nvme_bytes == 0:
        trial_machine = dataclasses.replace(machine, nvme_bytes=1 << 50)
        if best := first_fit(workload, trial_machine):
            found.append(
                f"NVMe offloading with at least {math.ceil(best.nvme_gib)} GiB free ({best.strategy} "
                f"{settings_text(best)}; pass --nvme GiB)"
            )
    return found


def settings_text(candidate: Candidate) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in candidate.settings.items()) or "defaults"


def plan(
    params: int | str | None = None,
    *,
    layers: int | None = None,
    hidden: int | None = None,
    vocabulary: int = DEFAULT_VOCABULARY,
    seq_len: int = 1024,
    micro_batch: int = 8,
    precision: str = "bf16-mixed",
    optimizer: str = "adam",
    activation_checkpointing: bool = False,
    gpus: int | None = None,
    gpu_memory_gib: float | None = None,
    host_memory_gib: float | None = None,
    nvme_gib: float = 0.0,
    registry: Any = None,
) -> Plan:
    """Rank every installed strategy's candidates for a model on this machine (or the one described).

    ``plan("13B")`` detects the GPUs and host memory; ``plan("13B", gpus=1, gpu_memory_gib=139,
    host_memory_gib=128)`` plans for another machine. ``plan(...).best_strategy()`` is a strategy object
    for ``Trainer(strategy=...)``.
    """
    given = locals()  # these options are Workload fields of the same names
    training = {name: given[name] for name in ("micro_batch", "precision", "optimizer", "activation_checkpointing")}
    workload = Workload.build(params, layers, hidden, vocabulary, sequence_length=seq_len, **training)
    machine = Machine.detect(
        gpus,
        int(gpu_memory_gib * GIB) if gpu_memory_gib is not None else None,
        int(host_memory_gib * GIB) if host_memory_gib is not None else None,
        int(nvme_gib * GIB),
    )
    return plan_for(workload, machine, registry)


def plan_for(workload: Workload, machine: Machine, registry: Any = None) -> Plan:
    if registry is None:
        registry = get_registry()
    problems: list[str] = []

    def ask(trial_workload: Workload, trial_machine: Machine) -> list[Candidate]:
        return collect_candidates(registry, trial_workload, trial_machine, problems)

    candidates = rank(ask(workload, machine))
    found = [] if any(c.fits for c in candidates) else suggestions(workload, machine, ask)
    return Plan(workload, machine, candidates, found, sorted(set(problems)))


def collect_candidates(registry: Any, workload: Workload, machine: Machine, problems: list[str]) -> list[Candidate]:
    """Every plugin's answer, keeping only names the registry can resolve (not clashing, not disabled)."""
    asked = plugins_of(registry).memory_plan_candidates(workload, machine)
    problems.extend(str(failure) for failure in asked.failures)
    return [c for answer in asked.answers for c in answer if c.strategy in registry]
