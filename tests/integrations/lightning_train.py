"""A Lightning run for the --sync-dir tests: a small MLP, ``max_steps``, ``last.ckpt``
every 10 steps, resumed with ``ckpt_path="last"``.

Prints ``READY <step of last.ckpt>`` and ``STEP <n>``; writes the final weights to
``--final``. Each epoch is one batch (the same one), so a resume is exact whatever Lightning does
with a dataloader it cannot fast-forward: what the test checks is that the weights, the
optimizer and the step count come back.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)
        )

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class Progress(pl.Callback):
    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        print(f"STEP {trainer.global_step}", flush=True)
        time.sleep(self.sleep_s)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--final", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--callback", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0)
    options = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 16, generator=generator)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    model = Model()
    checkpoints = ModelCheckpoint(
        dirpath=options.out, every_n_train_steps=10, save_top_k=0, save_last=True
    )
    callbacks: list[pl.Callback] = [checkpoints, Progress(options.sleep)]
    if options.callback:
        from costguard.integrations.lightning import PreemptionCallback

        callbacks.append(PreemptionCallback())
    trainer = pl.Trainer(
        max_steps=options.steps,
        max_epochs=-1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        default_root_dir=options.out,
    )
    last = Path(options.out, "last.ckpt")
    found = torch.load(last, weights_only=False)["global_step"] if last.exists() else 0
    print(f"READY {found}", flush=True)
    trainer.fit(model, loader, ckpt_path="last")
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, options.final)
    print(f"DONE {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
