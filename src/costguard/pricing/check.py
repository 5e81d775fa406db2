"""Flag suspect rows of the instance tables (``costguard pricing check``). Pure.

A price table copied from a catalogue, or rebuilt from an API, can be wrong in ways a
single row does not show. :func:`check_instances` looks at each row against the others:

* ``spot-not-cheaper``: a spot price at or above on-demand (a cap, not a discount);
* ``zero-price``: a $0 price (a catalogue's placeholder, never a real price);
* ``spot-placeholder``: a spot price exactly a tenth of on-demand (the pattern a
  catalogue writes where it read no market price: every zone, every size alike);
* ``regional-outlier``: a price per GPU far from the same GPU's on the same cloud, in
  the sizes of its family that have the same shape per GPU, over the other regions and
  sizes (GCP europe-west4 A100s were 0.66x; AWS us-east-1 p4d spot 0.25x). On-demand
  and spot, each against its own market, spot with wider bounds (it moves by the hour);
* ``family-sum``: in a family whose shape grows with the GPU count (``a2-highgpu-1g`` ..
  ``-8g``), a size whose price per GPU disagrees with its siblings' in the same region
  (a host or GPU part missing from the sum);
* ``gpu-count``: a GPU count that disagrees with the instance type's name (GCP ``-8g``);
* ``older-than-source``: a row whose note cites a source dated after the row's own date
  (the table part it is in): the newer source was not read into it;
* ``missing-host``: where the cloud bills a GPU apart from the host VM's vCPUs and
  memory (a GPU part of ``gpu_parts.csv``: GCP), a machine whose on-demand total leaves
  (next to) nothing for its host once its GPUs are paid (GCP a4-highgpu-8g: $90.216, the
  eight B200s alone). Its spot price, built the same way, is flagged with it.

A finding on a row whose price for that market is already marked ``unverified`` or
``corrected`` with a note is *known*: the estimate shows that note, and no sentence
names it as an answer. Other findings are *new*: a table is clean when it has none (a
test runs the check on the bundled tables).
"""

from __future__ import annotations

import bisect
import functools
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from costguard.pricing.catalog import Catalog, GpuPart, InstancePrice, Market, PriceStatus

#: A price per GPU below this fraction of the same GPU's median over the other regions
#: and sizes of its family (same shape per GPU), or above the upper one, is an outlier.
#: Regional list prices of one machine type spread about 0.9x-1.4x of the median (Sao
#: Paulo, Zurich and Tokyo at the top); a half-price region is a copying error far more
#: often than a bargain.
OUTLIER_LOW = Decimal("0.75")
OUTLIER_HIGH = Decimal("1.75")
#: Spot prices are set by spare capacity, per zone and hour: over the bundled tables
#: the spot price per GPU of one family spreads 0.34x-4.1x of its median. Below 0.3x
#: (AWS us-east-1 p4d at $2.47 against $9-12 elsewhere) is a stale or mistyped record.
SPOT_OUTLIER_LOW = Decimal("0.30")
SPOT_OUTLIER_HIGH = Decimal("6")
#: Sizes of one family with the same shape per GPU should cost the same per GPU.
FAMILY_TOLERANCE = Decimal("0.10")
#: A catalogue's stand-in for a spot price it did not read: on-demand times this.
PLACEHOLDER_RATIO = Decimal("0.1")
#: The host VM's least share of a machine's on-demand total where it is billed apart
#: from the GPUs: over the bundled GCP rows it is 9-68% (A3 in europe-west4 the least,
#: n1 with one T4 the most); a total within 2% of its GPUs alone lacks its host.
HOST_SHARE_MIN = Decimal("0.02")
_GCP_GPU_SUFFIX = re.compile(r"-(?P<count>[0-9]+)g(?:-[a-z]+)?\Z")
_SIZE = re.compile(r"[-.]?[0-9]+g?(?:-[a-z]+)?\Z|\.\w+\Z")
_DATE = re.compile(r"\b(20\d\d-[01]\d-[0-3]\d)\b")


@dataclass(frozen=True, slots=True)
class Finding:
    """One suspect price."""

    provider: str
    region: str
    instance_type: str
    accelerator: str | None
    market: Market
    kind: str
    message: str
    known: bool  # the row already says so (status and note)


def check_instances(
    rows: Iterable[InstancePrice],
    dated: Callable[[InstancePrice], date | None] | None = None,
    parts: Iterable[GpuPart] = (),
) -> list[Finding]:
    """Every finding over ``rows``, in table order. ``dated`` gives a row's own date (its
    table part's as-of date); without it, notes citing newer sources are not checked.
    ``parts`` are the GPUs' prices alone where a cloud bills them apart from the host
    (without them, no total is checked for a missing host).

    >>> from costguard.pricing.tables import load_catalog
    >>> [f for f in check_instances(load_catalog().instances) if not f.known]
    []
    """
    rows = list(rows)
    findings: list[Finding] = []
    for row in rows:
        findings.extend(_row_findings(row))
        day = dated(row) if dated is not None else None
        if day is not None:  # an unknown date is old already, whatever its note cites
            findings.extend(_older_than_source(row, day))
    for market in Market:
        findings.extend(_outliers(rows, market))
    findings.extend(_family_sums(rows))
    findings.extend(_missing_hosts(rows, parts))
    order = {(r.provider, r.region, r.instance_type, r.accelerator): i for i, r in enumerate(rows)}
    return sorted(
        findings,
        key=lambda f: (order[(f.provider, f.region, f.instance_type, f.accelerator)], f.kind),
    )


def check_catalog(catalog: Catalog, parts: Iterable[GpuPart] = ()) -> list[Finding]:
    """:func:`check_instances` over ``catalog``'s instance rows, each dated by the table
    part (provider and region) it is in, with the GPU ``parts``."""

    def dated(row: InstancePrice) -> date | None:
        return row.as_of  # the row's own date (None: unknown)

    return check_instances(catalog.instances, dated, parts)


def mark_suspects(
    rows: Sequence[InstancePrice],
    only: Callable[[InstancePrice], bool] = lambda _: True,
    parts: Iterable[GpuPart] = (),
) -> list[InstancePrice]:
    """``rows`` with each price :func:`check_instances` finds new fault with marked
    ``unverified``, the finding in the row's note, in the rows ``only`` accepts (those a
    refresh read: what it writes is never a suspect price left ``listed``); ``parts`` as
    for :func:`check_instances`.

    >>> from costguard.pricing.tables import load_catalog
    >>> rows = load_catalog().instances
    >>> mark_suspects(rows) == list(rows)
    True
    """
    found: dict[tuple[str, str, str, str | None], list[Finding]] = {}
    for finding in check_instances(rows, parts=parts):
        if not finding.known:
            key = (finding.provider, finding.region, finding.instance_type, finding.accelerator)
            found.setdefault(key, []).append(finding)
    marked = []
    for row in rows:
        findings = found.get((row.provider, row.region, row.instance_type, row.accelerator))
        if not findings or not only(row):
            marked.append(row)
            continue
        markets = {f.market for f in findings}
        notes = [f"{f.market} unverified, pricing check: {f.message}" for f in findings]
        marked.append(
            row._replace(
                ondemand_status=PriceStatus.UNVERIFIED
                if Market.ON_DEMAND in markets
                else row.ondemand_status,
                spot_status=PriceStatus.UNVERIFIED if Market.SPOT in markets else row.spot_status,
                note="; ".join([*notes, row.note] if row.note else notes),
            )
        )
    return marked


def _finding(row: InstancePrice, market: Market, kind: str, message: str) -> Finding:
    status = row.status(market)
    known = status in (PriceStatus.UNVERIFIED, PriceStatus.CORRECTED) and bool(row.note)
    return Finding(
        row.provider, row.region, row.instance_type, row.accelerator, market, kind, message, known
    )


def _row_findings(row: InstancePrice) -> Iterable[Finding]:
    ondemand, spot = row.ondemand_usd_per_hour, row.spot_usd_per_hour
    for market, price in ((Market.ON_DEMAND, ondemand), (Market.SPOT, spot)):
        if price is not None and price == 0:
            yield _finding(row, market, "zero-price", f"{market} price is $0 (a placeholder)")
    if ondemand and spot is not None and spot >= ondemand:
        yield _finding(
            row, Market.SPOT, "spot-not-cheaper", f"spot {spot} is not below on-demand {ondemand}"
        )
    if ondemand and spot and _is_placeholder(spot, ondemand):
        yield _finding(
            row,
            Market.SPOT,
            "spot-placeholder",
            f"spot {spot} is exactly {PLACEHOLDER_RATIO}x on-demand {ondemand}: a catalogue's "
            "placeholder, not a market price",
        )
    match = _GCP_GPU_SUFFIX.search(row.instance_type) if row.provider == "gcp" else None
    if match and row.accelerator and int(match["count"]) != row.accelerator_count:
        yield _finding(
            row,
            Market.ON_DEMAND,
            "gpu-count",
            f"the name says {match['count']} GPUs, the row {row.accelerator_count}",
        )


def _is_placeholder(spot: Decimal, ondemand: Decimal) -> bool:
    """Whether ``spot`` is on-demand times :data:`PLACEHOLDER_RATIO`, to the digits it
    is written with (7.5955 for 75.9552), written to a tenth of a cent or finer (a round
    0.5 beside 5.04 is a price someone typed, not the pattern)."""
    exponent = spot.as_tuple().exponent
    return (
        isinstance(exponent, int)
        and exponent <= -3
        and spot == (ondemand * PLACEHOLDER_RATIO).quantize(spot)
    )


def _older_than_source(row: InstancePrice, as_of: date) -> Iterable[Finding]:
    cited = max((date.fromisoformat(d) for d in _DATE.findall(row.note)), default=None)
    if cited is not None and cited > as_of:
        for market in Market:
            if row.usd_per_hour(market) is not None:
                yield _finding(
                    row,
                    market,
                    "older-than-source",
                    f"the note cites a source of {cited}, newer than the row's {as_of}: "
                    "read the row from it",
                )


@functools.cache
def _family(instance_type: str) -> str:
    """The instance type without its size (``a2-highgpu``, ``p4d``, ``Standard_NC``)."""
    return _SIZE.sub("", instance_type)


def _outliers(rows: Sequence[InstancePrice], market: Market) -> Iterable[Finding]:
    # The same GPU on the same cloud, in the sizes of one family with the same shape per
    # GPU (so the host share per GPU is the same), over every region: each price per GPU
    # against the median of the others, so two rows are enough to tell one of them is odd.
    groups: dict[tuple[object, ...], list[tuple[InstancePrice, Decimal]]] = {}
    for row in rows:
        price = row.usd_per_hour(market)
        if not price:
            continue
        count = row.accelerator_count or 1
        shape = (
            row.vcpus / count if row.vcpus is not None else None,
            row.memory_gib / count if row.memory_gib is not None else None,
        )
        key = (row.provider, row.accelerator, _family(row.instance_type), *shape)
        groups.setdefault(key, []).append((row, price / count))
    low, high = (
        (OUTLIER_LOW, OUTLIER_HIGH)
        if market is Market.ON_DEMAND
        else (SPOT_OUTLIER_LOW, SPOT_OUTLIER_HIGH)
    )
    for group in groups.values():
        if len(group) < 2:
            continue
        ordered = sorted(per_gpu for _, per_gpu in group)
        places = len(group) - 1
        for row, per_gpu in group:
            median = _median_without(ordered, per_gpu)
            ratio = per_gpu / median
            if ratio < low or ratio > high:
                yield _finding(
                    row,
                    market,
                    "regional-outlier",
                    f"{market} ${per_gpu:.4f} per GPU-hour is {ratio:.2f}x the median of "
                    f"{places} other region(s) and size(s) of its family (${median:.4f})",
                )


def _median_without(ordered: Sequence[Decimal], value: Decimal) -> Decimal:
    """The median of ``ordered`` (sorted) with one ``value`` taken out, without copying:
    each row against the others, in a group of thousands of rows on world tables.

    >>> _median_without([Decimal(1), Decimal(2), Decimal(10)], Decimal(10))
    Decimal('1.5')
    >>> _median_without([Decimal(1), Decimal(2), Decimal(10)], Decimal(1))
    Decimal('6')
    """
    gone = bisect.bisect_left(ordered, value)
    size = len(ordered) - 1

    def at(position: int) -> Decimal:  # the position among the others
        return ordered[position if position < gone else position + 1]

    middle = size // 2
    if size % 2:
        return at(middle)
    return (at(middle - 1) + at(middle)) / 2


def _family_sums(rows: Sequence[InstancePrice]) -> Iterable[Finding]:
    families: dict[tuple[object, ...], list[InstancePrice]] = {}
    for row in rows:
        if not row.accelerator_count or row.vcpus is None or row.memory_gib is None:
            continue
        family = _family(row.instance_type)
        shape = (row.vcpus / row.accelerator_count, row.memory_gib / row.accelerator_count)
        key = (row.provider, row.region, family, row.accelerator, *shape)
        families.setdefault(key, []).append(row)
    for members in families.values():
        if len({m.accelerator_count for m in members}) < 2:
            continue
        # On-demand only: spot prices of the sizes move apart by the hour.
        per_gpu = [
            (m, price / m.accelerator_count) for m in members if (price := m.ondemand_usd_per_hour)
        ]
        if len(per_gpu) < 2:
            continue
        median = Decimal(statistics.median(p for _, p in per_gpu))
        for member, price in per_gpu:
            if abs(price / median - 1) > FAMILY_TOLERANCE:
                yield _finding(
                    member,
                    Market.ON_DEMAND,
                    "family-sum",
                    f"on-demand ${price:.4f} per GPU-hour, while its family's sizes "
                    f"cost ${median:.4f}",
                )


def _missing_hosts(rows: Sequence[InstancePrice], parts: Iterable[GpuPart]) -> Iterable[Finding]:
    alone = {(p.provider, p.region, p.accelerator): p for p in parts}
    if not alone:
        return
    for row in rows:
        part = alone.get((row.provider, row.region, row.accelerator or ""))
        total = row.ondemand_usd_per_hour
        if part is None or not total or not row.accelerator_count:
            continue
        gpus = part.ondemand_usd_per_gpu_hour * row.accelerator_count
        host = total - gpus
        if host >= total * HOST_SHARE_MIN:
            continue
        message = (
            f"on-demand {total} leaves ${host:.4f} for the host VM once its "
            f"{row.accelerator_count} {row.accelerator} are paid (${gpus:.4f} at "
            f"${part.ondemand_usd_per_gpu_hour} each, gpu_parts.csv of {part.as_of}): "
            "the vCPUs and memory billed apart are missing"
        )
        yield _finding(row, Market.ON_DEMAND, "missing-host", message)
        if row.spot_usd_per_hour is not None:
            yield _finding(
                row,
                Market.SPOT,
                "missing-host",
                "spot is built like its on-demand price, whose host VM part is missing",
            )
