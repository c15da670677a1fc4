"""A Hugging Face Llama trained in float8 under ``fsdp`` on two CPU processes, converted by torchao in
configure_model as a user opts in: with bf16 gathers (``tensorwise``) and with float8 gathers (``all-gather``), each
uninterrupted and resumed from its checkpoint at the middle step. With float8 gathers, every training step checks
that the scales computed ahead are those of the weights as they are then, and that they are dropped after each
optimizer step. Afterwards the float8-gathered weights are multiplied by 8 and the model predicts (set-up runs
again): the scales it gathered with must be those of the changed weights, and Lightning must still see that the
model has no validation_step.

Last, ``fsdp_cpu_offload`` trains with float8 gathers for two steps: offloaded weights keep torchao's own scales.

Rank 0 writes {config: {"losses", "resumed_losses", "validation_step_overridden", "forward_pre_hooks" (after fit and
after predict), and with float8 gathers "scales_in_steps", "dropped_after_steps", "scales_current"}, "offloaded":
{"scales_in_steps", "forward_hook"}} as JSON to the path given. With ``fabric`` after the path, three steps through
Fabric with float8 gathers instead, {"scales_in_steps", "dropped_after_steps"}, checked after each forward and each
optimizer step; the optimizer is set up with the output layer alone and given the float8 weights after, by
``add_param_group`` (as Lightning's ``BaseFinetuning`` unfreezes a backbone).

    python float8.py OUT [fabric]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
import transformers
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader

from lightning_strategies.conformance.launching import end_process_group
from lightning_strategies_fsdp.float8 import HOOK_HANDLE

STEPS = 6


class Float8Llama(L.LightningModule):
    def __init__(self, all_gather: bool) -> None:
        super().__init__()
        self.all_gather = all_gather
        self.model: torch.nn.Module | None = None
        self.losses: list[float] = []
        self.scales_in_steps: list[bool] = []
        self.dropped_after_steps: list[bool] = []

    def configure_model(self) -> None:
        if self.model is not None:
            return
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = transformers.LlamaConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2,
        )  # fmt: skip
        self.model = transformers.AutoModelForCausalLM.from_config(config)
        float8 = Float8LinearConfig(enable_fsdp_float8_all_gather=self.all_gather)
        convert_to_float8_training(self.model.model, config=float8)  # the decoder layers; the head stays

    def training_step(self, batch: torch.Tensor, batch_index: int) -> torch.Tensor:
        if self.all_gather:
            self.scales_in_steps.append(scales_match_weights(self))
        loss = self.model(input_ids=batch, labels=batch).loss
        self.losses.append(float(loss))
        return loss

    def on_train_batch_end(self, outputs: object, batch: torch.Tensor, batch_index: int) -> None:
        if self.all_gather:
            self.dropped_after_steps.append(scales_dropped(self))

    def predict_step(self, batch: torch.Tensor, batch_index: int) -> torch.Tensor:
        return self.model(input_ids=batch).logits

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self) -> DataLoader:
        # One sequence, again and again: every batch alike, however the sampler shuffles and wherever a resume starts.
        return DataLoader((torch.arange(32) * 3 % 128).repeat(64, 1), batch_size=4)


def trainer(root: Path, steps: int, strategy: str = "fsdp") -> L.Trainer:
    return L.Trainer(
        strategy=strategy, accelerator="cpu", devices=2, max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
    )  # fmt: skip


def float8_linears(module: torch.nn.Module) -> list[torch.nn.Module]:
    from torchao.float8.float8_linear import Float8Linear

    return [submodule for submodule in module.modules() if isinstance(submodule, Float8Linear)]


def scales_match_weights(model: torch.nn.Module) -> bool:
    """Every float8-gathered weight holds a scale computed ahead, and it is that of the weight as it is now."""
    linears = float8_linears(model)
    target = torch.finfo(linears[0].config.cast_config_weight.target_dtype).max
    for linear in linears:
        precomputed = linear.weight._local_tensor._precomputed_scale  # to_local() wraps anew, unscaled
        expected = torch.tensor(target / float(linear.weight.full_tensor().abs().max()), dtype=torch.float32)
        if precomputed is None or not torch.allclose(precomputed, expected, rtol=1e-6):
            return False
    return True


def scales_dropped(model: torch.nn.Module) -> bool:
    """No float8-gathered weight holds a scale computed ahead."""
    return all(linear.weight._local_tensor._precomputed_scale is None for linear in float8_linears(model))


def scales_current(model: Float8Llama, fit: L.Trainer) -> bool:
    """Multiply every float8 weight by 8, predict, and compare each gathered scale with the changed weight's."""
    with torch.no_grad():
        for linear in float8_linears(model):
            linear.weight.mul_(8.0)
    fit.predict(model, predict_batches())
    return scales_match_weights(model)


def predict_batches() -> DataLoader:
    return DataLoader(torch.zeros(2, 8, dtype=torch.long), batch_size=2)


def fabric_steps() -> dict[str, list[bool]]:
    from lightning.fabric import Fabric

    fabric = Fabric(strategy="fsdp", accelerator="cpu", devices=2)
    fabric.launch()
    with fabric.init_module(empty_init=True):
        holder = Float8Llama(all_gather=True)
        holder.configure_model()
    model = fabric.setup_module(holder.model)
    head = list(model.lm_head.parameters())
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(head, lr=1e-2))
    optimizer.add_param_group({"params": [p for p in model.parameters() if all(p is not h for h in head)]})
    batch = (torch.arange(32) * 3 % 128).repeat(4, 1)
    steps: dict[str, list[bool]] = {"scales_in_steps": [], "dropped_after_steps": []}
    for _ in range(3):
        loss = model(input_ids=batch, labels=batch).loss
        steps["scales_in_steps"].append(scales_match_weights(model))
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        steps["dropped_after_steps"].append(scales_dropped(model))
    return steps


def main(out: Path) -> None:
    results: dict[str, dict] = {}
    for name, all_gather in (("tensorwise", False), ("all-gather", True)):
        root = out.parent / name
        L.seed_everything(0)
        uninterrupted, model = trainer(root, STEPS), Float8Llama(all_gather)
        uninterrupted.fit(model)
        results[name] = {"losses": model.losses}

        L.seed_everything(0)
        first_half, half = trainer(root, STEPS // 2), Float8Llama(all_gather)
        first_half.fit(half)
        first_half.save_checkpoint(root / "half.ckpt")
        second_half, resumed = trainer(root, STEPS), Float8Llama(all_gather)
        second_half.fit(resumed, ckpt_path=root / "half.ckpt")
        results[name]["resumed_losses"] = half.losses + resumed.losses
        hooks = len(model._forward_pre_hooks)
        if all_gather:
            results[name]["scales_in_steps"] = model.scales_in_steps
            results[name]["dropped_after_steps"] = model.dropped_after_steps
            results[name]["scales_current"] = scales_current(model, uninterrupted)
        else:
            uninterrupted.predict(model, predict_batches())
        # predict set the strategy up again
        results[name]["validation_step_overridden"] = is_overridden("validation_step", model)
        results[name]["forward_pre_hooks"] = [hooks, len(model._forward_pre_hooks)]

    L.seed_everything(0)
    offloaded, model = trainer(out.parent / "offloaded", 2, "fsdp_cpu_offload"), Float8Llama(all_gather=True)
    offloaded.fit(model)
    results["offloaded"] = {"scales_in_steps": model.scales_in_steps, "forward_hook": HOOK_HANDLE in model.__dict__}
    if torch.distributed.get_rank() == 0:
        out.write_text(json.dumps(results))


if __name__ == "__main__":
    if sys.argv[2:] == ["fabric"]:
        found = fabric_steps()
        if torch.distributed.get_rank() == 0:
            Path(sys.argv[1]).write_text(json.dumps(found))
    else:
        main(Path(sys.argv[1]))
    end_process_group()  # before exit, so that gloo's threads cannot abort it
