"""SpeedMonitor: what it logs in a real Trainer run, the FLOPs it counts for real transformers models, the peaks."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from lightning_strategies.speed import DENSE_16BIT_PEAKS, SpeedMonitor, flops_per_token, token_tensor

transformers = pytest.importorskip("transformers")

LENGTH = 32


def tiny_llama(tied: bool) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=tied,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


class LanguageModel(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_llama(tied=False)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.model(**batch, labels=batch["input_ids"]).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def batches(count: int, size: int = 4) -> DataLoader:
    """``count`` batches of ``size`` sequences of token ids, as a tokenizer's collate gives them."""
    generator = torch.Generator().manual_seed(0)
    return DataLoader([{"input_ids": torch.randint(0, 128, (size, LENGTH), generator=generator)} for _ in range(count)],
                      batch_size=None)  # fmt: skip


def metrics(folder: Path) -> list[dict[str, str]]:
    """The rows CSVLogger wrote under ``folder``."""
    with open(next(folder.rglob("metrics.csv"))) as written:
        return list(csv.DictReader(written))


def test_flops_per_token_counts_multiplying_parameters_and_attention() -> None:
    untied, tied = tiny_llama(tied=False), tiny_llama(tied=True)
    embedding = 128 * 64
    attention = 12 * 2 * 64 * LENGTH
    total = sum(parameter.numel() for parameter in untied.parameters())
    # The embedding table is looked up, not multiplied; the untied head is a parameter of its own.
    assert flops_per_token(untied, LENGTH) == 6 * (total - embedding) + attention
    # Tied: one table, used as a lookup and as the head's matrix product.
    assert sum(parameter.numel() for parameter in tied.parameters()) == total - embedding
    assert flops_per_token(tied, LENGTH) == flops_per_token(untied, LENGTH)


def test_a_model_without_a_transformers_config_counts_its_parameters_only() -> None:
    linear = torch.nn.Linear(8, 4)
    assert flops_per_token(linear, 100) == 6 * (8 * 4 + 4)


@pytest.mark.parametrize(
    ("batch", "numel"),
    [
        (torch.zeros(2, 5, dtype=torch.long), 10),
        ({"input_ids": torch.zeros(3, 4, dtype=torch.long), "attention_mask": torch.ones(3, 4)}, 12),
        ((torch.zeros(2, 3, dtype=torch.long), torch.zeros(2)), 6),
    ],
)
def test_token_ids_are_found_in_the_usual_batch_shapes(batch: object, numel: int) -> None:
    found = token_tensor(batch)
    assert found is not None and found.numel() == numel


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L40", 181e12),
        ("NVIDIA L4", 121e12),
    ],
)
def test_each_device_gets_its_dense_peak_not_the_sparse_one(name: str, peak: float) -> None:
    assert next(value for part, value in DENSE_16BIT_PEAKS if part in name) == peak


def test_a_trainer_run_logs_tokens_per_second_tflops_and_mfu_against_the_given_peak(tmp_path: Path) -> None:
    peak = 1e12  # a CPU has no peak in the table: the user's figure is what MFU is computed against
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=8, logger=CSVLogger(tmp_path), log_every_n_steps=4,
        callbacks=[SpeedMonitor(peak_flops=peak, window=4)], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    module = LanguageModel()
    trainer.fit(module, batches(8))
    rows = [row for row in metrics(tmp_path) if row["speed/mfu"]]
    assert [int(row["step"]) for row in rows] == [3, 7]  # every log_every_n_steps, once a window has two ends
    expected_flops = flops_per_token(module.model, LENGTH)
    for row in rows:
        tokens, tflops, mfu = (float(row[f"speed/{key}"]) for key in ("tokens_per_second", "tflops_per_gpu", "mfu"))
        assert tokens > 0
        assert tflops == pytest.approx(tokens * expected_flops / 1e12, rel=1e-5)  # one process: all its tokens
        assert mfu == pytest.approx(tflops * 1e12 / peak, rel=1e-5)


def test_without_a_peak_on_a_cpu_it_says_how_to_get_mfu_and_logs_the_rest(tmp_path: Path) -> None:
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=4, logger=CSVLogger(tmp_path), log_every_n_steps=2,
        callbacks=[SpeedMonitor(window=2)], enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    with pytest.warns(UserWarning, match=r"pass SpeedMonitor\(peak_flops=\.\.\.\)"):
        trainer.fit(LanguageModel(), batches(4))
    header = set(metrics(tmp_path)[0])
    assert "speed/tokens_per_second" in header and "speed/tflops_per_gpu" in header and "speed/mfu" not in header


@pytest.mark.parametrize(
    ("arguments", "message"),
    [({"peak_flops": 0}, "must be positive"), ({"window": 1}, "at least 2")],
)
def test_bad_settings_are_refused_with_what_they_mean(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SpeedMonitor(**arguments)
