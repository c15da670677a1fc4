"""Hugging Face ``transformers`` models through a strategy name, as users write them: built in ``configure_model``
from a config or with ``from_pretrained``, optionally with a new PEFT LoRA adapter or a trained one loaded with
``PeftModel.from_pretrained``, trained, saved and exported back to a Hugging Face folder.

Run by every rank of one process group (``python -m lightning_strategies.conformance.hugging_face``, launched once;
the Trainer starts the other ranks). Several cases run one after another in the same processes, each with a new
Trainer, so one launch pays for the imports and the rendezvous. Rank 0 writes what it saw to ``results.json`` in
``--folder``; the checks against a model built eagerly by plain ``transformers`` in one process are
``check_results``, run by the caller. With ``--resume-from``, each case fits on from that checkpoint of any strategy
instead, and ``resumed_problems`` compares it with a reference run.

Models are tiny versions of each family (vocabulary 128, width 64, two layers): real ``transformers`` classes, with
their own initialisation, tied embeddings (GPT-2), key prefixes (BERT) and rotary buffers (Llama, Qwen, Mistral).
"""

from __future__ import annotations

import argparse
import json
import os
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from typing_extensions import override

from lightning_strategies.conformance.launching import end_process_group
from lightning_strategies.conformance.trainer_arguments import QUIET_TRAINER
from lightning_strategies.speed import SpeedMonitor, flops_per_token

__all__ = [
    "EVERY_CASE",
    "FAMILIES",
    "MODES",
    "Case",
    "HuggingFaceModule",
    "adapter_folder",
    "check_fabric_results",
    "check_results",
    "data",
    "eager_model",
    "export_problems",
    "initialisation_problems",
    "launch",
    "optimizer_for",
    "resumed_problems",
    "tiny_config",
    "write_adapter",
    "write_pretrained",
]

VOCABULARY = 128
# What the BERT classifier must reach on held-out sequences after its steps (chance: 0.5; transformers alone on one
# CPU process reaches 1.0 within 20 steps).
CLASSIFIER_ACCURACY = 0.8
LENGTH = 16
# The causal families and the config class each is built from; BERT is the sequence classifier of the ColossalAI
# strategy's seed example, loaded from a pre-training checkpoint as bert-base-uncased is.
CAUSAL = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "mistral": "MistralConfig",
    "gpt2": "GPT2Config",
}
FAMILIES = (*CAUSAL, "bert")
# "lora": a new adapter on a checkpoint (peft.get_peft_model); "adapter": a trained one loaded onto it
# (peft.PeftModel.from_pretrained), to go on training.
MODES = ("config", "pretrained", "lora", "adapter")
ADAPTED = ("lora", "adapter")


@dataclass(frozen=True)
class Case:
    family: str
    mode: str
    steps: int = 24

    @property
    def name(self) -> str:
        return f"{self.family}-{self.mode}"


# What a sharding strategy's CPU tier runs: every family from a config and from a checkpoint, LoRA on a decoder and
# on the classifier, and a trained adapter loaded to go on training.
EVERY_CASE = [
    *(Case(family, mode) for family in FAMILIES for mode in ("config", "pretrained")),
    Case("llama", "lora"),
    Case("bert", "lora"),
    Case("llama", "adapter"),
]


def tiny_config(family: str) -> Any:
    import transformers

    if family == "bert":
        return transformers.BertConfig(
            vocab_size=VOCABULARY, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )  # fmt: skip
    if family == "gpt2":
        return transformers.GPT2Config(
            vocab_size=VOCABULARY, n_embd=64, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0,
        )  # fmt: skip
    return getattr(transformers, CAUSAL[family])(
        vocab_size=VOCABULARY, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, head_dim=16,
    )  # fmt: skip


def write_pretrained(folder: Path, family: str, seed: int = 7, steps: int = 16) -> Path:
    """A checkpoint of ``family`` saved with ``save_pretrained`` into ``folder/family``: ``steps`` steps into
    learning the family's task (``data``), so that what reads it starts from weights no initialisation draws and
    features a LoRA adapter can build on. BERT's is a pre-training checkpoint (``bert.*`` and ``cls.*`` weights),
    as bert-base-uncased is, its encoder trained through a sequence classifier."""
    import transformers

    target = folder / family
    if (target / "config.json").is_file():
        return target
    torch.manual_seed(seed)
    model: Any
    if family == "bert":
        model = transformers.BertForSequenceClassification(tiny_config("bert"))
    else:
        model = transformers.AutoModelForCausalLM.from_config(tiny_config(family))
    _train_briefly(model, family, seed, steps, learning_rate=1e-3)
    if family == "bert":
        classifier = model
        model = transformers.BertForPreTraining(tiny_config("bert"))
        model.bert.load_state_dict(classifier.bert.state_dict())
    model.save_pretrained(target)
    return target


def write_adapter(folder: Path, family: str, seed: int = 11, steps: int = 8) -> Path:
    """A LoRA adapter on ``write_pretrained``'s checkpoint of a causal ``family``, with a trained copy of the output
    layer beside it (``modules_to_save``), ``steps`` steps into the family's task, saved with ``save_pretrained``
    beside the checkpoint (``adapter_folder``): what a user goes on training."""
    import peft
    import transformers

    if family not in CAUSAL:
        raise ValueError(f"write_adapter trains on a causal family's task ({', '.join(CAUSAL)}), not {family!r}")
    target = adapter_folder(folder, family)
    if (target / "adapter_config.json").is_file():
        return target
    torch.manual_seed(seed)
    base = transformers.AutoModelForCausalLM.from_pretrained(write_pretrained(folder, family))
    settings = peft.LoraConfig(task_type="CAUSAL_LM", r=8, lora_alpha=16, target_modules="all-linear",
                               modules_to_save=["lm_head"])  # fmt: skip
    model = peft.get_peft_model(base, settings)
    _train_briefly(model, family, seed, steps, learning_rate=1e-2)
    model.save_pretrained(str(target))
    return target


def _train_briefly(model: Any, family: str, seed: int, steps: int, learning_rate: float) -> None:
    """``steps`` steps of AdamW on the family's task (``data`` drawn from ``seed + 1``), eight sequences a step, on
    the parameters that train."""
    optimizer = torch.optim.AdamW([parameter for parameter in model.parameters() if parameter.requires_grad],
                                  lr=learning_rate)  # fmt: skip
    batches = data(family, 8 * steps, seed=seed + 1).tensors
    for step in range(steps):
        batch = [tensor[8 * step : 8 * step + 8] for tensor in batches]
        labels = batch[1] if family == "bert" else batch[0]
        model(input_ids=batch[0], labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def adapter_folder(pretrained: Path, family: str) -> Path:
    """Where ``write_adapter`` saves the adapter of ``family``, beside ``write_pretrained``'s checkpoints."""
    return pretrained / f"{family}-adapter"


def data(family: str, count: int, seed: int) -> TensorDataset:
    """Counting sequences for the causal families (each token the previous plus one); for BERT, sequences of words
    from the lower or the upper half of the vocabulary, labelled by the half: both learnable in a few steps."""
    generator = torch.Generator().manual_seed(seed)
    if family != "bert":
        starts = torch.randint(0, VOCABULARY, (count, 1), generator=generator)
        return TensorDataset((starts + torch.arange(LENGTH)) % VOCABULARY)
    labels = torch.randint(0, 2, (count,), generator=generator)
    words = torch.randint(3, VOCABULARY // 2, (count, LENGTH), generator=generator) + labels[:, None] * (
        VOCABULARY // 2 - 3
    )
    words[:, 0] = 2  # the classifier reads this first position
    return TensorDataset(words, labels)


class TransformersModule(LightningModule):
    """A ``transformers`` model built as the case says (``build``), trained with AdamW or, for Gemini, HybridAdam."""

    def __init__(
        self, case: Case, pretrained: str | Path | None, learning_rate: float = 1e-3, optimizer: str = "adamw"
    ) -> None:
        super().__init__()
        self.case = case
        self.pretrained = pretrained
        self.learning_rate = learning_rate
        self.optimizer_name = optimizer
        self.model: Any = None
        self.losses: list[float] = []

    def build(self) -> None:
        if self.model is not None:
            return
        import transformers

        family, mode = self.case.family, self.case.mode
        model: Any
        if family == "bert":
            if mode == "config":
                model = transformers.BertForSequenceClassification(tiny_config("bert"))
            else:  # the seed example: a classifier from a pre-training checkpoint, its head initialised afresh
                model = transformers.BertForSequenceClassification.from_pretrained(str(self.pretrained), num_labels=2)
        elif mode == "config":
            # Both ways users build from a config: the class itself and the Auto factory.
            config = tiny_config(family)
            model = (
                transformers.LlamaForCausalLM(config)
                if family == "llama"
                else transformers.AutoModelForCausalLM.from_config(config)
            )
        else:
            model = transformers.AutoModelForCausalLM.from_pretrained(str(self.pretrained))
        if mode == "lora":
            import peft

            task = "SEQ_CLS" if family == "bert" else "CAUSAL_LM"  # a classifier's new head trains beside the adapter
            settings = peft.LoraConfig(task_type=task, r=8, lora_alpha=16, target_modules="all-linear")
            model = peft.get_peft_model(model, settings)
        elif mode == "adapter":
            import peft

            adapter = adapter_folder(Path(str(self.pretrained)).parent, family)
            model = peft.PeftModel.from_pretrained(model, adapter, is_trainable=True)
        self.model = model

    @override
    def forward(self, batch: list[torch.Tensor]) -> Any:
        if self.case.family == "bert":
            return self.model(input_ids=batch[0], labels=batch[1] if len(batch) > 1 else None)
        return self.model(input_ids=batch[0], labels=batch[0])

    @override
    def training_step(self, batch: list[torch.Tensor], batch_index: int) -> torch.Tensor:
        loss = self(batch).loss
        self.losses.append(float(loss.detach()))
        return loss

    @override
    def predict_step(self, batch: list[torch.Tensor], batch_index: int) -> torch.Tensor:
        return self(batch).logits.float().cpu()

    # Saved while fitting (a ZeRO-3 model set up for predict has no engine to save with): the weights as set up,
    # before any step (initialised from a config, or read from a checkpoint), and as trained.
    @override
    def on_train_start(self) -> None:
        self.trainer.save_checkpoint(Path(self.trainer.default_root_dir) / "initial.ckpt")

    @override
    def on_train_end(self) -> None:
        self.trainer.save_checkpoint(Path(self.trainer.default_root_dir) / "last.ckpt")

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return _make_optimizer(self.optimizer_name, self, self.learning_rate)

    @override
    def train_dataloader(self) -> DataLoader:
        dataset = data(self.case.family, 256, seed=0)
        # Each rank its own part of the data; the Trainer's distributed sampler is off for predict (below).
        sampler: DistributedSampler = DistributedSampler(
            dataset, self.trainer.world_size, self.trainer.global_rank, shuffle=False
        )
        return DataLoader(dataset, batch_size=8, sampler=sampler)

    @override
    def predict_dataloader(self) -> DataLoader:
        return DataLoader(data(self.case.family, 16, seed=1), batch_size=16)  # every rank the same batch


class HuggingFaceModule(TransformersModule):
    """The model built in ``configure_model``, as Lightning 2 asks."""

    @override
    def configure_model(self) -> None:
        self.build()


class ResumedModule(HuggingFaceModule):
    """Records the step a fit resumed at, in place of the checkpoints a fit from the start saves."""

    resumed_at: int | None = None

    @override
    def on_train_start(self) -> None:
        self.resumed_at = self.trainer.global_step

    @override
    def on_train_end(self) -> None:
        pass


def _make_optimizer(name: str, model: torch.nn.Module, learning_rate: float) -> torch.optim.Optimizer:
    """The optimizer ``name`` (``optimizer_for``) over the trainable parameters of ``model``."""
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    if name == "hybrid":  # the one optimizer family Gemini steps
        from colossalai.nn.optimizer import HybridAdam

        return HybridAdam(trainable, lr=learning_rate)
    if name == "cpu_adam":  # DeepSpeed's for an optimizer offloaded to the host (it refuses others)
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(trainable, lr=learning_rate)
    return torch.optim.AdamW(trainable, lr=learning_rate)


def optimizer_for(strategy: str) -> str:
    """What each name trains with: Gemini steps HybridAdam only, DeepSpeed's host offload its CPU Adam."""
    if strategy.startswith("colossalai"):
        return "hybrid"
    if strategy.startswith("deepspeed") and "offload" in strategy:
        return "cpu_adam"
    return "adamw"


class SeedExampleModule(TransformersModule):
    """The ColossalAI strategy's API page as written: the model built in ``configure_sharded_model``, the hook
    Lightning 2.6 still calls (with a deprecation warning) where ``configure_model`` is not overridden."""

    @override
    def configure_sharded_model(self) -> None:
        self.build()


def run(
    case: Case, strategy: str, accelerator: str, devices: int, precision: Any, folder: Path, hook: str
) -> dict[str, Any]:
    """Predict, fit, predict again, save and export one case; what rank 0 saw."""
    from lightning_strategies import hugging_face

    seed_everything(0, verbose=False)
    pretrained = _pretrained_folder(case, folder)
    module_class = SeedExampleModule if hook == "configure_sharded_model" else HuggingFaceModule
    # Adapters of rank 8 on a few projections move the model slowly: they get the larger step LoRA recipes use.
    module = module_class(
        case, pretrained, learning_rate=1e-2 if case.mode in ADAPTED else 1e-3,
        optimizer=optimizer_for(strategy),
    )  # fmt: skip
    speed = SpeedMonitor(peak_flops=1e12)  # counts the model's FLOPs as the strategy holds it, sharded or not
    trainer = _case_trainer(case, strategy, accelerator, devices, precision, folder, callbacks=[speed])
    before: Any = trainer.predict(module)
    trainer.fit(module)
    after: Any = trainer.predict(module)
    trainer.strategy.barrier()
    result: dict[str, Any] = {"case": asdict(case), "losses": module.losses, "flops_per_token": speed.flops_per_token}
    if trainer.is_global_zero:
        torch.save({"before": before[0], "after": after[0]}, folder / case.name / "logits.pt")
        trainable = [name for name, parameter in module.named_parameters() if parameter.requires_grad]
        # A LoRA model trains its adapters (and a classifier's new head, which PEFT copies under modules_to_save).
        result["trained_beside_adapters"] = [
            name for name in trainable if not ("lora_" in name or "modules_to_save" in name)
        ]
        for stage in ("initial", "last"):
            hugging_face.export(folder / case.name / f"{stage}.ckpt", folder / case.name / f"{stage}-exported")
    trainer.strategy.barrier()
    return result


def run_resumed(
    case: Case, strategy: str, accelerator: str, devices: int, precision: Any, folder: Path, checkpoint: str
) -> dict[str, Any]:
    """Fit on from ``checkpoint`` (saved by any strategy) up to ``case.steps``, by ``ckpt_path`` alone; the step it
    resumed at and the losses after it, as rank 0 saw them."""
    seed_everything(0, verbose=False)
    module = ResumedModule(case, _pretrained_folder(case, folder), optimizer=optimizer_for(strategy))
    trainer = _case_trainer(case, strategy, accelerator, devices, precision, folder)
    trainer.fit(module, ckpt_path=checkpoint)
    return {"case": asdict(case), "losses": module.losses, "resumed_at": module.resumed_at}


def _pretrained_folder(case: Case, folder: Path) -> Path | None:
    """Where ``write_pretrained`` put the case's family, for the cases that start from pretrained weights."""
    return folder / "pretrained" / case.family if case.mode != "config" else None


def _case_trainer(
    case: Case, strategy: str, accelerator: str, devices: int, precision: Any, folder: Path, **extra: Any
) -> Trainer:
    """The Trainer a case fits with, ``case.steps`` long, in its own folder."""
    return Trainer(
        strategy=strategy, accelerator=accelerator, devices=devices, precision=precision, max_steps=case.steps,
        use_distributed_sampler=False, default_root_dir=folder / case.name, **QUIET_TRAINER, **extra,
    )  # fmt: skip


def run_fabric(
    case: Case, strategy: str, accelerator: str, devices: int, precision: Any, folder: Path
) -> dict[str, Any]:
    """One case written for Fabric: the model loaded as plain ``transformers`` does, set up, trained, saved with
    ``fabric.save`` and exported from that checkpoint; what rank 0 saw."""
    from lightning.fabric import Fabric

    from lightning_strategies import hugging_face

    fabric = Fabric(strategy=strategy, accelerator=accelerator, devices=devices, precision=precision)
    fabric.launch()
    fabric.seed_everything(0)
    pretrained = _pretrained_folder(case, folder)
    model = eager_model(case.family, pretrained).train()
    model, optimizer = fabric.setup(model, _make_optimizer(optimizer_for(strategy), model, learning_rate=1e-3))
    sequences = data(case.family, 8 * case.steps, seed=2 + fabric.global_rank).tensors[0]
    losses: list[float] = []
    for step in range(case.steps):
        batch = sequences[8 * step : 8 * step + 8].to(fabric.device)
        loss = model(input_ids=batch, labels=batch).loss
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    with torch.no_grad():  # every rank runs the forward: a sharded model gathers its weights in it
        after = model(input_ids=data(case.family, 16, seed=1).tensors[0].to(fabric.device)).logits.float().cpu()
    run_folder = folder / case.name
    run_folder.mkdir(parents=True, exist_ok=True)
    # A state key with a dot, as users write them: export must find the model under it all the same.
    fabric.save(run_folder / "fabric.ckpt", {"language.model": model, "optimizer": optimizer, "step": case.steps})
    fabric.barrier()
    if fabric.global_rank == 0:
        torch.save({"after": after}, run_folder / "logits.pt")
        hugging_face.export(run_folder / "fabric.ckpt", run_folder / "last-exported")
    fabric.barrier()
    return {"case": asdict(case), "losses": losses}


def launch(
    strategy: str,
    folder: Path,
    cases: list[Case],
    accelerator: str = "cpu",
    devices: int = 2,
    precision: str = "32-true",
    hook: str = "configure_model",
    face: str = "trainer",
    resume_from: Path | None = None,
    **options: Any,
) -> Path:
    """Write the pretrained checkpoints ``cases`` need into ``folder``, then run every case in one launch of this
    module (whose Trainer starts the other ranks); ``options`` go to ``testing.run_script`` (``env``, ``unset``).
    With ``resume_from``, each case fits on from that checkpoint instead (``run_resumed``). Returns ``folder``, for
    ``check_results`` or ``resumed_problems``."""
    from lightning_strategies.testing import run_script

    for family in sorted({case.family for case in cases if case.mode != "config"}):
        write_pretrained(folder / "pretrained", family)
    for family in sorted({case.family for case in cases if case.mode == "adapter"}):
        write_adapter(folder / "pretrained", family)
    run_script(
        "-m", __name__, "--strategy", strategy, "--folder", folder, "--cases", ",".join(case.name for case in cases),
        "--accelerator", accelerator, "--devices", str(devices), "--precision", precision, "--hook", hook,
        "--face", face, "--steps", ",".join(str(case.steps) for case in cases),
        *(("--resume-from", resume_from) if resume_from else ()), timeout=1200, **options,
    )  # fmt: skip
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_strategies.conformance.hugging_face")
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--cases", required=True, help="family-mode names, comma separated (llama-pretrained,...)")
    parser.add_argument("--folder", required=True, help="holds pretrained/<family>; each case writes <case>/ here")
    parser.add_argument("--hook", choices=("configure_model", "configure_sharded_model"), default="configure_model")
    parser.add_argument("--face", choices=("trainer", "fabric"), default="trainer")
    parser.add_argument("--steps", help=f"each case's training steps, comma separated (default: {Case.steps} each)")
    parser.add_argument("--resume-from", help="a checkpoint every case fits on from (ckpt_path), up to its steps")
    arguments = parser.parse_args(argv)
    if arguments.resume_from and arguments.face == "fabric":
        parser.error("--resume-from resumes through the Trainer's fit(ckpt_path=...): it takes --face trainer")
    folder = Path(arguments.folder)
    names = arguments.cases.split(",")
    steps = arguments.steps.split(",") if arguments.steps else [str(Case.steps)] * len(names)
    if len(steps) != len(names):
        parser.error(f"--steps gives {len(steps)} step counts for {len(names)} cases: give one per case")
    results: list[dict[str, Any]] = []
    for name, count in zip(names, steps, strict=True):
        family, mode = name.rsplit("-", 1)
        case = Case(family, mode, int(count))
        try:
            common = (case, arguments.strategy, arguments.accelerator, arguments.devices, arguments.precision, folder)
            if arguments.resume_from:
                results.append(run_resumed(*common, arguments.resume_from))
            elif arguments.face == "fabric":
                results.append(run_fabric(*common))
            else:
                results.append(run(*common, arguments.hook))
        except Exception as error:
            # The other ranks wait in a collective of this case: the run ends here (the strategy's failure
            # report stops them), with the cases done so far and this one's traceback on record.
            results.append({"case": asdict(case), "error": f"{type(error).__name__}: {error}",
                            "traceback": traceback.format_exc()})  # fmt: skip
            raise
        finally:
            if int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))) == 0:
                (folder / "results.json").write_text(json.dumps(results, indent=1))
    end_process_group()  # before exit, so that gloo's threads cannot abort a run that passed
    return 0


# -- checks, in the caller's process against plain transformers ---------------------------------------------------


def eager_model(family: str, folder: Path | None = None, seed: int = 0) -> Any:
    """The model plain ``transformers`` builds in one process: from ``folder`` (a saved one), else from the config."""
    import transformers

    if family == "bert":
        if folder is None:
            torch.manual_seed(seed)
            return transformers.BertForSequenceClassification(tiny_config("bert")).eval()
        return transformers.AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2).eval()
    if folder is None:
        torch.manual_seed(seed)
        return transformers.AutoModelForCausalLM.from_config(tiny_config(family)).eval()
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def logits_of(model: Any, family: str) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=data(family, 16, seed=1).tensors[0]).logits.float()


def initialisation_problems(initial: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> list[str]:
    """Where weights set up from a config do not look like those plain ``transformers`` draws: every tensor of the
    same size, constants (norms, biases, rotary and position buffers) equal, random ones of the same spread."""
    problems = []
    for name, expected in reference.items():
        value = initial.get(name)
        if value is None:
            problems.append(f"{name} missing")
        elif value.shape != expected.shape:
            problems.append(f"{name}: shape {list(value.shape)}, expected {list(expected.shape)}")
        elif expected.numel() < 64 or expected.float().std() == 0:
            if not torch.equal(value.float(), expected.float()):
                problems.append(f"{name}: differs from the constant transformers sets")
        elif not 0.75 < value.float().std() / expected.float().std() < 1.33:
            problems.append(f"{name}: std {value.float().std():.4f}, transformers draws {expected.float().std():.4f}")
    return problems


def check_results(
    folder: Path, cases: list[Case], atol: float = 1e-4, rtol: float = 0.0, logits_rtol: float = 0.0
) -> dict[str, list[str]]:
    """Each case's failures (empty when it passed):

    - as set up, before any step, the weights are those of plain ``transformers``: drawn alike from a config (same
      constants, same spreads), read exactly from a checkpoint (a new head, such as BERT's classifier, drawn alike);
      the predictions of a checkpoint's model are those of ``transformers`` loading the same folder;
    - training lowers the loss, and a LoRA case trains only its adapters;
    - the exported folder loads with ``from_pretrained`` and predicts what the trained model predicted;
    - ``SpeedMonitor`` counts the FLOPs of the whole model however the strategy shards it (Trainer runs).

    ``atol`` bounds the predictions' differences, plus ``logits_rtol`` of the largest prediction (a 16-bit run errs in
    proportion to the sizes it multiplies, which grow as an output layer trains); ``rtol`` bounds the
    weights read from a checkpoint (0: exactly; a strategy whose master weights are made from 16-bit copies,
    DeepSpeed's in bf16, rounds them to 2**-8, Gemini's in fp16 to 2**-11 and the smallest to fp16's subnormal step).
    """
    report: dict[str, list[str]] = {}
    for case, result, problems in _cases_that_ran(folder, cases, report):
        losses = result["losses"]
        logits = torch.load(folder / case.name / "logits.pt", weights_only=True)
        pretrained = _pretrained_folder(case, folder)
        # Rounded to a 16-bit format where rtol is given: fp16's subnormal step bounds the smallest weights.
        subnormal = 2**-24 if rtol else 0.0
        if case.mode == "adapter":  # as set up, the adapter is the one loaded
            initial_adapter = _adapter_weights(folder / case.name / "initial-exported")
            for name, value in _adapter_weights(adapter_folder(folder / "pretrained", case.family)).items():
                if name not in initial_adapter:
                    problems.append(f"{name} of the loaded adapter is missing from the set-up model's export")
                elif not torch.allclose(initial_adapter[name], value, rtol=rtol, atol=subnormal):
                    difference = (initial_adapter[name] - value).abs().max()
                    problems.append(f"{name} differs from the loaded adapter's by {difference:.2e}")
        elif case.mode != "lora":
            initial = eager_model(case.family, folder / case.name / "initial-exported").state_dict()
            reference = eager_model(case.family, pretrained).state_dict()
            if pretrained is None:
                problems += initialisation_problems(initial, reference)
            else:
                drawn = {name for name in reference if case.family == "bert" and name.startswith("classifier.")}
                problems += [
                    f"{name} differs from the checkpoint's by {(initial[name] - reference[name]).abs().max():.2e}"
                    for name in reference
                    if name not in drawn
                    and not torch.allclose(initial[name], reference[name], rtol=rtol, atol=subnormal)
                ]
                problems += initialisation_problems(
                    {name: initial[name] for name in drawn}, {name: reference[name] for name in drawn}
                )
        if pretrained is not None and case.family != "bert":
            reference_logits = logits_of(_eager_as_set_up(case, folder), case.family)
            if not _predictions_close(logits["before"], reference_logits, atol, logits_rtol):
                problems.append(f"predictions before training differ from transformers' by "
                                f"{_difference(logits['before'], reference_logits)}")  # fmt: skip
        problems += _learning_problems(losses)
        if case.family == "bert":  # the classifier answers held-out sequences, where chance is one in two
            labels = data("bert", 16, seed=1).tensors[1]
            accuracy = (logits["after"].argmax(-1) == labels).float().mean().item()
            if accuracy < CLASSIFIER_ACCURACY:
                problems.append(f"classifier accuracy {accuracy:.2f} after training, below {CLASSIFIER_ACCURACY}")
        if case.mode in ADAPTED and result["trained_beside_adapters"]:
            problems.append(f"LoRA trains more than its adapters: {result['trained_beside_adapters'][:3]}")
        problems += export_problems(folder, case, logits["after"], atol, logits_rtol)
        problems += _flops_problems(case, result.get("flops_per_token"))
    return report


def _flops_problems(case: Case, counted: int | None) -> list[str]:
    """The FLOPs SpeedMonitor counted in the strategy's model against those of the model built eagerly (a LoRA
    model has adapters besides: not compared)."""
    if case.mode in ADAPTED or counted is None:
        return []
    expected = flops_per_token(eager_model(case.family), LENGTH)
    return [] if counted == expected else [f"SpeedMonitor counted {counted} FLOPs per token, not {expected}"]


def check_fabric_results(folder: Path, cases: list[Case], atol: float = 1e-4) -> dict[str, list[str]]:
    """Each Fabric case's failures (``run_fabric``): training lowers the loss, and the folder exported from
    ``fabric.save``'s checkpoint loads with ``from_pretrained`` and predicts what the trained model predicted."""
    report: dict[str, list[str]] = {}
    for case, result, problems in _cases_that_ran(folder, cases, report):
        losses = result["losses"]
        problems += _learning_problems(losses)
        after = torch.load(folder / case.name / "logits.pt", weights_only=True)["after"]
        problems += export_problems(folder, case, after, atol)
    return report


def _cases_that_ran(
    folder: Path, cases: list[Case], report: dict[str, list[str]]
) -> Iterator[tuple[Case, dict[str, Any], list[str]]]:
    """Each case with its result and the list its problems go to in ``report``; a case that did not run is reported
    as such and skipped."""
    results = {result["case"]["family"] + "-" + result["case"]["mode"]: result for result in _read(folder)}
    for case in cases:
        result = results.get(case.name)
        problems = report.setdefault(case.name, [])
        if result is None or "error" in result:
            problems.append(f"did not run: {(result and result.get('traceback')) or 'no result'}")
            continue
        yield case, result, problems


def _eager_as_set_up(case: Case, folder: Path) -> Any:
    """The model a case with pretrained weights starts from, built by plain ``transformers`` (and PEFT)."""
    model = eager_model(case.family, _pretrained_folder(case, folder))
    if case.mode != "adapter":
        return model
    import peft

    return peft.PeftModel.from_pretrained(model, adapter_folder(folder / "pretrained", case.family)).eval()


def _adapter_weights(adapter_folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(adapter_folder / "adapter_model.safetensors")


def _learning_problems(losses: list[float]) -> list[str]:
    if min(losses[-4:]) < losses[0] - 0.1:
        return []
    return [f"did not learn: loss {losses[0]:.4f} then {losses[-4:]}"]


def export_problems(folder: Path, case: Case, trained: torch.Tensor, atol: float, rtol: float = 0.0) -> list[str]:
    """What is wrong (nothing: empty) with the case's exported folder ``<folder>/<case>/last-exported``: it must predict
    ``trained``, the trained model's predictions, within ``atol`` plus ``rtol`` of the largest of them."""
    exported_folder = folder / case.name / "last-exported"
    pretrained = _pretrained_folder(case, folder)
    if case.mode in ADAPTED:  # the adapter alone, loaded onto the model it was trained on
        import peft

        exported_model = peft.PeftModel.from_pretrained(eager_model(case.family, pretrained), exported_folder)
    else:
        exported_model = eager_model(case.family, exported_folder)
    exported = logits_of(exported_model.eval(), case.family)
    if _predictions_close(exported, trained, atol, rtol):
        return []
    return [f"the exported model predicts {_difference(exported, trained)} away from the trained one"]


def _predictions_close(found: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> bool:
    return bool((found - expected).abs().max() <= atol + rtol * expected.abs().max())


def _difference(found: torch.Tensor, expected: torch.Tensor) -> str:
    return f"{(found - expected).abs().max().item():.2e} (the largest prediction {expected.abs().max().item():.3g})"


def resumed_problems(reference: Path, resumed: Path, case: Case, saved_step: int, rtol: float = 1e-5) -> list[str]:
    """What is wrong with a run of ``case`` that fit on from a checkpoint saved at ``saved_step`` (the folder of
    ``launch(resume_from=...)``): it must start at that step and follow the losses of the reference run of ``case``
    (another launch's folder: a run from the start, or one resumed from the same checkpoint) within ``rtol``."""
    found = {}
    for label, folder in (("reference", reference), ("resumed", resumed)):
        runs = [run for run in _read(folder) if Case(**run["case"]) == case]
        if not runs or "error" in runs[0]:
            return [f"the {label} run of {case.name} did not finish: {runs[0]['error'] if runs else 'no result'}"]
        found[label] = runs[0]
    if found["resumed"]["resumed_at"] != saved_step:
        return [f"resumed at step {found['resumed']['resumed_at']}, not at the saved step {saved_step}"]
    reference_start = found["reference"].get("resumed_at") or 0
    expected, seen = found["reference"]["losses"][saved_step - reference_start :], found["resumed"]["losses"]
    if len(seen) != len(expected):
        return [f"{len(seen)} steps after resuming where the reference run took {len(expected)}"]
    differences = [abs(a - b) / abs(a) for a, b in zip(seen, expected, strict=True)]
    if max(differences, default=0.0) > rtol:
        return [f"losses after resuming {seen} left the reference run's {expected} (up to {max(differences):.2g})"]
    return []


def _read(folder: Path) -> list[dict[str, Any]]:
    path = folder / "results.json"
    return json.loads(path.read_text()) if path.is_file() else []


if __name__ == "__main__":
    raise SystemExit(main())
