"""A trainer's measured pace, recorded by ``costguard run`` as the Checkpointer's is.

The integrations' callbacks (Hugging Face ``Trainer``, Lightning) report each optimizer
step's end, and the evaluations and saves the trainer makes between steps: a step's time
runs from the end of the one before (its batch's loading included) to its own end, less
the evaluations and saves, which are counted apart (``evaluations``/``evaluation_s``,
``saves``/``overhead_s`` in the record); the first :data:`~costguard.checkpoint.pace.WARMUP_STEPS`
steps are left out, and so is a step far slower than the recent ones
(:class:`~costguard.checkpoint.pace.PaceMeter`'s rules).

Rank 0 appends the record to ``costguard run``'s events file after each save, every
:data:`~costguard.checkpoint.pace.PUBLISH_S` seconds and when training ends; ``costguard
run`` writes it to ``job/pace.json`` in the store (the script needs no access to it), where
``costguard estimate --from-run``, ``jobs status`` and ``burn --job`` read it. Without
``costguard run`` (no events file) nothing is measured or written.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from costguard import contract
from costguard.checkpoint.pace import (
    ENV_PILOT_STEPS,
    ENV_TOTAL_STEPS,
    PUBLISH_S,
    Pace,
    PaceMeter,
)
from costguard.logs import get_logger

logger = get_logger(__name__)

#: Where ``costguard run`` reads what the script reports (as the Checkpointer's saver).
ENV_EVENTS_FILE = contract.ENV_EVENTS_FILE
#: The field that asks ``costguard run`` to write a pace event to ``job/pace.json``.
RECORD = "record"

Stall = Literal["evaluation", "save"]


class TrainerPace:
    """The pace of a trainer's steps; see the module's docstring."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if env is None else env
        self._env = env
        self.events_file = env.get(ENV_EVENTS_FILE, "").strip() or None
        #: ``costguard run --total-steps``: wins over what the trainer says.
        self._env_total = _count_text(env.get(ENV_TOTAL_STEPS, ""))
        #: ``costguard pilot --steps N``: the trainer stops after N steps, its pace recorded.
        self.pilot_steps = _count_text(env.get(ENV_PILOT_STEPS, ""))
        self._clock = clock
        self.meter = PaceMeter()
        self.evaluations = 0
        self.evaluation_s = 0.0
        self.saves = 0
        self.save_s = 0.0
        self.total_steps: int | None = None
        self.steps_per_epoch: int | None = None
        self.steps_done = 0
        self._rank0 = False
        self._started_unix = time.time()
        #: When the newest step or stall ended (``None`` before the first step).
        self._mark: float | None = None
        self._published_s = clock()

    @property
    def active(self) -> bool:
        """Whether this rank records: rank 0 under ``costguard run``."""
        return self._rank0 and self.events_file is not None

    def begin(self, *, rank0: bool, total_steps: int | None, steps_per_epoch: int | None) -> None:
        """Training starts: whether this is rank 0, and what the trainer knows of its run
        (a count that is not a positive whole number is unknown)."""
        self._rank0 = rank0
        self.total_steps = self._env_total or _count(total_steps)
        self.steps_per_epoch = _count(steps_per_epoch)

    def step_end(self, steps_done: int) -> None:
        """Optimizer step ``steps_done`` (the trainer's global step) has ended. Under
        ``costguard pilot``, after its steps the record is published and
        :class:`~costguard.checkpoint.checkpointer.PilotDone` ends the script (exit 0)."""
        now = self._clock()
        self.meter.lap(now, steps_done)
        self.meter.resume(now)  # what comes before the next step's end is that step's
        self._mark = now
        self.steps_done = steps_done
        if self.pilot_steps is not None and self.meter.laps >= self.pilot_steps:
            from costguard.checkpoint.checkpointer import PilotDone

            self.publish()
            raise PilotDone(self.meter.laps)
        if now - self._published_s >= PUBLISH_S:
            self.publish()

    def stalled(self, kind: Stall, since: float | None = None) -> None:
        """Training stood still from ``since`` (the clock's time; default: the end of the
        newest step or stall) until now for an evaluation or a save: left out of the
        step's time, counted apart. A save publishes the record."""
        now = self._clock()
        if self._mark is None:
            return  # before the first step: nothing is being measured yet
        start = self._mark if since is None else max(since, self._mark)
        seconds = max(0.0, now - start)
        self._mark = now
        if self.meter.pause(seconds):
            if kind == "evaluation":
                self.evaluations += 1
                self.evaluation_s += seconds
            else:
                self.saves += 1
                self.save_s += seconds
        if kind == "save":
            self.publish()

    def now(self) -> float:
        """The clock's time, for a later :meth:`stalled`'s ``since``."""
        return self._clock()

    def pace(self) -> Pace:
        """The record as measured so far."""
        return Pace.measured(
            self.meter,
            steps_done=self.steps_done,
            started_unix=self._started_unix,
            env=self._env,
            saves=self.saves,
            overhead_s=round(self.save_s, 6),
            total_steps=self.total_steps,
            evaluations=self.evaluations,
            evaluation_s=round(self.evaluation_s, 6),
            steps_per_epoch=self.steps_per_epoch,
            pilot=self.pilot_steps is not None,
        )

    def publish(self) -> None:
        """Tell ``costguard run`` the record (rank 0, under ``costguard run``; a file that
        cannot be written is logged, never raised into the training)."""
        self._published_s = self._clock()
        if not self.active or self.events_file is None:
            return
        event = {"event": "pace", RECORD: True, **json.loads(self.pace().to_json())}
        try:
            with Path(self.events_file).open("a", encoding="utf-8") as file:
                file.write(json.dumps(event) + "\n")
        except OSError as exc:
            logger.debug("costguard: could not tell costguard run the pace: %s", exc)


def _count_text(text: str) -> int | None:
    """A positive whole number in an environment variable (``costguard run`` checked it).

    >>> _count_text("200"), _count_text(" 0"), _count_text("x")
    (200, None, None)
    """
    text = text.strip()
    return _count(int(text)) if text.isdigit() and len(text) < 19 else None


def _count(value: object) -> int | None:
    """A positive whole number of steps, else ``None`` (Lightning's -1, an infinity).

    >>> _count(60), _count(-1), _count(float("inf")), _count(24.0), _count(None)
    (60, None, None, 24, None)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 1 or value != int(value):
        return None
    return int(value)
