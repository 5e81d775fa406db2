"""AWS price records read into prices per table row. Pure: no I/O.

Price List products (``FormatVersion`` ``aws_v1``): ``product.attributes`` and
``terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD``; and EC2 spot price history
records (``AvailabilityZone``, ``InstanceType``, ``SpotPrice``, ``Timestamp``). The rules
all providers share are :mod:`costguard.pricing.refresh.parse`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from costguard.errors import CostguardError
from costguard.pricing.catalog import InstancePrice, Market
from costguard.pricing.refresh.parse import (
    CurrencyError,
    Dated,
    RowPrices,
    instance_family,
    keep_newest,
    note_newest,
    positive_price,
    record_moment,
    row_prices,
)

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
        note_newest(regions, place, record_moment(product.get("publicationDate")))
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            moment = record_moment(term.get("effectiveDate"))
            for dimension in term.get("priceDimensions", {}).values():
                if dimension.get("unit") != "Hrs":
                    continue
                per_unit = dimension.get("pricePerUnit") or {}
                if "USD" not in per_unit and per_unit:
                    raise CurrencyError(", ".join(sorted(per_unit)), "AWS")
                price = positive_price(per_unit.get("USD"))
                if price is not None:
                    keep_newest(prices, (region, instance_type), price, moment)
    if dated is not None:
        for place, moment in regions.items():
            if place[0] in {region for region, _ in prices}:
                note_newest(dated, place, moment)
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
        price = positive_price(record.get("SpotPrice"))
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
            note_newest(dated, (region, Market.SPOT), moment)
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
    prices = row_prices(rows, row_price, seen, dated)
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
