"""Hugging Face ``Trainer``: save at the next step boundary on a notice, then exit 75.

::

    from costguard.integrations.transformers import PreemptionCallback
    trainer = Trainer(..., callbacks=[PreemptionCallback()])
    trainer.train(resume_from_checkpoint=get_last_checkpoint("out") or None)

Run under ``costguard run --checkpoint URL --sync-dir out/``: the checkpoint the Trainer
writes on the notice (``out/checkpoint-N/``) is committed to the store before ``costguard
run`` exits, and put back in ``out/`` when the same command runs on a new machine. The
steps' pace, evaluations and saves apart, is recorded in the store's ``job/pace.json``
(:mod:`costguard.integrations.pace`) for ``estimate --from-run`` and ``jobs status``.
"""

from __future__ import annotations

from typing import Any

from costguard.clouds import require
from costguard.integrations.notices import Watch, shared
from costguard.integrations.pace import TrainerPace

_TrainerCallback: Any = require("transformers", "transformers").TrainerCallback


class PreemptionCallback(_TrainerCallback):
    """A ``TrainerCallback``: on a notice from ``costguard run`` the Trainer saves a
    checkpoint at the next step boundary, and the process exits 75. Without ``costguard
    run`` it does nothing."""

    def __init__(self) -> None:
        self._watch: Watch | None = None
        self._saving = False
        self.pace = TrainerPace()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._watch = shared()  # signal handlers go in now, in the main thread
        self.pace.begin(
            rank0=bool(state.is_world_process_zero),
            total_steps=state.max_steps,
            steps_per_epoch=_steps_per_epoch(kwargs.get("train_dataloader"), args),
        )
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.pace.step_end(state.global_step)
        if self._watch is not None and self._watch.pending() is not None:
            control.should_save = True
            control.should_training_stop = True
            self._saving = True
        return control

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.pace.stalled("evaluation")
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.pace.stalled("save")
        if self._saving and self._watch is not None and args.process_index == 0:
            self._watch.exit_preempted(state.global_step, output_dir=str(args.output_dir))
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.pace.publish()
        return control


def _steps_per_epoch(loader: Any, args: Any) -> int | None:
    """Optimizer steps in an epoch, as the Trainer counts them (its batches over the
    gradient accumulation); ``None`` for a loader of no length (an iterable dataset)."""
    try:
        batches = len(loader)
    except TypeError:
        return None
    return max(batches // max(int(args.gradient_accumulation_steps), 1), 1)
