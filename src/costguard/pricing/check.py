"""Flag suspect rows of the instance tables (``costguard pricing check``). Pure.

A price table copied from a catalogue, or rebuilt from an API, can be wrong in ways a
single row does not show. :func:`check_instances` looks at each row against the others:

* ``spot-not-cheaper``: a spot price at or above on-demand (a cap, not a discount);
* ``zero-price``: a $0 price (a catalogue's placeholder, never a real price);
* ``regional-outlier``: an instance type whose price in one region is far from its
  median over the regions it is sold in (GCP europe-west4 A100s were 0.66x);
* ``family-sum``: in a family whose shape grows with the GPU count (``a2-highgpu-1g`` ..
  ``-8g``), a size whose price per GPU disagrees with its siblings' (a host or GPU part
  missing from the sum);
* ``gpu-count``: a GPU count that disagrees with the instance type's name (GCP ``-8g``).

A finding on a row whose price for that market is already marked ``unverified`` or
``corrected`` with a note is *known*: the estimate shows that note. Other findings are
*new*: a table is clean when it has none (a test runs the check on the bundled tables).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from costguard.pricing.catalog import InstancePrice, Market, PriceStatus

#: A price below this fraction of its instance type's median over regions, or above the
#: upper one, is an outlier. Regional list prices of one machine type spread about
#: 0.9x-1.4x of the median (Sao Paulo, Zurich and Tokyo at the top); a half-price region
#: is a copying error far more often than a bargain.
OUTLIER_LOW = Decimal("0.75")
OUTLIER_HIGH = Decimal("1.75")
#: Sizes of one family with the same shape per GPU should cost the same per GPU.
FAMILY_TOLERANCE = Decimal("0.10")
_GCP_GPU_SUFFIX = re.compile(r"-(?P<count>\d+)g(?:-[a-z]+)?$")


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


def check_instances(rows: Iterable[InstancePrice]) -> list[Finding]:
    """Every finding over ``rows``, in table order.

    >>> from costguard.pricing.tables import load_catalog
    >>> [f for f in check_instances(load_catalog().instances) if not f.known]
    []
    """
    rows = list(rows)
    findings: list[Finding] = []
    for row in rows:
        findings.extend(_row_findings(row))
    findings.extend(_outliers(rows))
    findings.extend(_family_sums(rows))
    order = {(r.provider, r.region, r.instance_type, r.accelerator): i for i, r in enumerate(rows)}
    return sorted(
        findings,
        key=lambda f: (order[(f.provider, f.region, f.instance_type, f.accelerator)], f.kind),
    )


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
    match = _GCP_GPU_SUFFIX.search(row.instance_type) if row.provider == "gcp" else None
    if match and row.accelerator and int(match["count"]) != row.accelerator_count:
        yield _finding(
            row,
            Market.ON_DEMAND,
            "gpu-count",
            f"the name says {match['count']} GPUs, the row {row.accelerator_count}",
        )


def _outliers(rows: Sequence[InstancePrice]) -> Iterable[Finding]:
    groups: dict[tuple[str, str, str | None], list[InstancePrice]] = {}
    for row in rows:
        groups.setdefault((row.provider, row.instance_type, row.accelerator), []).append(row)
    for group in groups.values():
        priced = [(r, r.ondemand_usd_per_hour) for r in group if r.ondemand_usd_per_hour]
        # On-demand only (spot moves by the hour); each region against the median of the
        # others, so that two regions are enough to tell one of them is odd.
        for row, price in priced:
            others = [p for r, p in priced if r is not row and p]
            if not price or not others:
                continue
            median = Decimal(statistics.median(others))
            ratio = price / median
            if ratio < OUTLIER_LOW or ratio > OUTLIER_HIGH:
                yield _finding(
                    row,
                    Market.ON_DEMAND,
                    "regional-outlier",
                    f"on-demand ${price}/h is {ratio:.2f}x the median of its "
                    f"{len(others)} other region(s) (${median}/h)",
                )


def _family_sums(rows: Sequence[InstancePrice]) -> Iterable[Finding]:
    families: dict[tuple[object, ...], list[InstancePrice]] = {}
    for row in rows:
        if not row.accelerator_count or row.vcpus is None or row.memory_gib is None:
            continue
        family = re.sub(r"[-.]?\d+g?(?:-[a-z]+)?$|\.\w+$", "", row.instance_type)
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
