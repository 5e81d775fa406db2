"""Read the providers' price records into hourly prices per table row. Pure: no I/O.

Records come in the shapes the providers document (parsed JSON, or plain values read
off an SDK object), whether fetched live or read from a mirror:

* AWS: Price List products (``FormatVersion`` ``aws_v1``): ``product.attributes`` and
  ``terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD``; and EC2 spot price history
  records (``AvailabilityZone``, ``InstanceType``, ``SpotPrice``, ``Timestamp``).
* GCP: Cloud Billing Catalog SKUs of Compute Engine. GCP bills a VM as vCPUs x the core
  SKU + GiB x the RAM SKU of its series, plus GPUs x the GPU SKU; :func:`gcp_prices` sums
  them per machine type, with the shapes taken from the table rows.
* Azure: Retail Prices items: Linux pay-as-you-go and Spot meters; Low Priority and
  Windows meters are skipped.

Every ``*_prices`` function gets the table rows to price and returns
:class:`RowPrices`: the fresh price per row and market, which rows that API prices at
all (GCP TPUs, for example, are not in the Compute Engine catalog), which markets the
records listed in each region, and how recent the records of each region are.

Real responses hold records that are not prices: $0 placeholders (a catalogue's way of
saying "not priced"), other products under the same names (Azure Cloud Services and
Dedicated Hosts), older duplicates. A $0 part is no price; of duplicates the newest
effective date wins; a price in another currency is an error (:class:`CurrencyError`),
never a silent skip.

One idea, longer than most modules: every provider's records read into the one
:class:`RowPrices` shape, side by side, so the rules they share ($0, newest, currency) are
applied and read in one place.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
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


def _row_prices(
    rows: Iterable[InstancePrice],
    row_price: Callable[[InstancePrice], Mapping[Market, Decimal] | None],
    seen: Iterable[tuple[str, Market]],
    dated: Mapping[tuple[str, Market], datetime] | None = None,
) -> RowPrices:
    """Each row's fresh prices by market (``row_price``: ``None`` for a row the source does not
    cover, an empty mapping for one it covers but lists no price for); ``seen`` and
    ``dated`` as :func:`_listed` takes them."""
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
    return RowPrices(prices, frozenset(covered), **_listed(rows, seen, dated))


def _listed(
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


def _price(value: Any) -> Decimal | None:
    """A positive finite price, or ``None``. A zero price is a placeholder, not a price."""
    try:
        price = parse_decimal(value)
    except (ValueError, TypeError):
        return None
    return price if price > 0 else None


#: The moment of a record that carries no date: older than any dated one.
_UNDATED = datetime.min.replace(tzinfo=UTC)


def _keep_newest(
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


def _newest(dated: Dated, place: tuple[str, Market], moment: datetime) -> None:
    if moment is not _UNDATED and moment > dated.get(place, _UNDATED):
        dated[place] = moment


def record_moment(value: Any) -> datetime:
    """A record's date (ISO 8601, ``Z`` or offset; a date-time object) as an aware
    date-time; one that cannot be read counts as undated.

    >>> record_moment("2014-01-06T07:10:55.000Z").isoformat()
    '2014-01-06T07:10:55+00:00'
    >>> record_moment(None) == _UNDATED
    True
    """
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return _UNDATED
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


# --- AWS -------------------------------------------------------------------------------

#: The on-demand price costguard lists: Linux, shared tenancy, no pre-installed
#: software, an instance in use (not an unused capacity reservation).
AWS_LINUX_ATTRIBUTES = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}
#: The Price List's ``location`` of each commercial and GovCloud region, for products
#: without ``regionCode`` (older products have only ``location``; AWS's "Regions and
#: Zones" pages and the Price List's own names: "EU (...)", "Osaka-Local" before 2021).
AWS_LOCATIONS: dict[str, str] = {
    "US East (N. Virginia)": "us-east-1",
    "US East (Ohio)": "us-east-2",
    "US West (N. California)": "us-west-1",
    "US West (Oregon)": "us-west-2",
    "Africa (Cape Town)": "af-south-1",
    "Asia Pacific (Hong Kong)": "ap-east-1",
    "Asia Pacific (Tokyo)": "ap-northeast-1",
    "Asia Pacific (Seoul)": "ap-northeast-2",
    "Asia Pacific (Osaka)": "ap-northeast-3",
    "Asia Pacific (Osaka-Local)": "ap-northeast-3",
    "Asia Pacific (Mumbai)": "ap-south-1",
    "Asia Pacific (Hyderabad)": "ap-south-2",
    "Asia Pacific (Singapore)": "ap-southeast-1",
    "Asia Pacific (Sydney)": "ap-southeast-2",
    "Asia Pacific (Jakarta)": "ap-southeast-3",
    "Asia Pacific (Melbourne)": "ap-southeast-4",
    "Asia Pacific (Malaysia)": "ap-southeast-5",
    "Asia Pacific (Thailand)": "ap-southeast-7",
    "Canada (Central)": "ca-central-1",
    "Canada West (Calgary)": "ca-west-1",
    "EU (Frankfurt)": "eu-central-1",
    "EU (Zurich)": "eu-central-2",
    "EU (Stockholm)": "eu-north-1",
    "EU (Milan)": "eu-south-1",
    "EU (Spain)": "eu-south-2",
    "EU (Ireland)": "eu-west-1",
    "EU (London)": "eu-west-2",
    "EU (Paris)": "eu-west-3",
    "Israel (Tel Aviv)": "il-central-1",
    "Middle East (UAE)": "me-central-1",
    "Middle East (Bahrain)": "me-south-1",
    "Mexico (Central)": "mx-central-1",
    "South America (Sao Paulo)": "sa-east-1",
    "AWS GovCloud (US-East)": "us-gov-east-1",
    "AWS GovCloud (US-West)": "us-gov-west-1",
    "AWS GovCloud (US)": "us-gov-west-1",
}
_AWS_ZONE = re.compile(r"(?P<region>[a-z]{2}(?:-gov)?-[a-z]+-[0-9]+)[a-z]")


def aws_ondemand(
    products: Iterable[Mapping[str, Any]], dated: Dated | None = None
) -> dict[tuple[str, str], Decimal]:
    """On-demand $/h per (region, instance type) from Price List products.

    Products other than Linux/shared/no-software/used are skipped, whatever the query
    asked for (a mirror may hold more than one query's answer). Of two prices for one
    instance type, the newer term (``effectiveDate``) wins. The region is the product's
    ``regionCode``, or its ``location`` (:data:`AWS_LOCATIONS`) in older products that
    have none. ``dated``, when given, is filled with the newest ``publicationDate`` seen
    per region.

    >>> product = {"product": {"attributes": {**AWS_LINUX_ATTRIBUTES,
    ...     "regionCode": "us-east-1", "instanceType": "g5.xlarge"}},
    ...     "terms": {"OnDemand": {"T": {"priceDimensions": {"D": {
    ...         "unit": "Hrs", "pricePerUnit": {"USD": "1.0060000000"}}}}}}}
    >>> aws_ondemand([product])
    {('us-east-1', 'g5.xlarge'): Decimal('1.0060000000')}
    """
    prices: dict[tuple[str, str], tuple[datetime, Decimal]] = {}
    regions: Dated = {}
    for product in products:
        attributes = product.get("product", {}).get("attributes", {})
        if any(attributes.get(k) != v for k, v in AWS_LINUX_ATTRIBUTES.items()):
            continue
        # Capacity Blocks and other purchase options are products of their own.
        if attributes.get("marketoption", "OnDemand") != "OnDemand":
            continue
        instance_type = attributes.get("instanceType")
        region = attributes.get("regionCode") or AWS_LOCATIONS.get(attributes.get("location", ""))
        if not region or not instance_type:
            continue
        place = (region, Market.ON_DEMAND)
        _newest(regions, place, record_moment(product.get("publicationDate")))
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            moment = record_moment(term.get("effectiveDate"))
            for dimension in term.get("priceDimensions", {}).values():
                if dimension.get("unit") != "Hrs":
                    continue
                per_unit = dimension.get("pricePerUnit") or {}
                if "USD" not in per_unit and per_unit:
                    raise CurrencyError(", ".join(sorted(per_unit)), "AWS")
                price = _price(per_unit.get("USD"))
                if price is not None:
                    _keep_newest(prices, (region, instance_type), price, moment)
    if dated is not None:
        for place, moment in regions.items():
            if place[0] in {region for region, _ in prices}:
                _newest(dated, place, moment)
    return {key: price for key, (_, price) in prices.items()}


def aws_offer_products(offer: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The products of an AWS Price List bulk offer file (``.../offers/v1.0/aws/AmazonEC2/
    current/<region>/index.json``, public, no account needed), in the shape GetProducts
    answers them: each product with its on-demand terms and the file's
    ``publicationDate``.

    >>> offer = {"publicationDate": "2024-05-28T20:35:22Z",
    ...          "products": {"S": {"sku": "S", "attributes": {"instanceType": "p4d.24xlarge"}}},
    ...          "terms": {"OnDemand": {"S": {"S.T": {"priceDimensions": {}}}}}}
    >>> [p["terms"]["OnDemand"] for p in aws_offer_products(offer)]
    [{'S.T': {'priceDimensions': {}}}]
    """
    products = offer.get("products") or {}
    ondemand = (offer.get("terms") or {}).get("OnDemand") or {}
    if not isinstance(products, Mapping) or not isinstance(ondemand, Mapping):
        msg = "an AWS offer file's products or terms are not JSON objects"
        raise CostguardError(msg, hint="download that file again")
    published = offer.get("publicationDate")
    for sku, product in products.items():
        if isinstance(product, Mapping):
            yield {
                "product": product,
                "terms": {"OnDemand": ondemand.get(sku) or {}},
                "publicationDate": published,
            }


def aws_zone_region(zone: str) -> str | None:
    """The region of an availability zone; ``None`` for Local and Wavelength Zones.

    >>> aws_zone_region("us-east-1a"), aws_zone_region("us-west-2-lax-1a")
    ('us-east-1', None)
    """
    match = _AWS_ZONE.fullmatch(zone)
    return match["region"] if match else None


def aws_spot(
    history: Iterable[Mapping[str, Any]], dated: Dated | None = None
) -> dict[tuple[str, str], Decimal]:
    """Spot $/h per (region, instance type): the latest price in each zone, then the
    lowest over the region's zones (Local Zones excluded), for Linux/UNIX. ``dated``,
    when given, is filled with the newest record per region (``Timestamp``).

    >>> aws_spot([
    ...     {"AvailabilityZone": "us-east-1a", "InstanceType": "g5.xlarge",
    ...      "ProductDescription": "Linux/UNIX", "SpotPrice": "0.50",
    ...      "Timestamp": "2026-11-30T10:00:00+00:00"},
    ...     {"AvailabilityZone": "us-east-1a", "InstanceType": "g5.xlarge",
    ...      "ProductDescription": "Linux/UNIX", "SpotPrice": "0.45",
    ...      "Timestamp": "2026-11-30T11:00:00+00:00"},
    ...     {"AvailabilityZone": "us-east-1b", "InstanceType": "g5.xlarge",
    ...      "ProductDescription": "Linux/UNIX", "SpotPrice": "0.47",
    ...      "Timestamp": "2026-11-30T09:00:00+00:00"}])
    {('us-east-1', 'g5.xlarge'): Decimal('0.45')}
    """
    latest: dict[tuple[str, str], tuple[datetime, Decimal]] = {}
    for record in history:
        if not str(record.get("ProductDescription", "")).startswith("Linux/UNIX"):
            continue
        zone, instance_type = record.get("AvailabilityZone"), record.get("InstanceType")
        price = _price(record.get("SpotPrice"))
        if not zone or not instance_type or price is None:
            continue
        moment = record_moment(record.get("Timestamp"))
        key = (str(zone), str(instance_type))
        seen = latest.get(key)
        if seen is None or (moment, price) > seen:
            latest[key] = (moment, price)
    lowest: dict[tuple[str, str], Decimal] = {}
    for (zone, instance_type), (moment, price) in latest.items():
        region = aws_zone_region(zone)
        if region is None:
            continue
        if dated is not None:
            _newest(dated, (region, Market.SPOT), moment)
        key = (region, instance_type)
        if key not in lowest or price < lowest[key]:
            lowest[key] = price
    return lowest


def aws_prices(
    ondemand: Mapping[tuple[str, str], Decimal],
    spot: Mapping[tuple[str, str], Decimal],
    rows: Iterable[InstancePrice],
    dated: Mapping[tuple[str, Market], datetime] | None = None,
    *,
    spot_by_family: bool = False,
) -> RowPrices:
    """Fresh prices for AWS rows: every EC2 instance type is in the Price List.
    ``spot_by_family``: the spot history read covers, in each region, the instance
    families it has records for only (a mirror's; a live read asks for every type): a
    region with spot prices of other families too was read for spot for those only."""

    def row_price(row: InstancePrice) -> dict[Market, Decimal]:
        return {
            market: table[(row.region, row.instance_type)]
            for market, table in ((Market.ON_DEMAND, ondemand), (Market.SPOT, spot))
            if (row.region, row.instance_type) in table
        }

    seen = {(region, Market.ON_DEMAND) for region, _ in ondemand}
    seen.update((region, Market.SPOT) for region, _ in spot)
    rows = list(rows)
    prices = _row_prices(rows, row_price, seen, dated)
    if not spot_by_family:
        return prices
    read: dict[str, set[str]] = {}
    for region, instance_type in spot:
        read.setdefault(region, set()).add(instance_family(instance_type))
    held: dict[str, set[str]] = {}  # the families with a spot price to refresh
    for row in rows:
        if row.spot_usd_per_hour is not None:
            held.setdefault(row.region, set()).add(instance_family(row.instance_type))
    families = {
        (region, Market.SPOT): frozenset(some)
        for region, some in read.items()
        if not held.get(region, set()) <= some
    }
    return replace(prices, families=families)


# --- GCP -------------------------------------------------------------------------------

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
    effective: datetime = _UNDATED  # pricingInfo.effectiveTime


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
            _keep_newest(prices, (component, region, market), sku.usd, sku.effective)
            if dated is not None:
                _newest(dated, (region, market), sku.effective)
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
    return _row_prices(rows, row_price, seen, dated)


# --- Azure -----------------------------------------------------------------------------


#: Products Azure lists under serviceName "Virtual Machines" that are not the VM's price:
#: the legacy Cloud Services (PaaS) meters and Dedicated Hosts carry the same
#: ``armSkuName`` at other rates, and the "Basic" tier is another product (compared
#: without spaces: both "Cloud Services" and "CloudServices" are in use).
_AZURE_OTHER_PRODUCTS = ("cloudservices", "dedicatedhost", "windows")


def _azure_other_product(product_name: str, sku_name: str) -> bool:
    """Whether a Virtual Machines item prices something else than a Linux VM.

    >>> _azure_other_product("Basv2 Series Cloud Services", "Standard_B2ats_v2")
    True
    >>> _azure_other_product("Virtual Machines A Series Basic", "Basic_A1")
    True
    >>> _azure_other_product("Virtual Machines NCasT4_v3 Series", "Standard_NC4as_T4_v3")
    False
    """
    squashed = product_name.lower().replace(" ", "")
    if any(word in squashed for word in _AZURE_OTHER_PRODUCTS):
        return True
    return product_name.lower().endswith(" basic") or sku_name.lower().startswith("basic_")


def azure_item(item: Mapping[str, Any]) -> tuple[str, str, Market, Decimal] | None:
    """(region, ARM SKU name, market, $/h) of a Retail Prices item, or ``None`` when it
    is not a Linux pay-as-you-go or Spot VM meter (Windows, Low Priority, Cloud Services,
    Dedicated Host and Basic items are other products). Raises :class:`CurrencyError`
    for an item priced in another currency.

    >>> azure_item({"serviceName": "Virtual Machines", "type": "Consumption",
    ...             "armRegionName": "eastus", "armSkuName": "Standard_NC4as_T4_v3",
    ...             "skuName": "NC4as T4 v3 Spot", "meterName": "NC4as T4 v3 Spot",
    ...             "productName": "Virtual Machines NCasT4_v3 Series",
    ...             "unitOfMeasure": "1 Hour", "retailPrice": 0.0627})
    ('eastus', 'Standard_NC4as_T4_v3', <Market.SPOT: 'spot'>, Decimal('0.0627'))
    """
    if item.get("serviceName") != "Virtual Machines" or item.get("type") != "Consumption":
        return None  # reservations, savings plans and dev/test prices are other offers
    currency = item.get("currencyCode") or "USD"
    if currency != "USD":
        raise CurrencyError(str(currency), "Azure")
    if item.get("unitOfMeasure") != "1 Hour":
        return None
    names = f"{item.get('skuName', '')} {item.get('meterName', '')}"
    region, sku = item.get("armRegionName"), item.get("armSkuName")
    if "Low Priority" in names or _azure_other_product(
        str(item.get("productName", "")), str(sku or "")
    ):
        return None
    price = _price(item.get("retailPrice", item.get("unitPrice")))
    if not region or not sku or price is None:
        return None
    market = Market.SPOT if "Spot" in names else Market.ON_DEMAND
    return str(region), str(sku), market, price


def azure_prices(items: Iterable[Mapping[str, Any]], rows: Iterable[InstancePrice]) -> RowPrices:
    """Fresh prices for Azure rows from Retail Prices items (matched on ``armSkuName``,
    ignoring case); of two items for one VM and market, the newer ``effectiveStartDate``
    wins."""
    found: dict[tuple[str, str, Market], tuple[datetime, Decimal]] = {}
    dated: Dated = {}
    for item in items:
        parsed = azure_item(item)
        if parsed is not None:
            region, sku, market, price = parsed
            moment = record_moment(item.get("effectiveStartDate"))
            _keep_newest(found, (region.lower(), sku.lower(), market), price, moment)
            _newest(dated, (region.lower(), market), moment)

    names: dict[str, set[str]] = {}
    for region, sku, _ in found:
        names.setdefault(region, set()).add(sku)

    def row_price(row: InstancePrice) -> dict[Market, Decimal]:
        region = row.region.lower()
        sku = azure_sku_name(row.instance_type, names.get(region, set()))
        return {m: found[(region, sku, m)][1] for m in Market if (region, sku, m) in found}

    seen = {(region, market) for region, _, market in found}
    return _row_prices(rows, row_price, seen, dated)


def azure_sku_name(size: str, listed: Iterable[str]) -> str:
    """The Retail Prices ``armSkuName`` (lower case) of the VM size ``size``: the same
    name, or else the one name of ``listed`` that is ``size`` with a GPU tag before its
    version (the API lists the size ``Standard_ND96asr_v4`` as
    ``Standard_ND96asr_A100_v4``); two such names (an H100 and an H200 size) match
    neither.

    >>> azure_sku_name("Standard_ND96asr_v4", {"standard_nd96asr_a100_v4"})
    'standard_nd96asr_a100_v4'
    >>> azure_sku_name("Standard_ND96isr_v5", {"standard_nd96isr_h100_v5",
    ...                                        "standard_nd96isr_h200_v5"})
    'standard_nd96isr_v5'
    """
    wanted = size.lower()
    listed = set(listed)
    if wanted in listed:
        return wanted
    stem, dot, version = wanted.rpartition("_v")
    if not dot:
        return wanted
    pattern = re.compile(rf"{re.escape(stem)}_[a-z0-9]+_v{re.escape(version)}")
    tagged = [name for name in listed if pattern.fullmatch(name)]
    return tagged[0] if len(tagged) == 1 else wanted
