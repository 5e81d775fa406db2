"""The price tables as plain, immutable values: instance prices, storage and transfer
rates, regions, where each table came from, and how stale the prices are. Pure: reading
and validating the files is :mod:`costguard.pricing.tables`.

The rows are named tuples (change one with ``row._replace(...)``): every
``costguard estimate`` defines these classes and builds a few thousand rows before it
prints, and a named tuple costs a tenth of a frozen dataclass to define and a third to
build.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from costguard.errors import UnknownNameError
from costguard.shell import command

PROVIDERS = ("aws", "gcp", "azure")
#: The provider name that prices a SLURM allocation instead of a cloud
#: (:mod:`costguard.pricing.slurm`).
SLURM = "slurm"
INSTANCE_TABLES = ("gpu_instances", "cpu_instances")
REQUIRED_TABLES = (*INSTANCE_TABLES, "storage", "transfer", "regions")
#: The columns of the instance tables, in their order in the files.
INSTANCE_COLUMNS = (
    "provider",
    "region",
    "instance_type",
    "accelerator",
    "accelerator_count",
    "vcpus",
    "memory_gib",
    "ondemand_usd_per_hour",
    "spot_usd_per_hour",
    "ondemand_status",
    "spot_status",
    "note",
)
#: Optional columns of the instance tables: the date of the row's on-demand price (or
#: of the row, when it has no on-demand price), of its spot price when that differs,
#: and the source of the row's figures (an id of the "Row sources" list in
#: pricing/README.md). ``unknown`` is a date no source gives; a blank date is the date
#: of the row's table part (``tables.toml``), as in tables written before these columns.
ROW_DATE_COLUMNS = ("as_of", "spot_as_of", "source")
#: How an unknown date is written and shown.
UNKNOWN_DATE = "unknown"


class Market(StrEnum):
    """How an instance is bought."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"


class PriceStatus(StrEnum):
    """How far a price can be trusted (see pricing/README.md)."""

    LISTED = "listed"  # as the source lists it, no known problem
    CORRECTED = "corrected"  # the source was wrong; fixed from a provider list price
    ASSUMED = "assumed"  # copied from a neighbouring region with the same price tier
    UNVERIFIED = "unverified"  # suspect or from memory; treat as a rough figure

    @property
    def verified(self) -> bool:
        """Whether a sentence may name this price as an answer: a list price as read
        (``listed``) or as a second source corrected it (``corrected``), which
        ``costguard pricing check`` passes (a suspect row is never left ``listed``)."""
        return self in (PriceStatus.LISTED, PriceStatus.CORRECTED)


class InstancePrice(NamedTuple):
    """One instance type in one region, with its hourly prices per market."""

    provider: str
    region: str
    instance_type: str
    accelerator: str | None
    accelerator_count: int
    vcpus: Decimal | None  # blank for TPU rows
    memory_gib: Decimal | None
    ondemand_usd_per_hour: Decimal | None
    spot_usd_per_hour: Decimal | None
    ondemand_status: PriceStatus | None
    spot_status: PriceStatus | None
    note: str = ""
    #: The price dates (``None``: unknown) and source of this row; the loader fills them
    #: from the row's table part when the file leaves them blank.
    as_of: date | None = None
    spot_as_of: date | None = None
    source: str = ""

    def usd_per_hour(self, market: Market) -> Decimal | None:
        """The hourly price in ``market``, or ``None`` when it is not offered there."""
        if market is Market.SPOT:
            return self.spot_usd_per_hour
        return self.ondemand_usd_per_hour

    def status(self, market: Market) -> PriceStatus | None:
        """How trustworthy the price in ``market`` is."""
        return self.spot_status if market is Market.SPOT else self.ondemand_status

    def price_as_of(self, market: Market) -> date | None:
        """The as-of date of the price in ``market`` (``None``: unknown)."""
        return self.spot_as_of if market is Market.SPOT else self.as_of


class StorageRate(NamedTuple):
    """A block-storage or object-storage price in one region.

    ``unit`` is ``GB-month``, ``GiB-month`` or ``disk-month``; a ``disk-month`` price is
    for a whole disk of ``disk_size_gib`` (Azure managed-disk tiers).
    """

    provider: str
    region: str
    kind: str  # "block" | "object"
    sku: str
    unit: str
    disk_size_gib: Decimal | None
    usd: Decimal
    status: PriceStatus
    as_of: date
    source: str


class TransferRate(NamedTuple):
    """A per-GB (or per-GiB) data-transfer price out of one region.

    ``kind`` is ``internet_egress`` (destination ``internet``) or ``inter_region``
    (destination ``same-continent``, ``other-continent``, a continent of ``regions.csv``
    such as ``europe``, ``any``, or a region name for a
    special pair such as us-east-1 <-> us-east-2).
    """

    provider: str
    region: str
    kind: str
    destination: str
    unit: str  # "GB" | "GiB"
    usd: Decimal
    status: PriceStatus
    as_of: date
    source: str


class GpuPart(NamedTuple):
    """What one GPU costs alone in one region, where the cloud bills it apart from the
    host VM's vCPUs and memory (``gpu_parts.csv``): a machine's total there is the host
    plus its GPUs at this price, so a total that is the GPUs alone lacks its host."""

    provider: str
    region: str
    accelerator: str
    ondemand_usd_per_gpu_hour: Decimal
    spot_usd_per_gpu_hour: Decimal | None
    as_of: date
    source: str


class Region(NamedTuple):
    """A provider region and the continent it is on (transfer prices depend on it)."""

    provider: str
    name: str
    continent: str
    location: str

    def __str__(self) -> str:
        return f"{self.provider}:{self.name}"


class TablePart(NamedTuple):
    """How old the rows of one provider and region are, and where they came from."""

    as_of: date
    source: str


class TableInfo(NamedTuple):
    """Where one table came from and how old it is.

    A table rebuilt by ``costguard pricing refresh`` also says when, and has a part per
    provider and region: a refresh of one provider or region carries the others over
    as they were, so their rows keep their own date and source.
    """

    name: str
    path: Path
    as_of: date
    source: str
    refreshed_at: datetime | None = None
    parts: Mapping[tuple[str, str], TablePart] = MappingProxyType({})

    def part(self, provider: str, region: str) -> TablePart:
        """The date and source of this table's rows for one provider and region."""
        return self.parts.get((provider, region)) or TablePart(self.as_of, self.source)


@dataclass(frozen=True)
class Catalog:
    """All price tables, loaded and validated. Lookups are pure."""

    instances: tuple[InstancePrice, ...]
    storage: tuple[StorageRate, ...]
    transfer: tuple[TransferRate, ...]
    regions: tuple[Region, ...]
    tables: Mapping[str, TableInfo]
    directory: Path
    origin: str = "bundled"  # "bundled", "cache" (costguard pricing refresh) or "directory"

    @property
    def as_of(self) -> date:
        """The as-of date of the instance price tables (the figure users care most about)."""
        return min(self.tables[name].as_of for name in INSTANCE_TABLES if name in self.tables)

    @cached_property
    def covered(self) -> frozenset[tuple[str, str]]:
        """The (provider, region) pairs the instance tables have prices for; the other
        regions of ``regions.csv`` are known but not covered (see :func:`refresh_hint`)."""
        return frozenset((i.provider, i.region) for i in self.instances)

    @cached_property
    def _rows(self) -> dict[tuple[str, str, str], InstancePrice]:
        return {(i.provider, i.region, i.instance_type): i for i in self.instances}

    def row(self, provider: str, region: str, instance_type: str) -> InstancePrice | None:
        """The instance row of ``instance_type`` in a region, if the tables have it."""
        return self._rows.get((provider, region, instance_type))

    def uncovered(self, provider: str | None = None) -> list[Region]:
        """The known regions (of ``provider``) the instance tables have no prices for."""
        return [
            r
            for r in self.regions
            if (provider is None or r.provider == provider)
            and (r.provider, r.name) not in self.covered
        ]

    @cached_property
    def accelerators(self) -> tuple[str, ...]:
        """Every accelerator name in the instance tables."""
        return tuple(sorted({i.accelerator for i in self.instances if i.accelerator}))

    @cached_property
    def _region_index(self) -> dict[tuple[str, str], Region]:
        return {(region.provider, region.name): region for region in self.regions}

    def region(self, provider: str, name: str) -> Region:
        """The region ``name`` of ``provider``; :class:`UnknownNameError` if not in the tables."""
        found = self._region_index.get((provider, name))
        if found is None:
            known = [r.name for r in self.regions if r.provider == provider]
            raise UnknownNameError(kind=f"{provider} region", name=name, known=known)
        return found

    def find_region(self, name: str) -> Region:
        """Resolve ``region`` or ``provider:region`` across providers.

        Region names do not collide across AWS, GCP and Azure, so the provider is
        implied; the ``provider:`` prefix is accepted for clarity.
        """
        provider, _, bare = name.strip().rpartition(":")
        if provider:
            check_provider(provider)
            return self.region(provider, bare)
        matches = [r for r in self.regions if r.name == bare]
        if not matches:
            raise UnknownNameError(kind="region", name=bare, known=[r.name for r in self.regions])
        return matches[0]

    @cached_property
    def _storage_index(self) -> dict[tuple[str, str, str], list[StorageRate]]:
        index: dict[tuple[str, str, str], list[StorageRate]] = {}
        for rate in self.storage:
            index.setdefault((rate.provider, rate.region, rate.kind), []).append(rate)
        return index

    def storage_rates(self, provider: str, region: str, kind: str) -> list[StorageRate]:
        """Storage prices of ``kind`` (block/object) in a region, smallest disk first."""
        rates = self._storage_index.get((provider, region, kind), [])
        return sorted(rates, key=lambda s: s.disk_size_gib or Decimal(0))

    @cached_property
    def _transfer_index(self) -> dict[tuple[str, str, str, str], TransferRate]:
        index: dict[tuple[str, str, str, str], TransferRate] = {}
        for rate in self.transfer:  # the first of two rows for one route, as a scan finds
            index.setdefault((rate.provider, rate.region, rate.kind, rate.destination), rate)
        return index

    def transfer_rate(
        self, provider: str, region: str, kind: str, destination: str
    ) -> TransferRate | None:
        """The transfer price out of ``region`` to ``destination``, if the table has one."""
        return self._transfer_index.get((provider, region, kind, destination))


#: What ``costguard pricing refresh`` needs, per provider, to read a region's prices.
REFRESH_NEEDS = {
    "aws": "needs AWS credentials for the Price List API",
    "gcp": "needs Google Cloud credentials for the Cloud Billing Catalog API",
    "azure": "needs no account: the Azure Retail Prices API is public",
}


def refresh_hint(provider: str, regions: Iterable[str]) -> str:
    """The command that adds prices for regions the tables do not cover (a few by name;
    more: the whole provider, which covers every region it knows).

    >>> refresh_hint("azure", ["uksouth"])  # doctest: +ELLIPSIS
    '`costguard pricing refresh --provider azure --region uksouth` adds them (needs no account...)'
    >>> refresh_hint("gcp", ["a", "b", "c", "d"])  # doctest: +ELLIPSIS
    '`costguard pricing refresh --provider gcp` adds them (needs Google Cloud credentials...)'
    """
    names = list(regions)
    named = [word for r in names for word in ("--region", r)] if len(names) <= 3 else []
    refresh = command("costguard", "pricing", "refresh", "--provider", provider, *named)
    return f"{refresh} adds them ({REFRESH_NEEDS[provider]})"


def table_rows(catalog: Catalog, table: str) -> list[dict[str, Any]]:
    """The rows of one table as plain records (dates as ISO strings, enums as values)."""
    records: Sequence[InstancePrice | StorageRate | TransferRate | Region]
    if table == "gpu_instances":
        records = [i for i in catalog.instances if i.accelerator]
    elif table == "cpu_instances":
        records = [i for i in catalog.instances if not i.accelerator]
    elif table == "storage":
        records = catalog.storage
    elif table == "transfer":
        records = catalog.transfer
    else:
        records = catalog.regions
    return [_plain(r._asdict()) for r in records]


def _plain(record: dict[str, Any]) -> dict[str, Any]:
    plain = {
        k: (v.isoformat() if hasattr(v, "isoformat") else str(v) if hasattr(v, "value") else v)
        for k, v in record.items()
    }
    for name in ("as_of", "spot_as_of"):  # an instance row's price dates
        if name in plain and plain[name] is None:
            plain[name] = UNKNOWN_DATE
    return plain


def check_provider(name: str) -> str:
    """Validate a provider name (``aws``, ``gcp``, ``azure``), case-insensitively."""
    lowered = name.strip().lower()
    if lowered not in PROVIDERS:
        raise UnknownNameError(kind="provider", name=name, known=PROVIDERS)
    return lowered


#: A table older than this many days draws a warning; spot prices move faster.
STALE_AFTER_DAYS = 30
SPOT_STALE_AFTER_DAYS = 7

#: Where a figure shown was priced from: ``(table, provider, region, market)``, or with
#: the instance type as a fifth item, which dates it by its own row (its price date)
#: rather than by the table part of its region.
Place = tuple[Any, ...]


def price_date(catalog: Catalog, place: Place) -> date | None:
    """The as-of date of the price at ``place`` (``None``: unknown): its row's own date
    for that market when the place names an instance type the tables have, else the
    date of the table part (provider and region) it is in. Pure."""
    table, provider, region, market = place[:4]
    if len(place) > 4:
        row = catalog.row(provider, region, place[4])
        if row is not None:
            return row.price_as_of(Market(market))
    return catalog.tables[table].part(provider, region).as_of


def as_of_text(day: date | None) -> str:
    """A price date as shown: ISO, or ``unknown``.

    >>> as_of_text(None), as_of_text(date(2026, 8, 26))
    ('unknown', '2026-08-26')
    """
    return UNKNOWN_DATE if day is None else day.isoformat()


class Staleness(NamedTuple):
    """How many of the prices an answer shows are past their threshold, and from when.

    ``oldest`` is the oldest known date among them (``None`` when all are unknown),
    ``newest`` the newest; ``unknown`` of them have no known date (counted as old).
    """

    old: int
    shown: int
    oldest: date | None
    newest: date | None
    unknown: int
    spot_only: bool  # only spot prices are past theirs (on-demand ones are not)

    def age_days(self, today: date) -> int | None:
        """The age of the oldest known stale price on ``today``."""
        return None if self.oldest is None else (today - self.oldest).days


def staleness(
    catalog: Catalog,
    places: Iterable[Place],
    today: date,
    *,
    max_age_days: int = STALE_AFTER_DAYS,
    spot_max_age_days: int = SPOT_STALE_AFTER_DAYS,
) -> Staleness | None:
    """Whether the prices used for ``places`` are too old; pure.

    ``places`` are the :data:`Place` of the figures shown. A price is stale when its date
    is older than ``max_age_days``, or ``spot_max_age_days`` for a spot price, or unknown.
    Returns how many are, of how many, and from when; ``None`` when none is.

    >>> from costguard.pricing.tables import load_catalog
    >>> catalog = load_catalog()
    >>> place = ("gpu_instances", "aws", "us-east-1", Market.ON_DEMAND, "g5.xlarge")
    >>> staleness(catalog, [place], date(2026, 8, 26)) is None
    True
    >>> stale = staleness(catalog, [place], date(2027, 1, 1))
    >>> stale.old, stale.shown, stale.oldest, stale.unknown
    (1, 1, datetime.date(2026, 8, 26), 0)
    """
    stale: list[tuple[date | None, Market]] = []
    shown = 0
    for place in places:
        shown += 1
        market = Market(place[3])
        as_of = price_date(catalog, place)
        limit = spot_max_age_days if market is Market.SPOT else max_age_days
        if as_of is None or (today - as_of).days > limit:
            stale.append((as_of, market))
    if not stale:
        return None
    known = [as_of for as_of, _ in stale if as_of is not None]
    spot_only = all(
        market is Market.SPOT and as_of is not None and (today - as_of).days <= max_age_days
        for as_of, market in stale
    )
    return Staleness(
        old=len(stale),
        shown=shown,
        oldest=min(known, default=None),
        newest=max(known, default=None),
        unknown=len(stale) - len(known),
        spot_only=spot_only,
    )


def stale_summary(stale: Staleness, today: date) -> str:
    """The staleness warning's words: how many of the prices shown are old, from when.

    >>> s = Staleness(3, 10, date(2026, 2, 24), date(2026, 8, 20), 1, False)
    >>> stale_summary(s, date(2026, 12, 6))
    '3 of 10 prices shown are old: from 2026-02-24 (285 days) to 2026-08-20, 1 of unknown date'
    """
    what = "spot prices" if stale.spot_only else "prices"
    parts: list[str] = []
    if stale.oldest is not None and stale.newest is not None:
        span = f"from {stale.oldest.isoformat()} ({stale.age_days(today)} days)"
        if stale.newest != stale.oldest:
            span += f" to {stale.newest.isoformat()}"
        parts.append(span)
    if stale.unknown:
        parts.append(f"{stale.unknown} of unknown date")
    return f"{stale.old} of {stale.shown} {what} shown are old: {', '.join(parts)}"


def undated_prices(catalog: Catalog) -> dict[str, int]:
    """How many instance prices of each provider have no known date (each market of a
    row counts). Pure.

    >>> from costguard.pricing.tables import load_catalog
    >>> undated_prices(load_catalog())["aws"] > 0  # AWS spot prices of SkyPilot's copy
    True
    """
    counts = dict.fromkeys(PROVIDERS, 0)
    for row in catalog.instances:
        for market in Market:
            if row.usd_per_hour(market) is not None and row.price_as_of(market) is None:
                counts[row.provider] += 1
    return counts


def source_dates(catalog: Catalog) -> dict[str, tuple[date, date]]:
    """The oldest and newest known price dates of each provider's instance rows (a
    provider whose every date is unknown is left out). Pure.

    >>> from costguard.pricing.tables import load_catalog
    >>> source_dates(load_catalog())["aws"][1]
    datetime.date(2026, 8, 26)
    """
    dates: dict[str, list[date]] = {}
    for row in catalog.instances:
        for market in Market:
            day = row.price_as_of(market)
            if row.usd_per_hour(market) is not None and day is not None:
                dates.setdefault(row.provider, []).append(day)
    return {p: (min(dates[p]), max(dates[p])) for p in PROVIDERS if p in dates}


def prices_as_of(catalog: Catalog, places: Iterable[Place]) -> date | None:
    """How old the prices used for ``places`` are: the oldest of their dates
    (:func:`price_date`; ``None`` when one is unknown); the instance tables' oldest date
    (:attr:`Catalog.as_of`) when there are none. Pure.

    After a refresh of some regions, a figure priced from a refreshed region is as old
    as that refresh, not as old as the oldest region in the tables.

    >>> from costguard.pricing.tables import load_catalog
    >>> catalog = load_catalog()
    >>> place = ("gpu_instances", "aws", "us-east-1", Market.ON_DEMAND, "g5.xlarge")
    >>> prices_as_of(catalog, [place])
    datetime.date(2026, 8, 26)
    """
    dates = [price_date(catalog, place) for place in places]
    if not dates:
        return catalog.as_of
    if any(day is None for day in dates):
        return None
    return min(day for day in dates if day is not None)


def rows_as_of(catalog: Catalog, table: str, rows: Iterable[Mapping[str, Any]]) -> date | None:
    """How old the :func:`table_rows` ``rows`` of ``table`` are: for an instance table the
    oldest date of their prices (:func:`prices_as_of`), else the table's. Pure.

    >>> from costguard.pricing.tables import load_catalog
    >>> catalog = load_catalog()
    >>> rows = [{"provider": "aws", "region": "us-east-1", "instance_type": "g5.xlarge",
    ...          "ondemand_usd_per_hour": "1.006"}]
    >>> rows_as_of(catalog, "gpu_instances", rows)
    datetime.date(2026, 8, 26)
    """
    if table not in INSTANCE_TABLES:
        # storage and transfer rows carry their own dates; regions is dated as a whole
        dated = [r["as_of"] for r in rows if r.get("as_of")]
        if not dated:
            return catalog.tables[table].as_of
        return min(date.fromisoformat(str(day)) for day in dated)
    columns = ((Market.ON_DEMAND, "ondemand_usd_per_hour"), (Market.SPOT, "spot_usd_per_hour"))
    places = [
        (table, r["provider"], r["region"], market, r["instance_type"])
        for r in rows
        for market, column in columns
        if r.get(column) is not None
    ]
    return prices_as_of(catalog, places)
