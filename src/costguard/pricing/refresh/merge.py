"""Merge fresh prices into the tables in use, and record where every row came from. Pure.

A refresh replaces only the rows of the providers and regions it read prices for (a
region the API or mirror listed nothing in was not read, nor, for one table, a region
where the answer priced none of that table's rows); every other row, and the
storage, transfer and regions tables, are carried over from the tables in use (bundled
or cache) as they were, with their date and source, and the table metadata says so. The
rules for one row (:func:`merge_row`):

* a fresh price replaces the old one and is ``listed``;
* a price the API should list but did not is kept, flagged ``unverified``, with a note
  (a budget tool should not silently lose a price, nor pass an old one off as new);
* a row the API does not price at all (GCP TPUs are not Compute Engine SKUs) is kept;
* a spot price above on-demand is left out, as the loader refuses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from enum import StrEnum

from costguard.pricing.catalog import (
    INSTANCE_TABLES,
    REQUIRED_TABLES,
    Catalog,
    GpuPart,
    InstancePrice,
    Market,
    PriceStatus,
    TableInfo,
    TablePart,
)
from costguard.pricing.check import mark_suspects
from costguard.pricing.refresh.parse import RowPrices, row_key


@dataclass(frozen=True)
class Target:
    """What to refresh for one provider: its regions, and the table rows in them.

    A region the tables do not cover yet gets ``new_rows``: the provider's instance
    types (as the tables carry them elsewhere) with no price; those the API prices there
    join the tables, the others are left out.
    """

    provider: str
    regions: tuple[str, ...]
    rows: tuple[InstancePrice, ...]
    new_rows: tuple[InstancePrice, ...] = ()

    def instance_types(self, region: str) -> list[str]:
        """The instance types of the rows in ``region``, sorted, each once."""
        return sorted({row.instance_type for row in self.rows if row.region == region})

    def read(
        self,
        rows: RowPrices,
        *,
        source: str,
        fetched_at: datetime,
        records: int,
        dated: Mapping[str, date],
        markets: frozenset[Market] = frozenset(Market),
    ) -> FreshPrices:
        """What a price source read for this target (every market, unless ``markets``)."""
        return FreshPrices(
            self.provider,
            frozenset(self.regions),
            markets,
            rows,
            source,
            fetched_at,
            records,
            dated=dated,
        )


@dataclass(frozen=True)
class FreshPrices:
    """What one provider's refresh read: prices for its rows, from which API, when."""

    provider: str
    regions: frozenset[str]  # asked for; see `answered` for those prices came back for
    markets: frozenset[Market]  # read from a mirror without spot history: on-demand only
    rows: RowPrices
    source: str  # the API and its endpoint (or the mirror folder)
    fetched_at: datetime
    records: int  # API records read (products, SKUs, price items)
    #: Rows for regions the tables did not cover (:attr:`Target.new_rows`).
    new_rows: tuple[InstancePrice, ...] = ()
    #: How old the prices read for each region are, when not as old as ``fetched_at``:
    #: a mirror's download date, or the dates its records carry (see
    #: :func:`costguard.pricing.refresh.mirror.as_of`). Never the day of the run.
    dated: Mapping[str, date] = field(default_factory=dict)

    def as_of(self, region: str) -> date:
        """How old the prices read for ``region`` are."""
        return self.dated.get(region) or self.fetched_at.date()

    def markets_in(self, region: str) -> frozenset[Market]:
        """The markets read in ``region`` for every type: those asked for that the
        records listed prices in there (spot history alone does not make a region's
        on-demand read)."""
        return self.markets & self.rows.markets_in(region)

    def markets_for(self, row: InstancePrice) -> frozenset[Market]:
        """The markets read for ``row``'s type in its region (a mirror's spot history is
        about the families it holds)."""
        return self.markets & self.rows.markets_for(row.region, row.instance_type)

    @property
    def answered(self) -> frozenset[str]:
        """The regions asked for that prices came back for: only these are refreshed."""
        return self.regions & self.rows.answered

    @property
    def unanswered(self) -> frozenset[str]:
        """The regions asked for that nothing came back for: kept as they were."""
        return self.regions - self.rows.answered


class RowOutcome(StrEnum):
    """What a refresh did to one row."""

    UPDATED = "updated"  # at least one fresh price
    NOT_FOUND = "not found"  # the API should price it but did not list it: flagged
    KEPT = "kept"  # the API does not price such rows: kept as they were


@dataclass(frozen=True)
class MergeStats:
    """Rows per outcome, for one provider."""

    updated: int = 0
    not_found: int = 0
    kept: int = 0

    def add(self, outcome: RowOutcome) -> MergeStats:
        """These counts with one more row of ``outcome``."""
        field_name = outcome.name.lower()
        return replace(self, **{field_name: getattr(self, field_name) + 1})


@dataclass(frozen=True)
class TableMeta:
    """One entry of the index (``tables.toml``) of the tables a refresh writes."""

    name: str
    file: str
    as_of: date
    source: str
    refreshed_at: datetime | None = None
    parts: Mapping[tuple[str, str], TablePart] = field(default_factory=dict)


@dataclass(frozen=True)
class MergedTables:
    """The tables to write: new instance rows, every table's metadata, per-provider counts."""

    instances: Mapping[str, tuple[InstancePrice, ...]]  # gpu_instances, cpu_instances
    meta: tuple[TableMeta, ...]  # every table, in REQUIRED_TABLES order
    stats: Mapping[str, MergeStats]


def merge_row(row: InstancePrice, fresh: FreshPrices) -> tuple[InstancePrice, RowOutcome]:
    """One row after a refresh of its provider and region (see the module docstring).

    >>> from decimal import Decimal as D
    >>> from datetime import UTC
    >>> from costguard.pricing.refresh.parse import RowPrices, row_key
    >>> row = InstancePrice("aws", "us-east-1", "g5.xlarge", "A10G", 1, D(4), D(16),
    ...                     D("1.006"), D("0.4246"), PriceStatus.LISTED, PriceStatus.LISTED)
    >>> read = frozenset(("us-east-1", m) for m in Market)
    >>> fresh = FreshPrices("aws", frozenset({"us-east-1"}), frozenset(Market),
    ...     RowPrices({row_key(row): {Market.ON_DEMAND: D("1.1")}}, frozenset({row_key(row)}),
    ...               markets=read),
    ...     "test", datetime(2026, 12, 1, tzinfo=UTC), 1)
    >>> new, outcome = merge_row(row, fresh)
    >>> new.ondemand_usd_per_hour, new.spot_status, outcome
    (Decimal('1.1'), <PriceStatus.UNVERIFIED: 'unverified'>, <RowOutcome.UPDATED: 'updated'>)
    """
    key = row_key(row)
    if key not in fresh.rows.covered:
        return row, RowOutcome.KEPT
    found = fresh.rows.prices.get(key, {})
    day = fresh.as_of(row.region).isoformat()
    read = fresh.markets_for(row)
    prices = {
        Market.ON_DEMAND: (row.ondemand_usd_per_hour, row.ondemand_status),
        Market.SPOT: (row.spot_usd_per_hour, row.spot_status),
    }
    notes: list[str] = []
    kept_old = False
    for market in Market:
        old_price, _ = prices[market]
        if market in found:
            prices[market] = (found[market], PriceStatus.LISTED)
        elif market in read and old_price is not None:
            prices[market] = (old_price, PriceStatus.UNVERIFIED)
            notes.append(f"{market} not listed by the API on {day}: kept {old_price} from before")
            kept_old = True
        elif market not in read and old_price is not None:
            kept_old = True
    (ondemand, ondemand_status), (spot, spot_status) = prices[Market.ON_DEMAND], prices[Market.SPOT]
    if ondemand is not None and spot is not None and spot > ondemand:
        notes.append(f"spot {spot} above on-demand {ondemand}: spot left out")
        spot, spot_status = None, None
    if (kept_old or not found) and row.note:
        notes.append(row.note)  # it still explains the prices that were kept
    read_on = fresh.as_of(row.region)  # a price read now is dated by its read
    merged = row._replace(
        ondemand_usd_per_hour=ondemand,
        ondemand_status=ondemand_status if ondemand is not None else None,
        spot_usd_per_hour=spot,
        spot_status=spot_status if spot is not None else None,
        note="; ".join(notes),
        as_of=read_on if Market.ON_DEMAND in found else row.as_of,
        spot_as_of=read_on if Market.SPOT in found else row.spot_as_of,
        source=fresh.source if found else row.source,
    )
    return merged, RowOutcome.UPDATED if found else RowOutcome.NOT_FOUND


def merge_tables(
    catalog: Catalog,
    fresh: Sequence[FreshPrices],
    refreshed_at: datetime,
    gpu_parts: Sequence[GpuPart] = (),
) -> MergedTables:
    """The tables after merging ``fresh`` (one entry per provider that refreshed); the
    rows read are checked with the ``gpu_parts`` too (a total without its host)."""
    by_provider = {f.provider: f for f in fresh}
    stats = {f.provider: MergeStats() for f in fresh}
    instances: dict[str, tuple[InstancePrice, ...]] = {}
    meta: list[TableMeta] = []
    read: set[tuple[str, str]] = set()  # the places whose rows this refresh merged
    for name in REQUIRED_TABLES:
        info = catalog.tables[name]
        if name not in INSTANCE_TABLES:
            meta.append(_kept_table(info, catalog.origin))
            continue
        rows = []
        parts: dict[tuple[str, str], TablePart] = {}
        table_rows = list(_table_rows(catalog, name))
        # An answer that priced rows of the other table only, in a region, is about those
        # types (m5.large's spot history): it neither flags this table's rows there nor
        # re-dates them. One that priced no row of either table read the region (its
        # sizes are gone) and flags them.
        elsewhere = priced_places(catalog, by_provider, name, other=True)
        here = priced_places(catalog, by_provider, name)
        for row in table_rows:
            provider_fresh = by_provider.get(row.provider)
            place = (row.provider, row.region)
            if (
                provider_fresh is None
                or row.region not in provider_fresh.answered
                or (place in elsewhere and place not in here)
            ):
                rows.append(row)
                parts.setdefault(place, _kept_part(info, place, catalog.origin))
                continue
            merged, outcome = merge_row(row, provider_fresh)
            rows.append(merged)
            read.add(place)
            stats[row.provider] = stats[row.provider].add(outcome)
            parts[place] = _fresh_part(info, place, provider_fresh, catalog.origin)
        for new in _new_rows(fresh, name):
            provider_fresh = by_provider[new.provider]
            merged, outcome = merge_row(new, provider_fresh)
            if outcome is RowOutcome.UPDATED:  # a type the API does not sell there stays out
                rows.append(merged)
                stats[new.provider] = stats[new.provider].add(outcome)
                place = (new.provider, new.region)
                read.add(place)
                parts[place] = _fresh_part(info, place, provider_fresh, catalog.origin)
        instances[name] = tuple(sorted(rows, key=_sort_key))
        meta.append(
            TableMeta(
                name=name,
                file=info.path.name,
                as_of=min((p.as_of for p in parts.values()), default=info.as_of),
                source=summarise_sources(parts),
                refreshed_at=refreshed_at,
                parts=parts,
            )
        )
    # A price a refresh read is checked against the others before it is written.
    checked = mark_suspects(
        [row for table in INSTANCE_TABLES for row in instances[table]],
        lambda row: (row.provider, row.region) in read,
        gpu_parts,
    )
    for table in INSTANCE_TABLES:
        instances[table] = tuple(_in_table(checked, table))
    return MergedTables(instances=instances, meta=tuple(meta), stats=stats)


def _new_rows(fresh: Sequence[FreshPrices], name: str) -> Iterable[InstancePrice]:
    gpu = name == "gpu_instances"
    for provider_fresh in fresh:
        for row in provider_fresh.new_rows:
            if (row.accelerator is not None) == gpu and row.region in provider_fresh.answered:
                yield row


def new_rows(catalog: Catalog, provider: str, region: str) -> tuple[InstancePrice, ...]:
    """Rows to price in a region the tables do not cover: each instance type the tables
    carry for ``provider`` elsewhere (shape and GPUs as there), with no price.

    >>> from costguard.pricing.tables import load_catalog
    >>> rows = new_rows(load_catalog(), "azure", "uksouth")
    >>> len(rows) > 0 and all(r.ondemand_usd_per_hour is None for r in rows)
    True
    """
    shapes: dict[tuple[str, str | None], InstancePrice] = {}
    for row in catalog.instances:
        if row.provider == provider:
            shapes.setdefault((row.instance_type, row.accelerator), row)
    return tuple(
        row._replace(
            region=region,
            ondemand_usd_per_hour=None,
            spot_usd_per_hour=None,
            ondemand_status=None,
            spot_status=None,
            note="",
        )
        for row in sorted(shapes.values(), key=_sort_key)
    )


def priced_places(
    catalog: Catalog, fresh: Mapping[str, FreshPrices], name: str, *, other: bool = False
) -> set[tuple[str, str]]:
    """The (provider, region) places where ``fresh`` priced a row of the instance table
    ``name`` (``other``: of the other instance tables)."""
    tables = [t for t in INSTANCE_TABLES if (t != name) == other]
    return {
        (row.provider, row.region)
        for table in tables
        for row in _table_rows(catalog, table)
        if row.provider in fresh and row_key(row) in fresh[row.provider].rows.prices
    }


def _table_rows(catalog: Catalog, name: str) -> Iterable[InstancePrice]:
    return _in_table(catalog.instances, name)


def _in_table(rows: Iterable[InstancePrice], name: str) -> Iterable[InstancePrice]:
    gpu = name == "gpu_instances"
    return (row for row in rows if (row.accelerator is not None) == gpu)


def _sort_key(row: InstancePrice) -> tuple[str, str, str, str]:
    return (row.provider, row.region, row.instance_type, row.accelerator or "")


def _kept_part(info: TableInfo, place: tuple[str, str], origin: str) -> TablePart:
    part = info.part(*place)
    if place in info.parts and origin == "cache":
        return part  # a part a refresh wrote says where it came from
    return TablePart(part.as_of, f"{part.source} (kept from the {origin} tables)")


def _fresh_part(
    info: TableInfo, place: tuple[str, str], fresh: FreshPrices, origin: str
) -> TablePart:
    read = fresh.markets_in(place[1])
    as_of = fresh.as_of(place[1])
    if read == frozenset(Market):
        return TablePart(as_of, fresh.source)
    # Only some markets were read (none, from an incomplete answer): the rows are as old
    # as the oldest of their parts.
    kept = _kept_part(info, place, origin)
    some = [
        f"{market} of {', '.join(sorted(families))}"
        for (region, market), families in sorted(fresh.rows.families.items())
        if region == place[1] and market in fresh.markets
    ]
    markets = ", ".join([*sorted(read), *some]) or "some rows (an incomplete answer)"
    return TablePart(
        min(kept.as_of, as_of), f"{markets} from {fresh.source}; the rest: {kept.source}"
    )


def _kept_table(info: TableInfo, origin: str) -> TableMeta:
    source = info.source
    if origin != "cache":
        source = f"{source} (kept from the {origin} tables: refresh updates instance prices only)"
    return TableMeta(name=info.name, file=info.path.name, as_of=info.as_of, source=source)


def summarise_sources(parts: Mapping[tuple[str, str], TablePart]) -> str:
    """One line naming each provider's sources, with the regions when they differ.

    >>> summarise_sources({("aws", "us-east-1"): TablePart(date(2026, 12, 1), "API"),
    ...                    ("aws", "us-west-2"): TablePart(date(2026, 11, 30), "old"),
    ...                    ("gcp", "us-central1"): TablePart(date(2026, 12, 1), "API")})
    'aws us-east-1: API; aws us-west-2: old; gcp: API'
    """
    by_provider: dict[str, dict[str, list[str]]] = {}
    for (provider, region), part in sorted(parts.items()):
        by_provider.setdefault(provider, {}).setdefault(part.source, []).append(region)
    lines = []
    for provider, sources in by_provider.items():
        for source, regions in sources.items():
            where = provider if len(sources) == 1 else f"{provider} {', '.join(regions)}"
            lines.append(f"{where}: {source}")
    return "; ".join(lines)
