"""A Lightning script as a user writes one, for the preemption trials: a small regression
model, ``ModelCheckpoint`` every 5 steps (``last.ckpt`` too), a loader Lightning can
resume mid-epoch (its ``state_dict``), costguard's callback, ``fit(ckpt_path="last")``.

``python lightning_trial.py OUT FINAL``: prints ``READY <step>`` then ``STEP <n>``; the
final weights go to FINAL."""

import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from costguard.integrations.lightning import PreemptionCallback


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 24), torch.nn.GELU(),
                                        torch.nn.Linear(24, 1))  # fmt: skip

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.l1_loss(self.body(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=3e-3)


class Shuffled:
    """Batches of 5 rows, shuffled per epoch by a generator seeded with it; its state is
    the epoch and the batches taken, so Lightning resumes it mid-epoch."""

    def __init__(self, rows: int) -> None:
        g = torch.Generator().manual_seed(9)
        self.x = torch.randn(rows, 6, generator=g)
        self.y = self.x.prod(1, keepdim=True)
        self.epoch, self.taken = -1, 0
        self.resume: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.x) // 5

    def __iter__(self) -> Any:
        epoch, start = self.resume or (self.epoch + 1, 0)
        self.resume = None
        if start >= len(self):
            epoch, start = epoch + 1, 0
        self.epoch = epoch
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(epoch))
        for i in range(start, len(self)):
            self.taken = i + 1
            rows = order[i * 5 : (i + 1) * 5]
            yield self.x[rows], self.y[rows]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "taken": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume = (state["epoch"], state["taken"])


class Show(pl.Callback):
    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        print(f"READY {trainer.global_step}", flush=True)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        print(f"STEP {trainer.global_step}", flush=True)
        time.sleep(0.1)


out, final = Path(sys.argv[1]), sys.argv[2]
pl.seed_everything(5, verbose=False)
model = Net()
saver = ModelCheckpoint(dirpath=out, every_n_train_steps=5, save_top_k=-1, save_last=True)
trainer = pl.Trainer(
    max_steps=36,
    accelerator="cpu",
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[saver, Show(), PreemptionCallback()],
)
trainer.fit(model, Shuffled(40), ckpt_path="last")
torch.save({k: v.clone() for k, v in model.state_dict().items()}, final)
