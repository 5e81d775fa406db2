"""GCP price records (Cloud Billing Catalog SKUs of Compute Engine) read into prices per
table row. Pure: no I/O.

GCP bills a VM as vCPUs x the core SKU + GiB x the RAM SKU of its series, plus GPUs x the
GPU SKU; :func:`gcp_prices` sums them per machine type, with the shapes taken from the
table rows. The rules all providers share are :mod:`costguard.pricing.refresh.parse`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from costguard.pricing.catalog import InstancePrice, Market
from costguard.pricing.refresh.parse import (
    UNDATED,
    Dated,
    RowPrices,
    keep_newest,
    note_newest,
    record_moment,
    row_prices,
)

#: The Compute Engine service in the Cloud Billing Catalog.
GCP_COMPUTE_SERVICE = "services/6F81-5844-456A"

#: The vCPU/RAM SKU series of each machine-type prefix (the longest prefix wins), as in
#: "N1 Predefined Instance Core running in Americas". A3 Mega's host is "A3Plus
#: Instance" in the real catalog (tests/refresh/recorded/gcp-skus-a3plus-2024-09.json).
#: A3 Ultra's is written "A3Ultra Instance" and "A3 Ultra Instance": a SKU's series is
#: compared without spaces or case. Rows whose SKUs are not found keep their old price
#: and are flagged unverified.
GCP_HOST_SERIES: dict[str, str] = {
    "a2-": "A2 Instance",
    "a3-highgpu-": "A3 Instance",
    "a3-megagpu-": "A3Plus Instance",
    "a3-ultragpu-": "A3 Ultra Instance",
    "c2-": "Compute optimized",
    "e2-": "E2 Instance",
    "g2-": "G2 Instance",
    "n1-": "N1 Predefined Instance",
    "n2-": "N2 Instance",
    "n4-": "N4 Instance",
    "t2d-": "T2D AMD Instance",
}
_GCP_SERIES_BY_KEY = {
    series.replace(" ", "").lower(): series for series in GCP_HOST_SERIES.values()
}
#: GPU SKU models ("Nvidia Tesla T4 GPU running in ...", lower case) -> table names.
GCP_GPUS: dict[str, str] = {
    "tesla t4": "T4",
    "tesla p4": "P4",
    "tesla p100": "P100",
    "tesla v100": "V100",
    "tesla a100": "A100",
    "tesla a100 80gb": "A100-80GB",
    "a100 80gb": "A100-80GB",
    "l4": "L4",
    "h100 80gb": "H100",
    "h100": "H100",
    "h100 80gb mega": "H100-MEGA",
    "h100 80gb plus": "H100-MEGA",  # A3 Mega's GPU where it was first sold (us-central1)
    "h200 141gb": "H200",
    "b200": "B200",
}
#: Machine series GCP bills whole as GPU slices: "A4 Nvidia B200 (1 gpu slice) running in
#: Americas" is one B200 with its share of the vCPUs and memory, and there is no "A4
#: Instance Core/Ram" SKU (gpuhunt's providers/gcp.py @ 35841515 prices a4 as GPUs x
#: slice; SkyPilot's fetch_gcp.py @ 21fd5541: "GCP does not have A4 instance in SKUs
#: API"). The machine type's price is its GPU count x the slice.
GCP_SLICE_SERIES: dict[str, str] = {"a4-": "A4"}
_GCP_MARKETS = {"OnDemand": Market.ON_DEMAND, "Preemptible": Market.SPOT}
_GCP_HOST = re.compile(
    r"^(?:Spot )?(?:Preemptible )?(?P<series>.+?) (?P<kind>Core|Ram) running in ", re.IGNORECASE
)
# Newer GPU SKUs drop the vendor: "H200 141GB GPU running in Netherlands".
_GCP_GPU = re.compile(
    r"^(?:Nvidia )?(?P<model>.+?) GPU(?: attached to Spot Preemptible VMs)? running in ",
    re.IGNORECASE,
)
# The spot slice SKU is tagged OnDemand in the live catalog: its name tells the market
# (SpareCores/sc-crawler tests/test_gcp.py @ 55aec325).
_GCP_SLICE = re.compile(
    r"^(?P<spot>Spot Preemptible )?(?P<series>\S+) Nvidia (?P<model>\S+) \(1 gpu slice\) "
    r"running in ",
    re.IGNORECASE,
)
# Committed-use, reservation, DWS/Flex and sole-tenant SKUs price other ways of buying
# (and custom/extended shapes other machine types): words looked for in lower case, as
# plain substrings (a regular expression of alternatives costs ten times as much).
_GCP_OTHER_WORDS = (
    "commit",
    "reserv",
    "dynamic workload",
    "flex",
    "calendar",
    "sole tenan",
    "custom",
    "extended",
)
_GCP_DWS = re.compile(r"\bdws\b")


def _gcp_other(description: str) -> bool:
    """Whether a SKU prices another way of buying (or a custom shape).

    >>> _gcp_other("Nvidia H100 80GB GPU running in Americas (DWS)")
    True
    >>> _gcp_other("N2 Instance Core running in Americas"), _gcp_other("DWSX Core running")
    (False, False)
    """
    lower = description.lower()
    for word in _GCP_OTHER_WORDS:
        if word in lower:
            return True
    return "dws" in lower and _GCP_DWS.search(lower) is not None


_GCP_UNITS = {"core": "h", "ram": "GiBy.h", "gpu": "h", "slice": "h"}


@dataclass(frozen=True, slots=True)
class GcpSku:
    """The parts of a Cloud Billing Catalog SKU that price a VM."""

    description: str
    usage_type: str  # OnDemand, Preemptible, Commit1Yr, ...
    regions: tuple[str, ...]
    usage_unit: str  # "h" for cores and GPUs, "GiBy.h" for RAM
    usd: Decimal  # per usage unit, the first tier
    effective: datetime = UNDATED  # pricingInfo.effectiveTime


def gcp_money(units: Any, nanos: Any) -> Decimal:
    """A ``google.type.Money``-style amount (whole units + nanos) as an exact Decimal.

    >>> gcp_money("0", 31611000)
    Decimal('0.031611000')
    """
    return Decimal(int(units or 0)) + Decimal(int(nanos or 0)).scaleb(-9)


def gcp_sku_from_json(record: Mapping[str, Any]) -> GcpSku | None:
    """A SKU as the REST API returns it (``skus[]`` of ``services.skus.list``).

    The last ``pricingInfo`` entry is the current one; its first tier is the price.
    ``None`` for a SKU priced in another currency than USD (real pages mix them: see
    :func:`gcp_currency` for telling a page that has no USD price at all).
    """
    pricing = record.get("pricingInfo") or []
    if not pricing:
        return None
    expression = pricing[-1].get("pricingExpression", {})
    tiers = expression.get("tieredRates") or []
    first = min(tiers, key=lambda t: float(t.get("startUsageAmount", 0)), default=None)
    if first is None:
        return None
    unit_price = first.get("unitPrice", {})
    if (unit_price.get("currencyCode") or "USD") != "USD":
        return None
    return GcpSku(
        description=str(record.get("description", "")),
        usage_type=str(record.get("category", {}).get("usageType", "")),
        regions=tuple(record.get("serviceRegions", ())),
        usage_unit=str(expression.get("usageUnit", "")),
        usd=gcp_money(unit_price.get("units"), unit_price.get("nanos")),
        effective=record_moment(pricing[-1].get("effectiveTime")),
    )


def gcp_currency(record: Mapping[str, Any]) -> str:
    """The currency a SKU (as the REST API returns it) is priced in; USD when unsaid.

    >>> gcp_currency({"pricingInfo": [{"pricingExpression": {"tieredRates": [
    ...     {"unitPrice": {"currencyCode": "EUR", "units": "1"}}]}}]})
    'EUR'
    """
    for info in (record.get("pricingInfo") or [])[-1:]:
        for rate in (info.get("pricingExpression") or {}).get("tieredRates") or ():
            return str((rate.get("unitPrice") or {}).get("currencyCode") or "USD")
    return "USD"


def gcp_may_price_vm(description: str, usage_type: str) -> bool:
    """Whether a SKU may price a VM costguard lists: on-demand or spot, and named like a
    vCPU, RAM or GPU SKU. A necessary condition of :func:`gcp_component`, cheap enough
    to run on every SKU of the catalog before the rest of it is read (most are disks,
    networking, licences and commitments).

    >>> gcp_may_price_vm("N1 Predefined Instance Core running in Americas", "OnDemand")
    True
    >>> gcp_may_price_vm("Storage PD Capacity in Americas", "OnDemand")
    False
    >>> gcp_may_price_vm("N1 Predefined Instance Core running in Americas", "Commit1Yr")
    False
    """
    # " running in " (a plain substring test) turns most SKUs away before any pattern.
    return (
        usage_type in _GCP_MARKETS
        and " running in " in description.lower()
        and any(p.match(description) is not None for p in (_GCP_HOST, _GCP_GPU, _GCP_SLICE))
    )


def gcp_component(sku: GcpSku) -> tuple[str, Market] | None:
    """What a SKU prices, e.g. ``("core:N1 Predefined Instance", on-demand)`` or
    ``("gpu:T4", spot)``; ``None`` for SKUs that do not price a VM costguard lists.

    >>> gcp_component(GcpSku("Spot Preemptible N1 Predefined Instance Core running in "
    ...                      "Americas", "Preemptible", ("us-central1",), "h", Decimal(1)))
    ('core:N1 Predefined Instance', <Market.SPOT: 'spot'>)
    """
    market = _GCP_MARKETS.get(sku.usage_type)
    if market is None or _gcp_other(sku.description):
        return None
    gpu = _GCP_GPU.match(sku.description)
    piece = _GCP_SLICE.match(sku.description)
    if piece:
        name = GCP_GPUS.get(piece["model"].lower())
        component = f"slice:{piece['series'].upper()}:{name}" if name else None
        market = Market.SPOT if piece["spot"] else market
    elif gpu:
        name = GCP_GPUS.get(gpu["model"].lower())
        component = f"gpu:{name}" if name else None
    else:
        host = _GCP_HOST.match(sku.description)
        if host:
            series = _GCP_SERIES_BY_KEY.get(host["series"].replace(" ", "").lower())
            component = f"{host['kind'].lower()}:{series or host['series']}"
        else:
            component = None
    if component is None or sku.usage_unit != _GCP_UNITS[component.split(":")[0]]:
        return None
    return component, market


def gcp_unit_prices(
    skus: Iterable[GcpSku], dated: Dated | None = None
) -> dict[tuple[str, str, Market], Decimal]:
    """Unit prices per (component, region, market) from a stream of SKUs.

    A $0 SKU is the catalogue's placeholder, not a price: a machine type one of whose
    parts is priced $0 is not priced at all (its row keeps its old price, flagged).
    ``dated``, when given, is filled with the newest ``effectiveTime`` per region.

    >>> sku = GcpSku("Nvidia B200 GPU running in Americas", "OnDemand", ("us-central1",),
    ...              "h", Decimal(0))
    >>> gcp_unit_prices([sku])
    {}
    """
    prices: dict[tuple[str, str, Market], tuple[datetime, Decimal]] = {}
    for sku in skus:
        found = gcp_component(sku)
        if found is None or sku.usd <= 0:
            continue
        component, market = found
        for region in sku.regions:
            keep_newest(prices, (component, region, market), sku.usd, sku.effective)
            if dated is not None:
                note_newest(dated, (region, market), sku.effective)
    return {key: price for key, (_, price) in prices.items()}


def gcp_series(instance_type: str) -> str | None:
    """The vCPU/RAM SKU series of a machine type (longest prefix match).

    >>> gcp_series("a3-megagpu-8g"), gcp_series("n1-highmem-8"), gcp_series("tpu-v3-8")
    ('A3Plus Instance', 'N1 Predefined Instance', None)
    """
    matches = [prefix for prefix in GCP_HOST_SERIES if instance_type.startswith(prefix)]
    return GCP_HOST_SERIES[max(matches, key=len)] if matches else None


def _slice_series(instance_type: str) -> str | None:
    """The GPU-slice series of a machine type GCP bills whole as slices.

    >>> _slice_series("a4-highgpu-8g"), _slice_series("a3-ultragpu-8g")
    ('A4', None)
    """
    for prefix, series in GCP_SLICE_SERIES.items():
        if instance_type.startswith(prefix):
            return series
    return None


def gcp_prices(
    unit_prices: Mapping[tuple[str, str, Market], Decimal],
    rows: Iterable[InstancePrice],
    dated: Mapping[tuple[str, Market], datetime] | None = None,
) -> RowPrices:
    """Sum a machine type's price the way GCP bills it, per row and market.

    vCPUs x core + GiB x RAM of the row's series, + GPUs x the GPU SKU; GPUs x the slice
    SKU for a series billed as GPU slices (A4). A market is priced only when every part is
    in the catalog. Rows of series this module does not
    know (TPUs) or without a shape are not covered.

    >>> from costguard.pricing.refresh.parse import row_key
    >>> row = InstancePrice("gcp", "us-central1", "g2-standard-4", "L4", 1, Decimal(4),
    ...                     Decimal(16), None, None, None, None)
    >>> units = {("core:G2 Instance", "us-central1", Market.ON_DEMAND): Decimal("0.02"),
    ...          ("ram:G2 Instance", "us-central1", Market.ON_DEMAND): Decimal("0.003"),
    ...          ("gpu:L4", "us-central1", Market.ON_DEMAND): Decimal("0.5")}
    >>> gcp_prices(units, [row]).prices[row_key(row)][Market.ON_DEMAND]
    Decimal('0.628')
    """
    known_gpus = set(GCP_GPUS.values())

    def row_price(row: InstancePrice) -> dict[Market, Decimal] | None:
        if row.accelerator is not None and row.accelerator not in known_gpus:
            return None
        sliced = _slice_series(row.instance_type)
        if sliced is not None and row.accelerator is not None:
            shape = [(f"slice:{sliced}:{row.accelerator}", Decimal(row.accelerator_count))]
        else:
            series = gcp_series(row.instance_type)
            if series is None or row.vcpus is None or row.memory_gib is None:
                return None
            shape = [(f"core:{series}", row.vcpus), (f"ram:{series}", row.memory_gib)]
            if row.accelerator is not None:
                shape.append((f"gpu:{row.accelerator}", Decimal(row.accelerator_count)))
        found: dict[Market, Decimal] = {}
        for market in Market:
            units = [unit_prices.get((part, row.region, market)) for part, _ in shape]
            if all(unit is not None for unit in units):
                found[market] = sum(
                    (
                        unit * size
                        for unit, (_, size) in zip(units, shape, strict=True)
                        if unit is not None
                    ),
                    Decimal(0),
                )
        return found

    seen = {(region, market) for _, region, market in unit_prices}
    return row_prices(rows, row_price, seen, dated)
