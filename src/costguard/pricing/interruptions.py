"""What spot preemptions add to a run: lost work, restarts, and the interval to save at.

A spot run that checkpoints every ``T`` hours of work, spends ``s`` hours on each save and
``R`` hours on each restart, under preemptions that arrive as a Poisson process with
``lam`` preemptions per running hour, runs longer than its ``H`` hours of work:

* every cycle is ``T`` of work then ``s`` of saving, so the saves add ``H x s / T``;
* a preemption lands uniformly within a cycle, so it loses half a cycle, ``(T + s) / 2``,
  of work done since the last committed checkpoint; the lost work is run again (and can
  be preempted again), so the running time ``W`` solves ``W = H (1 + s/T) + lam W (T+s)/2``:
  ``W = H (1 + s/T) / (1 - lam (T + s) / 2)``;
* the expected number of preemptions is ``n = lam x W``, each followed by a restart ``R``
  (billed, but not preemptible in this model);
* the effective hours are ``W + n R``; the overhead is what they add to ``H``.

The 90% range takes the number of preemptions as Poisson with mean ``n`` and prices its
5th and 95th percentiles at the expected loss per preemption. The Young/Daly interval
``sqrt(2 s MTBF)`` (``MTBF = 1 / lam``) minimises the first-order overhead
``H s / T + lam H T / 2``. On-demand is cheaper for the job when its hours at the
on-demand price cost less than the effective spot hours at the spot price.

Money and hours are ``Decimal``; only the Poisson percentiles go through ``float``
(``math.lgamma``), and they are whole counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from costguard.errors import InputError
from costguard.money import format_usd
from costguard.pricing.catalog import Market
from costguard.pricing.estimate import CostOption

RANGE_LOW = 0.05
RANGE_HIGH = 0.95

_HOUR_MINUTES = Decimal(60)
_HOUR_SECONDS = Decimal(3600)
_TWO = Decimal(2)


@dataclass(frozen=True)
class Checkpointing:
    """How the run saves and restarts, and how often it is preempted, in the units the
    CLI takes them; the model reads them in hours.

    >>> c = Checkpointing(Decimal(30), Decimal(90), Decimal(6), Decimal(24))
    >>> c.interval_hours, c.save_hours, c.restart_hours, c.preemptions_per_hour
    (Decimal('0.5'), Decimal('0.025'), Decimal('0.1'), Decimal('1'))
    """

    every_minutes: Decimal
    save_seconds: Decimal
    restart_minutes: Decimal
    per_day: Decimal

    @property
    def interval_hours(self) -> Decimal:
        """Hours of work between checkpoints."""
        return self.every_minutes / _HOUR_MINUTES

    @property
    def save_hours(self) -> Decimal:
        """Hours one save takes."""
        return self.save_seconds / _HOUR_SECONDS

    @property
    def restart_hours(self) -> Decimal:
        """Hours from a preemption to working again."""
        return self.restart_minutes / _HOUR_MINUTES

    @property
    def preemptions_per_hour(self) -> Decimal:
        """The preemption rate per running hour."""
        return self.per_day / 24


@dataclass(frozen=True)
class Interruptions:
    """The expected cost of preemptions for a run of ``work_hours``."""

    work_hours: Decimal
    checkpointing: Checkpointing
    expected_preemptions: Decimal
    lost_hours_per_preemption: Decimal
    effective_hours: Decimal
    overhead_low_hours: Decimal
    overhead_high_hours: Decimal
    suggested_interval_hours: Decimal | None

    @property
    def overhead_hours(self) -> Decimal:
        """Expected hours added to the work: saves, lost work and restarts."""
        return self.effective_hours - self.work_hours

    @property
    def factor(self) -> Decimal:
        """Effective hours per hour of work: what a spot hour really costs, in hours."""
        return self.effective_hours / self.work_hours

    @property
    def effective_hours_range(self) -> tuple[Decimal, Decimal]:
        """The 90% range of the effective hours (5th and 95th percentile)."""
        return (
            self.work_hours + self.overhead_low_hours,
            self.work_hours + self.overhead_high_hours,
        )


def gang_per_day(node_per_day: Decimal, nodes: int) -> Decimal:
    """The preemptions a day of a gang of ``nodes`` nodes, each preempted ``node_per_day``
    times a day independently: any node's preemption stops them all (``launch --nodes``),
    and independent Poisson processes add up, so ``nodes`` times a node's rate.

    >>> gang_per_day(Decimal("0.5"), 4)
    Decimal('2.0')
    """
    return node_per_day * nodes


def young_daly_hours(save_hours: Decimal, preemptions_per_hour: Decimal) -> Decimal | None:
    """The checkpoint interval that minimises expected overhead: ``sqrt(2 s MTBF)``.

    None when nothing preempts the run (any interval is as good as never saving).

    >>> young_daly_hours(Decimal("0.02"), Decimal("0.25"))
    Decimal('0.4')
    """
    if preemptions_per_hour <= 0:
        return None
    return (_TWO * save_hours / preemptions_per_hour).sqrt()


def poisson_quantile(mean: Decimal, probability: float) -> int:
    """The smallest count ``k`` with ``P(N <= k) >= probability`` for ``N ~ Poisson(mean)``.

    >>> poisson_quantile(Decimal(0), 0.95), poisson_quantile(Decimal(3), 0.05)
    (0, 1)
    >>> poisson_quantile(Decimal(3), 0.95)
    6
    """
    lam = float(mean)
    if lam <= 0:
        return 0
    log_lam = math.log(lam)
    total = 0.0
    bound = int(lam + 12 * math.sqrt(lam) + 20)  # far beyond any percentile asked for
    for k in range(bound + 1):
        total += math.exp(k * log_lam - lam - math.lgamma(k + 1))
        if total >= probability:
            return k
    return bound


def expected(work_hours: Decimal, checkpointing: Checkpointing) -> Interruptions:
    """The expected preemptions, lost work, effective hours and their 90% range.

    Raises :class:`InputError` when preemptions come so often that the work lost per
    preemption outruns the work done (the run would never finish).

    >>> c = Checkpointing(Decimal(60), Decimal(0), Decimal(0), Decimal("2.4"))
    >>> e = expected(Decimal(19), c)
    >>> e.expected_preemptions, e.effective_hours
    (Decimal('2'), Decimal('20'))
    """
    c = checkpointing
    cycle = c.interval_hours + c.save_hours
    lost = cycle / _TWO
    remaining_share = 1 - c.preemptions_per_hour * lost
    if remaining_share <= 0:
        msg = (
            f"at {c.per_day} preemptions a day, a checkpoint every {c.every_minutes} "
            "minutes loses more work than it keeps"
        )
        raise InputError(msg, hint="save more often (--every-minutes), or use on-demand")
    running = work_hours * (1 + c.save_hours / c.interval_hours) / remaining_share
    count = c.preemptions_per_hour * running
    saves = work_hours * c.save_hours / c.interval_hours
    per_preemption = lost + c.restart_hours
    low = poisson_quantile(count, RANGE_LOW)
    high = poisson_quantile(count, RANGE_HIGH)
    return Interruptions(
        work_hours=work_hours,
        checkpointing=c,
        expected_preemptions=count,
        lost_hours_per_preemption=lost,
        effective_hours=running + count * c.restart_hours,
        overhead_low_hours=saves + low * per_preemption,
        overhead_high_hours=saves + high * per_preemption,
        suggested_interval_hours=young_daly_hours(c.save_hours, c.preemptions_per_hour),
    )


def on_demand_cheaper(
    interruptions: Interruptions, spot_usd_per_hour: Decimal, on_demand_usd_per_hour: Decimal
) -> bool:
    """Whether the work at the on-demand price costs less than the effective spot hours.

    On-demand is not preempted: it pays for ``work_hours`` (without the saves, which a
    run that is never preempted can do without).

    >>> c = Checkpointing(Decimal(60), Decimal(0), Decimal(0), Decimal("2.4"))
    >>> on_demand_cheaper(expected(Decimal(19), c), Decimal(1), Decimal("1.04"))
    True
    """
    spot = interruptions.effective_hours * spot_usd_per_hour
    return interruptions.work_hours * on_demand_usd_per_hour < spot


def effective_total_usd(option: CostOption, interruptions: Interruptions) -> Decimal:
    """The option's total with its compute stretched to the effective hours (spot only).

    Storage and egress are left as they are: preemptions do not add data.
    """
    if option.market is not Market.SPOT:
        return option.total_usd
    return option.total_usd + option.compute_usd * (interruptions.factor - 1)


def cheaper_on_demand(
    options: Sequence[CostOption], interruptions: Interruptions
) -> list[tuple[CostOption, CostOption]]:
    """The (on-demand, spot) pairs of a provider and region where on-demand costs less
    for this job than spot with its preemptions; in the order of ``options``."""
    by_place: dict[tuple[str, str], dict[Market, CostOption]] = {}
    for option in options:
        by_place.setdefault((option.provider, option.region), {})[option.market] = option
    pairs = []
    for by_market in by_place.values():
        on_demand = by_market.get(Market.ON_DEMAND)
        spot = by_market.get(Market.SPOT)
        if on_demand and spot and on_demand.total_usd < effective_total_usd(spot, interruptions):
            pairs.append((on_demand, spot))
    return pairs


def minutes(hours: Decimal) -> str:
    """Hours as whole minutes for people (at least 1).

    >>> minutes(Decimal("0.4")), minutes(Decimal("0.001"))
    ('24', '1')
    """
    return f"{max(1, round(hours * _HOUR_MINUTES))}"


def advice_lines(interruptions: Interruptions, options: Sequence[CostOption]) -> list[str]:
    """What the model says: the preemptions expected, the interval to save at, and where
    on-demand is cheaper than spot for this job."""
    e = interruptions
    low, high = e.effective_hours_range
    lines = [
        f"Spot: {e.expected_preemptions:.1f} preemption(s) expected over the run, each "
        f"losing about {minutes(e.lost_hours_per_preemption)} min of work plus a "
        f"{minutes(e.checkpointing.restart_hours)} min restart: {e.effective_hours:.1f} "
        f"effective hours for {e.work_hours} h of work (90% range {low:.1f}-{high:.1f} h)"
    ]
    suggested = e.suggested_interval_hours
    if suggested is not None:
        lines.append(
            f"Checkpoint every {minutes(suggested)} min to lose least (Young/Daly: "
            f"sqrt(2 x save time x mean time between preemptions)); "
            f"--every-minutes {e.checkpointing.every_minutes} is assumed"
        )
    pairs = cheaper_on_demand(options, e)
    for on_demand, spot in pairs:
        lines.append(
            f"On-demand is cheaper than spot for this job in {on_demand.provider} "
            f"{on_demand.region}: {format_usd(on_demand.total_usd)} against "
            f"{format_usd(effective_total_usd(spot, e))} with preemptions"
        )
    if not pairs and any(o.market is Market.SPOT for o in options):
        lines.append("Spot stays cheaper than on-demand wherever both are shown")
    return lines


#: How the effective cost of a spot row is reckoned, in the assumptions.
COST_LINE = (
    "spot effective cost = compute x effective hours / hours, + storage + egress; "
    "a preemption loses half a checkpoint cycle of work"
)


def checkpoint_line(c: Checkpointing) -> str:
    """The checkpoint figures the spot rows assume (the rate stated apart)."""
    return (
        f"spot: a checkpoint every {c.every_minutes} min of work, {c.save_seconds} s per "
        f"save, {c.restart_minutes} min per restart (billed)"
    )


def assumption_lines(interruptions: Interruptions) -> list[str]:
    """The figures the spot rows assume, stated."""
    c = interruptions.checkpointing
    return [
        f"spot: {c.per_day} preemptions a day (Poisson), a checkpoint every "
        f"{c.every_minutes} min of work, {c.save_seconds} s per save, "
        f"{c.restart_minutes} min per restart (billed)",
        COST_LINE,
    ]


def document(interruptions: Interruptions, options: Sequence[CostOption]) -> dict[str, object]:
    """The ``interruptions`` part of ``estimate --format json``."""
    e = interruptions
    c = e.checkpointing
    low, high = e.effective_hours_range
    suggested = e.suggested_interval_hours
    return {
        "preemptions_per_day": c.per_day,
        "every_minutes": c.every_minutes,
        "save_seconds": c.save_seconds,
        "restart_minutes": c.restart_minutes,
        "expected_preemptions": e.expected_preemptions,
        "preemptions_90": [
            poisson_quantile(e.expected_preemptions, RANGE_LOW),
            poisson_quantile(e.expected_preemptions, RANGE_HIGH),
        ],
        "lost_minutes_per_preemption": e.lost_hours_per_preemption * _HOUR_MINUTES,
        "effective_hours": e.effective_hours,
        "effective_hours_90": [low, high],
        "suggested_every_minutes": None if suggested is None else suggested * _HOUR_MINUTES,
        "on_demand_cheaper": [
            {"provider": od.provider, "region": od.region}
            for od, _ in cheaper_on_demand(options, e)
        ],
    }
