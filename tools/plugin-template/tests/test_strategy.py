"""The example parameter of {{class_name}} does what its docstring says; replace these tests with yours."""

import json

import pytest
from lightning_strategies.testing import run_script

from {{module}}.strategy import {{class_name}}

# Trains a few steps in one process and records, after each backward pass, whether every
# gradient is exactly representable in float16. DDP runs its communication hook even for a
# single process, so float16 communication shows in the gradients themselves.
GRADIENT_PROBE = """
import json, sys
import torch
import lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset
from {{module}}.strategy import {{class_name}}


class Probe(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(32, 1)
        self.float16_exact = []

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def on_after_backward(self):
        gradient = self.layer.weight.grad
        self.float16_exact.append(bool(torch.equal(gradient, gradient.half().float())))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


results = {}
for fp16 in (False, True):
    torch.manual_seed(0)
    model = Probe()
    trainer = pl.Trainer(
        strategy={{class_name}}(fp16_gradient_communication=fp16), accelerator="cpu", devices=1, max_steps=3,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(TensorDataset(torch.randn(12, 32)), batch_size=4))
    results[str(fp16)] = model.float16_exact
print(json.dumps(results))
"""


def test_fp16_gradient_communication_rounds_gradients_to_float16():
    # In a child process, so the process group that training creates ends with it.
    # run_script (core's test kit) fails with the tail of the child's output if it exits non-zero.
    result = run_script("-c", GRADIENT_PROBE, timeout=300)
    float16_exact = json.loads(result.stdout.strip().splitlines()[-1])
    assert float16_exact == {"False": [False, False, False], "True": [True, True, True]}


def test_fp16_gradient_communication_must_be_a_bool():
    with pytest.raises(TypeError, match="fp16_gradient_communication"):
        {{class_name}}(fp16_gradient_communication="yes")


def test_fp16_gradient_communication_refuses_a_second_hook():
    with pytest.raises(ValueError, match="not both"):
        {{class_name}}(fp16_gradient_communication=True, ddp_comm_hook=lambda state, bucket: None)
