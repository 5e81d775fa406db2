"""A Lightning run for the --sync-dir tests: a small MLP, ``max_steps``, ``last.ckpt``
every 10 steps, resumed with ``ckpt_path="last"``.

Prints ``READY <step of last.ckpt>`` and ``STEP <n>``; writes the final weights to
``--final``. An epoch is :data:`BATCHES_PER_EPOCH` batches in a new order each epoch, so a
save on a notice lands mid-epoch, and a resume equals the uninterrupted run only if the
weights, the optimizer, the step count *and* the place in the epoch's data come back.
Lightning resumes a loader mid-epoch only through its ``state_dict``/``load_state_dict``
(a plain ``DataLoader`` starts the epoch over, with a warning): :class:`EpochBatches`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


BATCH_SIZE = 4
BATCHES_PER_EPOCH = 24


class EpochBatches:
    """The batches of ``data``, each epoch in the order a generator seeded with the epoch
    draws, resumable mid-epoch: Lightning stores :meth:`state_dict` in each checkpoint and
    calls :meth:`load_state_dict` before it iterates again.

    The state is the epoch and the batches handed out in it: Lightning knows the epoch's
    length (``__len__``), so it fetches no batch ahead of the one it trains on, and a
    checkpoint saved after a batch counts that batch.
    """

    def __init__(self, data: torch.utils.data.TensorDataset) -> None:
        self.data = data
        self.epoch = -1
        self.handed_out = 0
        self.resume: tuple[int, int] | None = None

    def __len__(self) -> int:
        return -(-len(self.data) // BATCH_SIZE)

    def __iter__(self) -> Iterator[list[torch.Tensor]]:
        epoch, start = self.resume if self.resume else (self.epoch + 1, 0)
        self.resume = None
        if start >= len(self):  # saved after the epoch's last batch
            epoch, start = epoch + 1, 0
        self.epoch, self.handed_out = epoch, start
        order = torch.randperm(len(self.data), generator=torch.Generator().manual_seed(epoch))
        for index in range(start, len(self)):
            self.handed_out = index + 1
            yield list(self.data[order[index * BATCH_SIZE : (index + 1) * BATCH_SIZE]])

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "taken": self.handed_out}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resume = (int(state["epoch"]), int(state["taken"]))


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
    parser.add_argument("--plain-loader", action="store_true")
    options = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH_SIZE * BATCHES_PER_EPOCH, 16, generator=generator)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    loader: Any = EpochBatches(data)
    if options.plain_loader:  # Lightning cannot resume it mid-epoch
        loader = torch.utils.data.DataLoader(data, batch_size=BATCH_SIZE, shuffle=True)
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
