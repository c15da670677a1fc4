"""Trains a small transformer-style model through ``Trainer(strategy=NAME)`` on 2 CPU processes.

Run by the tests as a script, because Lightning launches the other process by re-running the
command line. Writes the trained weights (full state dict, rank 0) to --weights-out.
"""

import argparse
import json
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

WIDTH = 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class TinyTransformer(pl.LightningModule):
    def __init__(self, meta_init: bool = False, compile_blocks: bool = False, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.blocks: nn.ModuleList | None = None
        if not meta_init:
            self.build()

    def build(self) -> None:
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(WIDTH, 1)

    def configure_model(self) -> None:
        if self.blocks is not None:
            return
        with torch.device("meta"):  # materialized shard by shard by the strategy
            self.build()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x).float(), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x).float(), y), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)

    def on_fit_start(self) -> None:
        if self.hparams.compile_blocks:
            for block in self.blocks:
                block.compile(backend="aot_eager")  # inductor needs a GPU or a C++ toolchain per test run


def data(samples: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, WIDTH, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=False).tanh())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="fsdp")
    parser.add_argument("--strategy-kwargs", default="{}", help="JSON; builds FSDP2Strategy(**kwargs) if given")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--meta-init", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--resume")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--save")
    parser.add_argument("--weights-out")
    parser.add_argument("--result-out")
    args = parser.parse_args()

    pl.seed_everything(7, workers=True)
    strategy = args.strategy
    kwargs = json.loads(args.strategy_kwargs)
    if kwargs:
        from lightning.pytorch.strategies import StrategyRegistry

        strategy = StrategyRegistry.get(args.strategy, **kwargs)
    callbacks = []
    if args.checkpoint_dir:
        callbacks.append(ModelCheckpoint(dirpath=args.checkpoint_dir, every_n_train_steps=2, save_top_k=-1))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=strategy,
        precision=args.precision,
        max_steps=args.steps,
        accumulate_grad_batches=args.accumulate,
        gradient_clip_val=1.0,
        limit_val_batches=2,
        val_check_interval=args.steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=bool(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    model = TinyTransformer(meta_init=args.meta_init, compile_blocks=args.compile)
    loader = DataLoader(data(), batch_size=4, shuffle=False)
    trainer.fit(model, train_dataloaders=loader, val_dataloaders=loader, ckpt_path=args.resume)
    if args.save:
        trainer.save_checkpoint(args.save)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    result = {
        "strategy_class": type(trainer.strategy).__module__ + "." + type(trainer.strategy).__name__,
        "global_step": trainer.global_step,
        "train_loss": float(trainer.callback_metrics["train_loss"]),
        "val_loss": float(trainer.callback_metrics.get("val_loss", float("nan"))),
        "param_types": sorted({type(param).__name__ for param in model.parameters()}),
        "param_dtypes": sorted({str(param.dtype) for param in model.parameters()}),
        "world_size": trainer.world_size,
        "mesh_shape": list(trainer.strategy.device_mesh.shape),
    }
    if trainer.is_global_zero:
        if args.weights_out:
            torch.save(weights, args.weights_out)
        if args.result_out:
            Path(args.result_out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
