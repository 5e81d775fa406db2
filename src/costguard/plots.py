"""Pictures where people would rather look: a job's cost as it ran, and the month's burn.

matplotlib is the optional ``[plot]`` extra, imported only when a picture is drawn, on
its Agg canvas (PNG, headless: no display, no GUI backend). The series drawn are computed
by plain functions first, from the figures the reports print. Every picture has the same
size and the same axes rectangle, and its y axis runs from 0 to :class:`Picture`'s
``y_top``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from costguard.errors import InputError, MissingDependencyError

WIDTH_PX, HEIGHT_PX, DPI = 960, 540, 96
#: The axes rectangle, as fractions of the figure: left, bottom, width, height.
AXES = (0.09, 0.13, 0.86, 0.74)
COST_COLOR = "#1f77b4"
ON_DEMAND_COLOR = "#7f7f7f"
PREEMPTION_COLOR = "#ff7f0e"
BUDGET_COLOR = "#d62728"


@dataclass(frozen=True)
class Picture:
    """A PNG written: where, and the value at the top of its y axis (the bottom is 0)."""

    path: Path
    y_top: float


@dataclass(frozen=True)
class Series:
    """A line: x and y, in the picture's units."""

    x: tuple[float, ...]
    y: tuple[float, ...]


def job_series(
    attempts: Sequence[Any], started_unix: float, on_demand_usd_per_hour: Decimal | None, now: float
) -> tuple[Series, Series | None, Series]:
    """Cumulative cost over the job's wall time (s), the same hours on-demand, preemptions.

    Cost grows at each attempt's price while it runs and stays flat between attempts;
    the third series marks where each interrupted attempt ended (on the cost line).
    """
    from costguard.spot.recovery import INTERRUPTIONS, AttemptOutcome

    xs, ys, od = [0.0], [0.0], [0.0]
    cost = on_demand = Decimal(0)
    marks_x: list[float] = []
    marks_y: list[float] = []
    for attempt in attempts:
        if attempt.outcome is AttemptOutcome.LAUNCH_FAILED:
            continue
        start = attempt.launched_unix - started_unix
        end = (attempt.ended_unix if attempt.ended_unix is not None else now) - started_unix
        hours = attempt.hours(now)
        xs += [start, end]
        ys += [float(cost), float(cost + hours * attempt.usd_per_hour)]
        od += [float(on_demand)]
        cost += hours * attempt.usd_per_hour
        if on_demand_usd_per_hour is not None:
            on_demand += hours * attempt.node_count * on_demand_usd_per_hour
        od += [float(on_demand)]
        if attempt.outcome in INTERRUPTIONS:
            marks_x.append(end)
            marks_y.append(float(cost))
    costs = Series(tuple(xs), tuple(ys))
    demand = Series(tuple(xs), tuple(od)) if on_demand_usd_per_hour is not None else None
    return costs, demand, Series(tuple(marks_x), tuple(marks_y))


def burn_series(report: Any) -> tuple[Series, Series]:
    """Month-to-date spend (x: days since the month began) and the projection to its end.

    Each priced instance adds its rate from its launch (or the month's start) to now, as
    ``costguard burn`` counts it.
    """
    start: datetime = report.month_start

    def days(moment: datetime) -> float:
        return (moment - start).total_seconds() / 86400

    priced = [
        (max(p.instance.launched_at or report.now, start), p.usd_per_hour)
        for p in report.instances
        if p.usd_per_hour is not None
    ]
    moments = sorted({start, report.now, *(since for since, _ in priced)})
    spend = [
        float(
            sum(
                (
                    rate * Decimal(str(max(0.0, (t - since).total_seconds()))) / 3600
                    for since, rate in priced
                ),
                Decimal(0),
            )
        )
        for t in moments
    ]
    projection = Series(
        (days(report.now), days(report.month_end)),
        (float(report.spent_usd), float(report.projected_usd)),
    )
    return Series(tuple(days(t) for t in moments), tuple(spend)), projection


def draw_job(path: Path, job: Any, offers: Sequence[Any], now: float) -> Picture:
    """The job's cumulative cost over wall time, the on-demand line, preemptions marked."""
    from costguard.pricing.catalog import Market

    on_demand = [o.usd_per_hour for o in offers if o.market is Market.ON_DEMAND]
    costs, demand, marks = job_series(
        job.attempts, job.spec.created_unix, min(on_demand) if on_demand else None, now
    )
    scale, unit = _time_unit(max(costs.x))
    figure, axes = _canvas()
    axes.plot([x / scale for x in costs.x], costs.y, color=COST_COLOR, linewidth=2,
              label=f"cost ({job.spec.provider}, as it ran)")  # fmt: skip
    if demand is not None:
        axes.plot([x / scale for x in demand.x], demand.y, color=ON_DEMAND_COLOR,
                  linestyle="--", linewidth=1.5, label="the same hours on-demand")  # fmt: skip
    if marks.x:
        axes.plot([x / scale for x in marks.x], marks.y, linestyle="none", marker="v",
                  markersize=10, color=PREEMPTION_COLOR, label="preemption")  # fmt: skip
    top = _top([*costs.y, *(demand.y if demand else ())])
    axes.set_ylim(0, top)
    axes.set_xlim(0, max(max(costs.x) / scale, 1e-9))
    axes.set_xlabel(f"wall time ({unit})")
    axes.set_ylabel("USD")
    axes.set_title(f"job {job.spec.job_id}: cost over time ({job.status})")
    axes.legend(loc="upper left")
    return _save(figure, path, top)


def draw_burn(path: Path, report: Any) -> Picture:
    """Month-to-date spend, the projection to the month's end and the budget line."""
    spend, projection = burn_series(report)
    figure, axes = _canvas()
    axes.plot(spend.x, spend.y, color=COST_COLOR, linewidth=2, label="spent this month")
    axes.plot(projection.x, projection.y, color=COST_COLOR, linestyle="--", linewidth=1.5,
              label="projection (instances keep running)")  # fmt: skip
    values = [*spend.y, *projection.y]
    if report.budget_usd is not None:
        axes.axhline(float(report.budget_usd), color=BUDGET_COLOR, linewidth=2,
                     label=f"budget ${report.budget_usd:,.2f}")  # fmt: skip
        values.append(float(report.budget_usd))
    top = _top(values)
    axes.set_ylim(0, top)
    axes.set_xlim(0, projection.x[1])
    axes.set_xlabel(f"days since {report.month_start:%Y-%m-%d} (UTC)")
    axes.set_ylabel("USD")
    axes.set_title(f"burn at {report.now:%Y-%m-%d %H:%M} UTC: ${report.usd_per_hour:,.2f}/h")
    axes.legend(loc="upper left")
    return _save(figure, path, top)


def _time_unit(seconds: float) -> tuple[float, str]:
    if seconds < 120:
        return 1.0, "s"
    if seconds < 120 * 60:
        return 60.0, "min"
    return 3600.0, "h"


def _top(values: Sequence[float]) -> float:
    """A round number above every value (10% headroom), so lines never touch the frame.

    >>> _top([3229.0]), _top([0.0045]), _top([])
    (4000.0, 0.005, 1.0)
    """
    highest = max([*values, 0.0]) * 1.1 or 1.0
    step = 10 ** math.floor(math.log10(highest)) / 2
    return math.ceil(highest / step) * step


def _canvas() -> tuple[Any, Any]:
    try:
        from matplotlib.figure import Figure  # the [plot] extra, imported only here
    except ImportError:
        module = "matplotlib"
        raise MissingDependencyError(module, "plot") from None
    figure = Figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI)
    axes = figure.add_axes(AXES)
    axes.grid(True, alpha=0.3)
    return figure, axes


def check_target(path: Path) -> Path:
    """Refuse a ``--plot`` path that cannot be written, before anything else is done."""
    if path.suffix.lower() != ".png":
        msg = f"--plot writes a PNG, and {path} does not end in .png"
        raise InputError(msg, hint="e.g. --plot burn.png")
    if not path.parent.is_dir():
        msg = f"--plot {path}: the folder {path.parent} does not exist"
        raise InputError(msg, hint="a folder that exists and that you can write to")
    if path.exists() and not path.is_file():
        msg = f"--plot {path} is not a file that a picture can replace"
        raise InputError(msg, hint="name a new file, e.g. --plot burn.png")
    import tempfile  # --plot only

    try:  # a file made and removed at once: the folder takes one (permissions, /proc...)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".costguard-plot-"):
            pass
    except OSError as exc:
        msg = f"--plot {path}: cannot write in {path.parent}: {exc.strerror or exc}"
        raise InputError(msg, hint="a folder that exists and that you can write to") from None
    return path


def _save(figure: Any, path: Path, top: float) -> Picture:
    try:
        figure.savefig(path, format="png", dpi=DPI)
    except OSError as exc:
        msg = f"cannot write {path}: {exc.strerror or exc}"
        raise InputError(msg, hint="a folder that exists and that you can write to") from None
    return Picture(path, top)


def spend_series(report: Any) -> Series:
    """What an export billed to date (y) at the end of each day charged (x: days since
    the first day of its first month), from a ``costguard spend --by day`` report;
    charges without a date are left out."""
    days = sorted((g.key, g.billed_usd) for g in report.groups if g.key is not None)
    if not days:
        return Series((0.0,), (0.0,))
    start = date.fromisoformat(days[0][0][:7] + "-01")
    xs, ys, total = [0.0], [0.0], Decimal(0)
    for day, billed in days:
        total += billed
        xs.append(float((date.fromisoformat(day) - start).days + 1))
        ys.append(float(total))
    return Series(tuple(xs), tuple(ys))


def draw_spend(path: Path, report: Any, budget: Decimal | None) -> Picture:
    """The export's spend to date, day by day, against the month's budget."""
    spent = spend_series(report)
    figure, axes = _canvas()
    axes.plot(spent.x, spent.y, color=COST_COLOR, linewidth=2, drawstyle="steps-pre",
              label=f"billed to date ({report.currency}, the export)")  # fmt: skip
    values = list(spent.y)
    if budget is not None:
        axes.axhline(float(budget), color=BUDGET_COLOR, linewidth=2,
                     label=f"budget {budget:,.2f} {report.currency}")  # fmt: skip
        values.append(float(budget))
    top = _top(values)
    axes.set_ylim(0, top)
    axes.set_xlim(0, max(31.0, max(spent.x)))
    first = min((g.key for g in report.groups if g.key is not None), default=None)
    axes.set_xlabel(f"days since {first[:7] + '-01' if first else 'the month began'} (UTC)")
    axes.set_ylabel(report.currency)
    axes.set_title(f"billed in {report.period}, per the export")
    axes.legend(loc="lower right")  # the month fills from the left
    return _save(figure, path, top)
