"""Azure Retail Prices items read into prices per table row. Pure: no I/O.

Linux pay-as-you-go and Spot meters are read; Low Priority, Windows, Cloud Services and
Dedicated Host meters are skipped. The rules all providers share are
:mod:`costguard.pricing.refresh.parse`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from costguard.pricing.catalog import InstancePrice, Market
from costguard.pricing.refresh.parse import (
    CurrencyError,
    Dated,
    RowPrices,
    keep_newest,
    note_newest,
    positive_price,
    record_moment,
    row_prices,
)

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
    price = positive_price(item.get("retailPrice", item.get("unitPrice")))
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
            keep_newest(found, (region.lower(), sku.lower(), market), price, moment)
            note_newest(dated, (region.lower(), market), moment)

    names: dict[str, set[str]] = {}
    for region, sku, _ in found:
        names.setdefault(region, set()).add(sku)

    def row_price(row: InstancePrice) -> dict[Market, Decimal]:
        region = row.region.lower()
        sku = azure_sku_name(row.instance_type, names.get(region, set()))
        return {m: found[(region, sku, m)][1] for m in Market if (region, sku, m) in found}

    seen = {(region, market) for region, _, market in found}
    return row_prices(rows, row_price, seen, dated)


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
