"""A running job's finish time and final cost, from its measured pace. Pure.

The pace (:class:`~costguard.checkpoint.pace.Pace`, recorded by the script's Checkpointer)
says how long a step takes and how many are done; the job's whole run is
``--total-steps`` (or the script's ``Checkpointer(total_steps=N)``). The steps left, at the
measured pace plus the time inside ``step()`` measured with it (save copies, waits for a
save; the first save's one-time set-up left out), give the time left; that time at the
current attempt's price, added to what was spent so far, is the projected total.

>>> from costguard.checkpoint.pace import Pace
>>> pace = Pace(100, 50.0, 500, updated_unix=1000.0, started_unix=700.0, total_steps=2000)
>>> p = project(pace, spent_usd=Decimal("1.00"), usd_per_hour=Decimal("2.00"),
...             now_unix=1000.0, running_since_unix=600.0)
>>> p.steps_done, p.left_s, p.projected_total_usd
(500, 750.0, Decimal('1.4167'))
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from costguard.checkpoint.pace import Pace
from costguard.spot.job import Job
from costguard.spot.recovery import spent_usd

USD_PLACES = Decimal("0.0001")
#: A run with more than a century left is not projected (no finish date, no total).
HORIZON_S = 100 * 365.25 * 86400


@dataclass(frozen=True)
class Projection:
    """Where a job stands and where it will end at its measured pace."""

    steps_done: int
    total_steps: int
    seconds_per_step: float
    #: Seconds left: the steps left at the wall-clock rate, and the wind-down.
    left_s: float
    finish_unix: float
    spent_usd: Decimal
    #: The current attempt's price; ``None`` when nothing runs (the rest is then unpriced).
    usd_per_hour: Decimal | None
    projected_total_usd: Decimal | None
    #: How many steps the record is behind: steps run since it was written are assumed
    #: at the measured pace.
    extrapolated_steps: int = 0

    @property
    def fraction_done(self) -> float:
        """Share of the run's steps done."""
        return min(1.0, self.steps_done / self.total_steps)


def project(
    pace: Pace,
    *,
    spent_usd: Decimal,
    usd_per_hour: Decimal | None,
    now_unix: float,
    running_since_unix: float | None,
    total_steps: int | None = None,
    wind_down_s: float = 0.0,
) -> Projection | None:
    """The projection, or ``None`` when the run's total steps are unknown, no step was
    measured, or more than :data:`HORIZON_S` are left. ``running_since_unix``: when the
    attempt now running started (``None``: none runs); steps since the record are
    extrapolated only within it. The steps left go at the wall-clock rate of the measured
    ones: their pace, the slow steps among them (evaluations) and the time inside
    ``step()`` (saves); ``wind_down_s`` after the last step (the final save, the exit) is
    added while steps are left."""
    total = total_steps or pace.total_steps
    if total is None or pace.steps_measured == 0 or pace.seconds_measured <= 0:
        return None
    per_step = pace.seconds_per_step
    wall_per_step = pace.wall_seconds_per_step
    done = pace.steps_done
    extrapolated = 0
    if running_since_unix is not None and pace.updated_unix >= running_since_unix:
        since = max(0.0, now_unix - pace.updated_unix)
        steps = int(since / wall_per_step + 1e-9)  # whole steps, not 1-ulp less
        extrapolated = min(max(0, total - done), steps)
        done += extrapolated
    left_s = max(0, total - done) * wall_per_step
    if done < total:
        left_s += wind_down_s
    if not left_s <= HORIZON_S:
        return None
    projected = None
    if usd_per_hour is not None:
        rest = usd_per_hour * Decimal(str(left_s)) / 3600
        projected = (spent_usd + rest).quantize(USD_PLACES, rounding=ROUND_HALF_UP)
    elif done >= total:
        projected = spent_usd
    return Projection(
        steps_done=done,
        total_steps=total,
        seconds_per_step=per_step,
        left_s=left_s,
        finish_unix=now_unix + left_s,
        spent_usd=spent_usd,
        usd_per_hour=usd_per_hour,
        projected_total_usd=projected,
        extrapolated_steps=extrapolated,
    )


def of_job(job: Job, pace: Pace | None, now_unix: float) -> Projection | None:
    """The projection of ``job`` (spent: its attempts' instance-hours at their list prices;
    the rest at the running attempt's price), ``None`` without a pace or total steps.

    The wind-down after the last step (the final save, the exit, the controller noticing)
    is taken to be as long as the attempt's start-up (its launch to the script's
    Checkpointer): both are a process and its imports, and on a cloud the boot makes it
    err on the high side."""
    if pace is None:
        return None
    current = job.current
    # The attempt's start-up (launch to its Checkpointer) stands for its wind-down.
    start_up = 0.0
    if current is not None and pace.started_unix >= current.launched_unix:
        start_up = pace.started_unix - current.launched_unix
    return project(
        pace,
        spent_usd=spent_usd(job.attempts, now_unix),
        usd_per_hour=current.usd_per_hour if current is not None else None,
        now_unix=now_unix,
        running_since_unix=current.launched_unix if current is not None else None,
        total_steps=job.spec.total_steps,
        wind_down_s=start_up,
    )


def document(p: Projection) -> dict[str, Any]:
    """The projection for ``--format json``."""
    return {
        "steps_done": p.steps_done,
        "total_steps": p.total_steps,
        "extrapolated_steps": p.extrapolated_steps,
        "seconds_per_step": round(p.seconds_per_step, 6),
        "left_s": round(p.left_s, 1),
        "finish_unix": round(p.finish_unix, 1),
        "spent_usd": p.spent_usd,
        "usd_per_hour": p.usd_per_hour,
        "projected_total_usd": p.projected_total_usd,
        "basis": "spent so far + (the steps left x the measured wall-clock s/step, with "
        "evaluations and saves + a wind-down as long as the attempt's start-up) x the "
        "running attempt's price; relaunches after preemptions are not in it",
    }
