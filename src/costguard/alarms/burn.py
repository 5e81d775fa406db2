"""The live burn rate: running instances x list price, now. Pure.

Provider billing data lags (AWS ~6 h, Azure 8-20 h, GCP hours to days); this does not.
It sees only the instances it lists, so it is a floor on spend, and the provider budget
(``costguard alarm``) stays the authority on the whole bill. Instances come from the same
cloud adapters the reaper uses (:class:`costguard.reaper.policy.Instance`).

>>> from datetime import datetime, UTC
>>> now = datetime(2026, 12, 11, tzinfo=UTC)
>>> vm = Instance("aws", "us-east-1", "i-1", "g5.xlarge", True, 1,
...               datetime(2026, 12, 1, tzinfo=UTC), usd_per_hour=Decimal("1.006"))
>>> report = burn_report(price_running([vm], lambda i: None), now, budget_usd=Decimal(500))
>>> report.usd_per_hour, report.spent_usd, report.projected_usd, report.over_budget
(Decimal('1.006'), Decimal('241.4400'), Decimal('748.4640'), True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from costguard.reaper.policy import Instance

SECONDS_PER_HOUR = Decimal(3600)


@dataclass(frozen=True)
class PricedInstance:
    """A running instance with the price burn counts; ``usd_per_hour`` ``None``: unknown."""

    instance: Instance
    usd_per_hour: Decimal | None
    note: str = ""


@dataclass(frozen=True)
class BurnReport:
    """The burn rate now and where the month is heading."""

    now: datetime
    month_start: datetime
    month_end: datetime
    instances: tuple[PricedInstance, ...]
    usd_per_hour: Decimal
    spent_usd: Decimal  # this month, by the instances seen, since they launched
    projected_usd: Decimal  # spent + burn rate x the hours left in the month
    budget_usd: Decimal | None = None

    @property
    def over_budget(self) -> bool:
        """Whether the month's projection passes the budget."""
        return self.budget_usd is not None and self.projected_usd > self.budget_usd

    @property
    def unpriced(self) -> tuple[PricedInstance, ...]:
        """Instances whose type is not in the price tables (not counted in the figures)."""
        return tuple(p for p in self.instances if p.usd_per_hour is None)


def price_running(
    instances: Iterable[Instance], on_demand: Callable[[Instance], Decimal | None]
) -> list[PricedInstance]:
    """The running instances, priced as the adapter priced them.

    A spot instance whose spot price the tables lack is priced on-demand (``on_demand``
    looks it up): an upper bound, and it says so.
    """
    priced = []
    for vm in instances:
        if not vm.running:
            continue
        if vm.usd_per_hour is not None:
            priced.append(PricedInstance(vm, vm.usd_per_hour))
        elif vm.spot and (fallback := on_demand(vm)) is not None:
            priced.append(PricedInstance(vm, fallback, "no spot price in the tables: on-demand"))
        else:
            priced.append(PricedInstance(vm, None, "not in the price tables: not counted"))
    return priced


def month_bounds(now: datetime) -> tuple[datetime, datetime]:
    """The start of this calendar month and of the next, in UTC (billing months are UTC)."""
    now = now.astimezone(UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if start.month == 12:
        return start, start.replace(year=start.year + 1, month=1)
    return start, start.replace(month=start.month + 1)


def _hours(seconds: float) -> Decimal:
    return Decimal(str(round(seconds, 3))) / SECONDS_PER_HOUR


def burn_report(
    priced: Sequence[PricedInstance], now: datetime, budget_usd: Decimal | None = None
) -> BurnReport:
    """Burn rate, spend so far this month and the month's projection, from what runs now."""
    start, end = month_bounds(now)
    rate = Decimal(0)
    spent = Decimal(0)
    for item in priced:
        if item.usd_per_hour is None:
            continue
        rate += item.usd_per_hour
        launched = item.instance.launched_at or now  # unknown launch: counts from now
        since = max(launched.astimezone(UTC), start)
        spent += item.usd_per_hour * _hours(max((now - since).total_seconds(), 0.0))
    remaining = _hours((end - now).total_seconds())
    return BurnReport(
        now=now,
        month_start=start,
        month_end=end,
        instances=tuple(priced),
        usd_per_hour=rate,
        spent_usd=spent,
        projected_usd=spent + rate * remaining,
        budget_usd=budget_usd,
    )
