"""Lightning: save ``last.ckpt`` at the next step boundary on a notice, then exit 75.

::

    from costguard.integrations.lightning import PreemptionCallback
    ckpt = ModelCheckpoint(dirpath="out", every_n_train_steps=100, save_last=True)
    trainer = Trainer(max_steps=1000, callbacks=[ckpt, PreemptionCallback()])
    trainer.fit(model, data, ckpt_path="last")

Run under ``costguard run --checkpoint URL --sync-dir out/``: the ``last.ckpt`` written
on the notice is committed to the store before ``costguard run`` exits, and put back in
``out/`` for ``ckpt_path="last"`` when the same command runs on a new machine. The
optimizer steps' pace, validation and saves apart, is recorded in the store's
``job/pace.json`` (:mod:`costguard.integrations.pace`) for ``estimate --from-run`` and
``jobs status``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from costguard.clouds import require
from costguard.integrations.notices import Watch, shared
from costguard.integrations.pace import TrainerPace
from costguard.logs import get_logger

_pl: Any = require("lightning.pytorch", "lightning")
logger = get_logger(__name__)


class PreemptionCallback(_pl.Callback):
    """A Lightning ``Callback``: on a notice from ``costguard run`` the trainer saves
    ``last.ckpt`` (in the ``ModelCheckpoint``'s folder, where ``ckpt_path="last"`` looks)
    after the batch it is on, and the process exits 75. Without ``costguard run`` it does
    nothing."""

    def __init__(self) -> None:
        self._watch: Watch | None = None
        self.pace = TrainerPace()
        self._stepped = -1
        #: When validation, or a checkpoint's save, started (the clock's time).
        self._validating: float | None = None
        self._saving: float | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._watch = shared()  # signal handlers go in now, in the main thread

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        accumulate = max(int(getattr(trainer, "accumulate_grad_batches", 1) or 1), 1)
        batches = trainer.num_training_batches
        total = trainer.max_steps if trainer.max_steps > 0 else trainer.estimated_stepping_batches
        self.pace.begin(
            rank0=bool(trainer.is_global_zero),
            total_steps=total,
            steps_per_epoch=batches // accumulate if batches != float("inf") else None,
        )
        self._stepped = trainer.global_step
        if trainer.is_global_zero and batches != float("inf"):
            plain = not_resumable(getattr(trainer.fit_loop, "_combined_loader", None))
            if plain:
                logger.warning(
                    "costguard: the training loader %s is not resumable mid-epoch (no "
                    "state_dict/load_state_dict): a run resumed after a notice starts that "
                    "epoch's data over, so it is not exact; give the loader those two methods",
                    plain,
                )

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._saved()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._saved()
        self._validating = self.pace.now()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._validating is not None and not trainer.sanity_checking:
            self.pace.stalled("evaluation", since=self._validating)
        self._validating = None

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        self._saving = self.pace.now()  # the file is written after this hook

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._saved()
        self.pace.publish()

    def _saved(self) -> None:
        """A save that started since the last hook has ended: its stall is counted."""
        if self._saving is not None:
            self.pace.stalled("save", since=self._saving)
            self._saving = None

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step != self._stepped:  # an optimizer step, not an accumulation
            self._stepped = trainer.global_step
            self.pace.step_end(trainer.global_step)
        if self._watch is None or self._watch.pending() is None:
            return
        path = last_path(trainer)
        trainer.save_checkpoint(str(path))
        if trainer.is_global_zero:
            self._watch.exit_preempted(trainer.global_step, checkpoint=str(path))


def not_resumable(combined: Any) -> str:
    """The type of the first training loader that Lightning cannot resume mid-epoch (no
    ``state_dict`` and ``load_state_dict``: Lightning's own test), or ""."""
    for loader in getattr(combined, "flattened", None) or ():
        if not (callable(getattr(loader, "state_dict", None))) or not callable(
            getattr(loader, "load_state_dict", None)
        ):
            return type(loader).__name__
    return ""


def last_path(trainer: Any) -> Path:
    """Where ``ckpt_path="last"`` will look: ``last.ckpt`` in the first
    ``ModelCheckpoint``'s folder (the trainer's root folder without one)."""
    for callback in trainer.checkpoint_callbacks:
        if getattr(callback, "dirpath", None):
            name = callback.CHECKPOINT_NAME_LAST + callback.FILE_EXTENSION
            return Path(callback.dirpath, name)
    return Path(trainer.default_root_dir, "last.ckpt")
