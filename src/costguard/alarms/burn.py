"""The live burn rate: running instances x list price, now. Pure.

Provider billing data lags (AWS ~6 h, Azure 8-20 h, GCP hours to days); this does not.
It sees only the instances it lists, so it is a floor on spend, and the provider budget
(``costguard alarm``) stays the authority on the whole bill.

>>> from datetime import datetime, UTC
>>> now = datetime(2026, 12, 11, tzinfo=UTC)
>>> vm = RunningInstance("aws", "us-east-1", "i-1", "g5.xlarge", Market.ON_DEMAND,
...                      datetime(2026, 12, 1, tzinfo=UTC))
>>> report = burn_report([PricedInstance(vm, Decimal("1.006"))], now, budget_usd=Decimal(500))
>>> report.usd_per_hour, report.spent_usd, report.projected_usd, report.over_budget
(Decimal('1.006'), Decimal('241.4400'), Decimal('748.4640'), True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from costguard.pricing.catalog import Catalog, Market

SECONDS_PER_HOUR = Decimal(3600)


@dataclass(frozen=True)
class RunningInstance:
    """An instance seen running, as any provider describes it."""

    provider: str
    region: str
    instance_id: str
    instance_type: str
    market: Market
    launched_at: datetime
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PricedInstance:
    """A running instance with its list price; ``usd_per_hour`` is ``None`` if unknown."""

    instance: RunningInstance
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


def price_instances(instances: Iterable[RunningInstance], catalog: Catalog) -> list[PricedInstance]:
    """Look each instance up in the price tables (spot price for spot instances).

    A spot instance whose spot price the tables lack is priced on-demand (an upper bound)
    and says so.
    """
    index = {(i.provider, i.region, i.instance_type): i for i in catalog.instances}
    priced = []
    for vm in instances:
        row = index.get((vm.provider, vm.region, vm.instance_type))
        if row is None:
            priced.append(PricedInstance(vm, None, "not in the price tables: not counted"))
            continue
        price = row.usd_per_hour(vm.market)
        note = ""
        if price is None and vm.market is Market.SPOT:
            price, note = row.ondemand_usd_per_hour, "no spot price in the tables: on-demand"
        priced.append(PricedInstance(vm, price, note))
    return priced


def month_bounds(now: datetime) -> tuple[datetime, datetime]:
    """The start of this calendar month and of the next, in UTC (billing months are UTC)."""
    now = now.astimezone(UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )
    return start, following


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
        since = max(item.instance.launched_at.astimezone(UTC), start)
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
