"""What is trained, as the planner sees it: a parameter count read from text, the GPT-style decoder shape
activations follow, the workload (tokens, precision, optimizer) and the bytes of its model states."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from lightning_strategies.planning.fitted import FITTED

ACTIVATION_BYTES_PER_TOKEN_WIDTH = int(FITTED["ACTIVATION_BYTES_PER_TOKEN_WIDTH"].value)
LOGITS_BYTES_PER_TOKEN_ENTRY = int(FITTED["LOGITS_BYTES_PER_TOKEN_ENTRY"].value)

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
