"""Reading API records into prices (pure): AWS products and spot history, GCP SKU sums,
Azure meters."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costguard.pricing.catalog import InstancePrice, Market, PriceStatus
from costguard.pricing.refresh.parse import CurrencyError, row_key
from costguard.pricing.refresh.parse_aws import aws_ondemand, aws_prices, aws_spot
from costguard.pricing.refresh.parse_azure import azure_item, azure_prices
from costguard.pricing.refresh.parse_gcp import (
    GcpSku,
    _gcp_other,
    gcp_component,
    gcp_may_price_vm,
    gcp_prices,
    gcp_sku_from_json,
    gcp_unit_prices,
)
from tests.refresh.records import AWS_PRODUCTS, AZURE_ITEMS, GCP_A4_SKUS, GCP_SKUS
from tests.refresh.servers import aws_product, gcp_sku
from tests.refresh.servers import azure_item as azure_record

prices = st.decimals(min_value=Decimal("0.0001"), max_value=Decimal(1000), places=4)


def row(
    provider: str, region: str, instance_type: str, accelerator=None, count=0, vcpus=4, memory=16
) -> InstancePrice:
    return InstancePrice(
        provider,
        region,
        instance_type,
        accelerator,
        count,
        Decimal(vcpus),
        Decimal(memory),
        Decimal(1),
        None,
        PriceStatus.LISTED,
        None,
    )


def test_aws_keeps_only_linux_shared_used_no_software() -> None:
    found = aws_ondemand(AWS_PRODUCTS)
    assert found[("us-east-1", "g5.xlarge")] == Decimal("1.2345")  # not Windows, SQL, dedicated
    assert found[("us-west-2", "g5.xlarge")] == Decimal("1.1111")
    assert len(found) == 6


def test_aws_products_as_json_strings_and_odd_records() -> None:
    products = [
        json.loads(json.dumps(aws_product("g5.xlarge", "us-east-1", "1.0"))),
        aws_product("g5.xlarge", "us-east-1", "7", marketoption="CapacityBlock"),
        aws_product("g5.xlarge", "us-east-1", "0.0000000000"),  # a $0 placeholder
        {"product": {"attributes": {}}},
        {},
    ]
    assert aws_ondemand(products) == {("us-east-1", "g5.xlarge"): Decimal("1.0")}


zones = st.sampled_from(
    ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1-atl-2a", "us-west-2a"]
)
spot_records = st.lists(
    st.fixed_dictionaries(
        {
            "AvailabilityZone": zones,
            "InstanceType": st.sampled_from(["g5.xlarge", "p4d.24xlarge"]),
            "ProductDescription": st.sampled_from(
                ["Linux/UNIX", "Linux/UNIX (Amazon VPC)", "Windows"]
            ),
            "SpotPrice": prices.map(str),
            "Timestamp": st.integers(0, 10_000).map(
                lambda m: datetime(2026, 11, 30, tzinfo=UTC) + timedelta(minutes=m)
            ),
        }
    ),
    max_size=30,
)


@given(spot_records, st.randoms())
def test_aws_spot_is_the_lowest_latest_zone_price_in_any_order(records, random) -> None:
    shuffled = list(records)
    random.shuffle(shuffled)
    result = aws_spot(shuffled)
    assert result == aws_spot(records)
    latest: dict[tuple[str, str], tuple[datetime, Decimal]] = {}
    for r in records:
        if r["ProductDescription"].startswith("Linux") and r["AvailabilityZone"].count("-") == 2:
            key = (r["AvailabilityZone"], r["InstanceType"])
            latest[key] = max(
                latest.get(key, (r["Timestamp"], Decimal(r["SpotPrice"]))),
                (r["Timestamp"], Decimal(r["SpotPrice"])),
            )
    for (region, instance_type), price in result.items():
        in_region = [
            p for (z, t), (_, p) in latest.items() if z[:-1] == region and t == instance_type
        ]
        assert price == min(in_region)
    assert all(region in ("us-east-1", "us-west-2") for region, _ in result)


def test_aws_spot_accepts_the_cli_and_moto_timestamp_forms() -> None:
    history = [
        {
            "AvailabilityZone": "us-east-1a",
            "InstanceType": "g5.xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": "0.30",
            "Timestamp": "2006-01-02T15:04:05.999999999Z",
        },
        {
            "AvailabilityZone": "us-east-1a",
            "InstanceType": "g5.xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": "0.40",
            "Timestamp": "2026-11-30T12:00:00+00:00",
        },
    ]
    assert aws_spot(history) == {("us-east-1", "g5.xlarge"): Decimal("0.40")}


def test_aws_prices_cover_every_row() -> None:
    rows = [row("aws", "us-east-1", "g5.xlarge", "A10G", 1), row("aws", "us-east-1", "x9.huge")]
    result = aws_prices({("us-east-1", "g5.xlarge"): Decimal(1)}, {}, rows)
    assert result.covered == {row_key(r) for r in rows}
    assert result.prices == {row_key(rows[0]): {Market.ON_DEMAND: Decimal(1)}}


def test_gcp_sku_from_json_is_exact_and_takes_the_current_price() -> None:
    record = gcp_sku("G2 Instance Core running in Americas", "1.000000001")
    record["pricingInfo"].insert(
        0,
        {
            "pricingExpression": {
                "usageUnit": "h",
                "tieredRates": [{"startUsageAmount": 0, "unitPrice": {"units": "9", "nanos": 0}}],
            }
        },
    )
    sku = gcp_sku_from_json(record)
    assert sku is not None
    assert sku.usd == Decimal("1.000000001")
    assert sku.regions == ("us-central1",)
    assert gcp_sku_from_json({"description": "free"}) is None
    foreign = gcp_sku("G2 Instance Core running in Americas", "1")
    foreign["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"][
        "currencyCode"
    ] = "EUR"
    assert gcp_sku_from_json(foreign) is None  # real pages mix currencies: see gcp_currency


def sku(description: str, usage: str = "OnDemand", unit: str = "h") -> GcpSku:
    return GcpSku(description, usage, ("us-central1",), unit, Decimal(1))


def test_gcp_components() -> None:
    assert gcp_component(sku("N1 Predefined Instance Ram running in Americas", unit="GiBy.h")) == (
        "ram:N1 Predefined Instance",
        Market.ON_DEMAND,
    )
    assert gcp_component(
        sku(
            "Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Americas",
            "Preemptible",
        )
    ) == ("gpu:T4", Market.SPOT)
    assert gcp_component(sku("Nvidia H100 80GB GPU running in Americas")) == (
        "gpu:H100",
        Market.ON_DEMAND,
    )
    assert gcp_component(sku("Nvidia Tesla A100 80GB GPU running in EMEA")) == (
        "gpu:A100-80GB",
        Market.ON_DEMAND,
    )
    for skipped in (
        sku("Commitment v1: N1 Cpu in Americas for 1 Year", "Commit1Yr"),
        sku("N1 Predefined Instance Core running in Americas", "Commit1Yr"),
        sku("Custom Instance Core running in Americas"),
        sku("Nvidia Tesla T4 Virtual Workstation GPU running in Americas"),
        sku("Nvidia H100 80GB GPU running in Americas (DWS)"),
        sku("N1 Predefined Instance Ram running in Americas", unit="h"),  # wrong unit
        sku("Storage PD Capacity"),
    ):
        assert gcp_component(skipped) is None, skipped


#: How "another way of buying" was first written: one case-blind pattern.
OTHER_PATTERN = re.compile(
    r"commit|reserv|\bDWS\b|dynamic workload|flex|calendar|sole tenan|custom|extended",
    re.IGNORECASE,
)
WORDS = (
    "Commitment",
    "v1:",
    "RESERVED",
    "Reservation",
    "(DWS)",
    "DWS",
    "dws-x",
    "DWSX",
    "ADWS",
    "Dynamic",
    "Workload",
    "FlexStart",
    "Calendar",
    "Sole",
    "Tenancy",
    "tenant",
    "Custom",
    "Extended",
    "N1",
    "Predefined",
    "Instance",
    "Core",
    "running",
    "in",
    "Americas",
)


@given(st.lists(st.sampled_from(WORDS), max_size=8).map(" ".join))
def test_other_ways_of_buying_are_told_as_the_pattern_tells_them(description: str) -> None:
    assert _gcp_other(description) == (OTHER_PATTERN.search(description) is not None)


def test_the_cheap_gcp_filter_keeps_every_sku_that_prices_a_vm() -> None:
    parsed = [s for s in map(gcp_sku_from_json, GCP_SKUS) if s is not None]
    kept = [s for s in parsed if gcp_may_price_vm(s.description, s.usage_type)]
    assert [s for s in parsed if gcp_component(s) is not None] == [
        s for s in kept if gcp_component(s) is not None
    ]
    assert len(kept) < len(parsed)  # the commitment SKU goes before it is read
    assert not gcp_may_price_vm("Storage PD Capacity", "OnDemand")
    assert not gcp_may_price_vm("Nvidia Tesla T4 GPU running in Americas", "Commit1Yr")
    assert gcp_may_price_vm("Nvidia Tesla T4 GPU running in Americas", "Preemptible")


@given(
    core=prices,
    ram=prices,
    gpu=prices,
    vcpus=st.integers(1, 224),
    memory=st.integers(1, 4000),
    count=st.integers(1, 16),
)
def test_gcp_sum_is_what_gcp_bills(core, ram, gpu, vcpus, memory, count) -> None:
    units = {
        ("core:A2 Instance", "us-central1", Market.ON_DEMAND): core,
        ("ram:A2 Instance", "us-central1", Market.ON_DEMAND): ram,
        ("gpu:A100", "us-central1", Market.ON_DEMAND): gpu,
    }
    host = row("gcp", "us-central1", "a2-highgpu-1g", "A100", count, vcpus, memory)
    result = gcp_prices(units, [host])
    assert result.prices[row_key(host)] == {
        Market.ON_DEMAND: core * vcpus + ram * memory + gpu * count
    }
    # Spot was not in the catalog: not priced rather than priced as the parts found.
    assert Market.SPOT not in result.prices[row_key(host)]


def test_gcp_rows_it_does_not_price() -> None:
    rows = [
        row("gcp", "us-central1", "tpu-v3-8", "tpu-v3-8", 1),
        row("gcp", "us-central1", "n1-highmem-8", "K80", 1),
        InstancePrice(
            "gcp", "us-central1", "g2-standard-4", "L4", 1, None, None, None, None, None, None
        ),
    ]
    assert gcp_prices({}, rows).covered == frozenset()


def test_gcp_fixture_catalog_prices_g2() -> None:
    units = gcp_unit_prices(s for s in map(gcp_sku_from_json, GCP_SKUS) if s is not None)
    g2 = row("gcp", "us-central1", "g2-standard-4", "L4", 1, 4, 16)
    expected = 4 * Decimal("0.024988") + 16 * Decimal("0.002928") + Decimal("0.56")
    assert gcp_prices(units, [g2]).prices[row_key(g2)][Market.ON_DEMAND] == expected
    assert ("core:N1 Predefined Instance", "europe-west4", Market.ON_DEMAND) in units


def test_azure_meters() -> None:
    kept = [azure_item(i) for i in AZURE_ITEMS]
    assert ("eastus", "Standard_NC4as_T4_v3", Market.ON_DEMAND, Decimal("0.6")) in kept
    assert ("eastus", "Standard_NC4as_T4_v3", Market.SPOT, Decimal("0.07")) in kept
    assert (
        sum(1 for k in kept if k is not None) == 7
    )  # Low Priority, Windows, dev/test, reservation out
    odd = azure_record("Standard_D2s_v5", "eastus", "0.1")
    assert azure_item({**odd, "unitOfMeasure": "1 GB/Month"}) is None
    with pytest.raises(CurrencyError, match="EUR"):
        azure_item({**odd, "currencyCode": "EUR"})
    assert azure_item({**odd, "retailPrice": 0}) is None


@given(st.permutations(AZURE_ITEMS))
def test_azure_prices_do_not_depend_on_order(items) -> None:
    rows = [
        row("azure", "eastus", "standard_nc4as_t4_v3"),
        row("azure", "westus2", "Standard_NC4as_T4_v3"),
    ]
    result = azure_prices(items, rows)
    assert result.prices[row_key(rows[0])] == {
        Market.ON_DEMAND: Decimal("0.6"),
        Market.SPOT: Decimal("0.07"),
    }
    assert result.prices[row_key(rows[1])] == {Market.ON_DEMAND: Decimal("0.66")}


def test_gcp_gpu_skus_named_without_nvidia_are_read() -> None:
    # GCP names its newer GPU SKUs without the vendor: "H200 141GB GPU running in ..."
    # (SpareCores/sc-crawler tests/test_gcp.py @ 55aec325, "newer GPU SKUs drop the
    # Nvidia/Tesla prefix"; SkyPilot's fetch_gcp.py @ 21fd5541 looks for "H200 141GB GPU").
    assert gcp_component(sku("H200 141GB GPU running in Netherlands")) == (
        "gpu:H200",
        Market.ON_DEMAND,
    )
    spot = sku("H200 141GB GPU attached to Spot Preemptible VMs running in Belgium", "Preemptible")
    assert gcp_component(spot) == ("gpu:H200", Market.SPOT)
    assert gcp_may_price_vm(spot.description, spot.usage_type)
    for skipped in (
        sku("RTX 6000 96GB running in Belgium"),  # a GPU the tables do not carry
        sku("Commitment v1: H200 141GB GPU running in Americas for 3 Years", "Commit3Yr"),
        sku("H200 141GB GPU attached to DWS Defined Duration VMs running in Americas"),
    ):
        assert gcp_component(skipped) is None, skipped


def test_gcp_a4_is_priced_as_its_gpu_slices() -> None:
    skus = [s for s in map(gcp_sku_from_json, GCP_A4_SKUS) if s is not None]
    assert [gcp_may_price_vm(s.description, s.usage_type) for s in skus] == [
        True,
        True,
        False,
        False,
    ]
    units = gcp_unit_prices(skus)
    a4 = row("gcp", "us-east1", "a4-highgpu-8g", "B200", 8, 224, 3968)
    assert gcp_prices(units, [a4]).prices[row_key(a4)] == {
        Market.ON_DEMAND: Decimal("128.88"),
        Market.SPOT: Decimal("39.6336"),
    }
    # A slice prices its own machine series only: a B200 slice is not an attachable GPU.
    a3 = row("gcp", "us-east1", "a3-highgpu-8g", "B200", 8, 208, 1872)
    assert row_key(a3) not in gcp_prices(units, [a3]).prices


def test_gcp_a3_ultra_host_skus_are_read_with_or_without_the_space() -> None:
    # "A3Ultra Instance Core" (SpareCores/sc-crawler tests/test_gcp.py @ 55aec325 files
    # a3-ultragpu-8g under the family "a3ultra", the first word of its SKUs) and "A3 Ultra
    # Instance Core" (as other billing data writes it): the same series. Test figures.
    skus = [
        GcpSku("A3Ultra Instance Core running in Americas", "OnDemand", ("us-east4",), "h",
               Decimal("0.03")),
        GcpSku("A3 Ultra Instance Ram running in Americas", "OnDemand", ("us-east4",),
               "GiBy.h", Decimal("0.002")),
        GcpSku("H200 141GB GPU running in Americas", "OnDemand", ("us-east4",), "h",
               Decimal("9")),
    ]  # fmt: skip
    h200 = row("gcp", "us-east4", "a3-ultragpu-8g", "H200", 8, 224, 2952)
    prices = gcp_prices(gcp_unit_prices(skus), [h200]).prices[row_key(h200)]
    assert prices == {Market.ON_DEMAND: 224 * Decimal("0.03") + 2952 * Decimal("0.002") + 72}
