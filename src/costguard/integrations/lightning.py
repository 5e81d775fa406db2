"""Lightning: save ``last.ckpt`` at the next step boundary on a notice, then exit 75.

::

    from costguard.integrations.lightning import PreemptionCallback
    ckpt = ModelCheckpoint(dirpath="out", every_n_train_steps=100, save_last=True)
    trainer = Trainer(max_steps=1000, callbacks=[ckpt, PreemptionCallback()])
    trainer.fit(model, data, ckpt_path="last")

Run under ``costguard run --checkpoint URL --sync-dir out/``: the ``last.ckpt`` written
on the notice is committed to the store before ``costguard run`` exits, and put back in
``out/`` for ``ckpt_path="last"`` when the same command runs on a new machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from costguard.clouds import require
from costguard.integrations.notices import Watch, shared

_pl: Any = require("lightning.pytorch", "lightning")


class PreemptionCallback(_pl.Callback):
    """A Lightning ``Callback``: on a notice from ``costguard run`` the trainer saves
    ``last.ckpt`` (in the ``ModelCheckpoint``'s folder, where ``ckpt_path="last"`` looks)
    after the batch it is on, and the process exits 75. Without ``costguard run`` it does
    nothing."""

    def __init__(self) -> None:
        self._watch: Watch | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._watch = shared()  # signal handlers go in now, in the main thread

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._watch is None or self._watch.pending() is None:
            return
        path = last_path(trainer)
        trainer.save_checkpoint(str(path))
        if trainer.is_global_zero:
            self._watch.exit_preempted(trainer.global_step, checkpoint=str(path))


def last_path(trainer: Any) -> Path:
    """Where ``ckpt_path="last"`` will look: ``last.ckpt`` in the first
    ``ModelCheckpoint``'s folder (the trainer's root folder without one)."""
    for callback in trainer.checkpoint_callbacks:
        if getattr(callback, "dirpath", None):
            name = callback.CHECKPOINT_NAME_LAST + callback.FILE_EXTENSION
            return Path(callback.dirpath, name)
    return Path(trainer.default_root_dir, "last.ckpt")
