"""The rules every provider's price records are read by, and the shape they are read into.
Pure: no I/O.

Each provider's records are read in a module of its own (:mod:`.parse_aws`,
:mod:`.parse_gcp`, :mod:`.parse_azure`, as the alarms' diffs are ``plan_<cloud>.py``),
in the shapes the provider documents (parsed JSON, or plain values read off an SDK
object), whether fetched live or read from a mirror. Every ``*_prices`` function gets the
table rows to price and returns :class:`RowPrices`: the fresh price per row and market,
which rows that API prices at all (GCP TPUs, for example, are not in the Compute Engine
catalog), which markets the records listed in each region, and how recent the records of
each region are.

Real responses hold records that are not prices: $0 placeholders (a catalogue's way of
saying "not priced"), other products under the same names (Azure Cloud Services and
Dedicated Hosts), older duplicates. The rules here apply to all of them: a $0 part is no
price (:func:`positive_price`); of duplicates the newest effective date wins
(:func:`keep_newest`); a price in another currency is an error (:class:`CurrencyError`),
never a silent skip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from functools import cached_property
from typing import Any

from costguard.errors import CostguardError
from costguard.money import parse_decimal
from costguard.pricing.catalog import InstancePrice, Market

#: A row of the instance tables: region, instance type and accelerator (a GCP n1 host
#: type carries several GPU models, so the type alone is not a key).
RowKey = tuple[str, str, str | None]


def row_key(row: InstancePrice) -> RowKey:
    """The key of a table row."""
    return (row.region, row.instance_type, row.accelerator)


def instance_family(instance_type: str) -> str:
    """An AWS instance type's family (``g5`` of ``g5.xlarge``); other clouds' types are
    their own family."""
    return instance_type.split(".", 1)[0]


@dataclass(frozen=True)
class RowPrices:
    """Fresh hourly prices for table rows, the rows the API prices at all, and the regions
    (of those rows) the records listed any price in.

    A region the records listed nothing in (a mirror of other regions, an API that
    answered empty) was not read: its rows keep their prices and their date.
    """

    prices: Mapping[RowKey, Mapping[Market, Decimal]]
    covered: frozenset[RowKey]
    listed: frozenset[str] = frozenset()
    #: (region, market) pairs the records listed a price in: a region whose records had
    #: spot prices only was not read for on-demand (and the other way round).
    markets: frozenset[tuple[str, Market]] = frozenset()
    #: How recent the records of each region are, when they carry dates: the newest
    #: record of each market read there, the oldest of those.
    dated: Mapping[str, datetime] = field(default_factory=dict)
    #: Regions (lower case) whose answer is known to be incomplete (a page that names a
    #: next page that is not there): their prices update rows, but no market there
    #: counts as read, so nothing is marked "not listed" and the region is not re-dated.
    partial: frozenset[str] = frozenset()
    #: Markets read for some instance families only, by (region, market): a mirror's spot
    #: history holds the types someone asked for (``g5.*``), so it says nothing about a
    #: type of another family it lacks.
    families: Mapping[tuple[str, Market], frozenset[str]] = field(default_factory=dict)

    def markets_in(self, region: str) -> frozenset[Market]:
        """The markets the records listed a price in, in ``region``, for every type there
        (none in a region whose answer is incomplete; see :attr:`families`).

        >>> prices = RowPrices({}, frozenset(), markets=frozenset({("eastus", Market.SPOT)}))
        >>> sorted(prices.markets_in("eastus")), sorted(prices.markets_in("westus"))
        ([<Market.SPOT: 'spot'>], [])
        """
        read = self._markets_read(region)
        return frozenset(m for m in read if (region, m) not in self.families)

    def markets_for(self, region: str, instance_type: str) -> frozenset[Market]:
        """The markets read in ``region`` for ``instance_type``: those read for every
        type, and those read for its family.

        >>> spot = frozenset({("us-east-1", Market.SPOT)})
        >>> prices = RowPrices({}, frozenset(), markets=spot,
        ...                    families={("us-east-1", Market.SPOT): frozenset({"g5"})})
        >>> sorted(prices.markets_for("us-east-1", "g5.2xlarge"))
        [<Market.SPOT: 'spot'>]
        >>> sorted(prices.markets_for("us-east-1", "p4d.24xlarge"))
        []
        """
        family = instance_family(instance_type)
        return frozenset(
            m
            for m in self._markets_read(region)
            if family in self.families.get((region, m), frozenset({family}))
        )

    def _markets_read(self, region: str) -> frozenset[Market]:
        if region.lower() in self.partial:
            return frozenset()
        return self._markets_by_region.get(region, frozenset())

    @cached_property
    def _markets_by_region(self) -> Mapping[str, frozenset[Market]]:
        # Asked once per table row by the merge: built once, not per row.
        by_region: dict[str, set[Market]] = {}
        for place, market in self.markets:
            by_region.setdefault(place, set()).add(market)
        return {place: frozenset(markets) for place, markets in by_region.items()}

    @cached_property
    def answered(self) -> frozenset[str]:
        """The regions with fresh prices: those listed, and those of any priced row.

        >>> prices = RowPrices({("eastus", "D2s", None): {}}, frozenset(), frozenset({"westus"}))
        >>> sorted(prices.answered)
        ['eastus', 'westus']
        """
        return self.listed | {region for region, _, _ in self.prices}


def row_prices(
    rows: Iterable[InstancePrice],
    row_price: Callable[[InstancePrice], Mapping[Market, Decimal] | None],
    seen: Iterable[tuple[str, Market]],
    dated: Mapping[tuple[str, Market], datetime] | None = None,
) -> RowPrices:
    """Each row's fresh prices by market (``row_price``: ``None`` for a row the source does not
    cover, an empty mapping for one it covers but lists no price for); ``seen`` and
    ``dated`` as :func:`listed_regions` takes them."""
    rows = list(rows)
    prices: dict[RowKey, dict[Market, Decimal]] = {}
    covered = set()
    for row in rows:
        found = row_price(row)
        if found is None:
            continue
        key = row_key(row)
        covered.add(key)
        if found:
            prices[key] = dict(found)
    return RowPrices(prices, frozenset(covered), **listed_regions(rows, seen, dated))


def listed_regions(
    rows: Iterable[InstancePrice],
    seen: Iterable[tuple[str, Market]],
    dated: Mapping[tuple[str, Market], datetime] | None = None,
) -> dict[str, Any]:
    """The regions of ``rows`` among those records were listed in (``seen``: region and
    market), the markets listed there, and how recent their records are (the newest
    record of each market, the oldest of those over the markets), compared without case
    (Azure's ``armRegionName`` is not always lower case): keyword arguments of
    :class:`RowPrices`."""
    by_lower: dict[str, set[Market]] = {}
    for region, market in seen:
        by_lower.setdefault(region.lower(), set()).add(market)
    regions = {row.region for row in rows if row.region.lower() in by_lower}
    dates: dict[str, datetime] = {}
    for (region, _), moment in (dated or {}).items():
        key = region.lower()
        dates[key] = min(moment, dates.get(key, moment))
    return {
        "listed": frozenset(regions),
        "markets": frozenset((r, m) for r in regions for m in by_lower[r.lower()]),
        "dated": {r: dates[r.lower()] for r in regions if r.lower() in dates},
    }


class CurrencyError(CostguardError):
    """Prices came back in another currency than US dollars."""

    def __init__(self, currency: str, provider: str) -> None:
        super().__init__(
            f"the {provider} prices came back in {currency}, not USD: costguard's tables "
            "are in US dollars",
            hint="ask the API for USD (Azure: currencyCode='USD'; GCP: currency_code=USD), "
            "and download the responses again",
        )


def positive_price(value: Any) -> Decimal | None:
    """A positive finite price, or ``None``. A zero price is a placeholder, not a price."""
    try:
        price = parse_decimal(value)
    except (ValueError, TypeError):
        return None
    return price if price > 0 else None


#: The moment of a record that carries no date: older than any dated one.
UNDATED = datetime.min.replace(tzinfo=UTC)


def keep_newest(
    prices: dict[Any, tuple[datetime, Decimal]], key: Any, price: Decimal, moment: datetime
) -> None:
    # Duplicates come from price changes (the old and the new meter) and from mirrors
    # holding more than one download: the newest effective date is the price in force.
    # Between equally dated ones the higher keeps an estimate on the safe side; either
    # way the result does not depend on record order.
    current = prices.get(key)
    if current is None or (moment, price) > current:
        prices[key] = (moment, price)


#: The newest record date seen per (region, market).
Dated = dict[tuple[str, Market], datetime]


def note_newest(dated: Dated, place: tuple[str, Market], moment: datetime) -> None:
    if moment is not UNDATED and moment > dated.get(place, UNDATED):
        dated[place] = moment


def record_moment(value: Any) -> datetime:
    """A record's date (ISO 8601, ``Z`` or offset; a date-time object) as an aware
    date-time; one that cannot be read counts as undated.

    >>> record_moment("2014-01-06T07:10:55.000Z").isoformat()
    '2014-01-06T07:10:55+00:00'
    >>> record_moment(None) == UNDATED
    True
    """
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return UNDATED
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
