"""When to save: every N steps and/or every T minutes, and how often that should be. Pure.

>>> s = Schedule(every_steps=100)
>>> s.due(steps_done=200, now_s=0.0, last_steps_done=100, last_save_s=0.0)
True
>>> s.due(steps_done=150, now_s=0.0, last_steps_done=100, last_save_s=0.0)
False
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from costguard.errors import InputError


@dataclass(frozen=True)
class Schedule:
    """Save when ``every_steps`` steps or ``every_minutes`` minutes have passed since the
    last save (whichever comes first); neither set means on demand and on notice only."""

    every_steps: int | None = None
    every_minutes: float | None = None

    def __post_init__(self) -> None:
        if self.every_steps is not None and self.every_steps < 1:
            msg = f"every_steps must be at least 1, not {self.every_steps}"
            raise InputError(msg, hint="e.g. --every-steps 500")
        if self.every_minutes is not None and not (
            math.isfinite(self.every_minutes) and self.every_minutes > 0
        ):
            msg = f"every_minutes must be a positive number, not {self.every_minutes}"
            raise InputError(msg, hint="e.g. --every-minutes 10")

    def due(
        self, *, steps_done: int, now_s: float, last_steps_done: int, last_save_s: float
    ) -> bool:
        """Whether a save is due after ``steps_done`` completed steps at monotonic ``now_s``.

        ``last_*`` describe the last save (or the start of the run). A step count that is a
        multiple of ``every_steps`` is due, so resumed runs save at the same steps as an
        uninterrupted one.
        """
        if self.due_by_steps(steps_done=steps_done, last_steps_done=last_steps_done):
            return True
        return (
            steps_done > last_steps_done
            and self.every_minutes is not None
            and now_s - last_save_s >= self.every_minutes * 60
        )

    def due_by_steps(self, *, steps_done: int, last_steps_done: int) -> bool:
        """The step-count part of :meth:`due` alone.

        It depends on step counts only, so every rank of a distributed job computes the
        same answer without talking to the others (clocks differ between ranks).

        >>> Schedule(every_steps=4, every_minutes=1).due_by_steps(steps_done=6, last_steps_done=4)
        False
        """
        if steps_done <= last_steps_done or self.every_steps is None:
            return False
        return (
            steps_done % self.every_steps == 0 or steps_done - last_steps_done >= self.every_steps
        )


def young_daly_interval_s(save_cost_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order optimum of Young's checkpoint interval, in seconds.

    ``save_cost_s`` is the time a save takes away from training (with asynchronous saves:
    the stall, not the upload); ``mtbf_s`` the mean time between interruptions.
    Young: sqrt(2 C M). Daly adds correction terms and caps the interval at M when C >= 2M.

    >>> round(young_daly_interval_s(10, 3600))
    262
    """
    if save_cost_s <= 0 or mtbf_s <= 0:
        msg = "save cost and mean time between interruptions must be positive"
        raise InputError(msg)
    c, m = save_cost_s, mtbf_s
    if c >= 2 * m:
        return m
    ratio = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - c


def suggest_interval_s(*, stall_s: float, save_s: float, interruptions_per_hour: float) -> float:
    """A save interval for asynchronous checkpoints, from measured costs and the risk.

    The training loop pays only ``stall_s`` per save, so that is the cost Young/Daly
    weighs; but saves cannot come faster than one finishes (``save_s``, the background
    serialise + upload), or they would queue.

    >>> round(suggest_interval_s(stall_s=0.2, save_s=30, interruptions_per_hour=0.5))
    54
    >>> round(suggest_interval_s(stall_s=0.2, save_s=90, interruptions_per_hour=0.5))
    90
    """
    if interruptions_per_hour <= 0:
        msg = "interruptions_per_hour must be positive"
        raise InputError(msg, hint="e.g. 0.05 for one interruption in 20 hours")
    mtbf_s = 3600 / interruptions_per_hour
    return max(young_daly_interval_s(stall_s, mtbf_s), save_s)
