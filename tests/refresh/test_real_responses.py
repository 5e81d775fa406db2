"""The refresh on recorded real responses (tests/refresh/recorded/SOURCES.md names where
each came from) and on the shapes real responses also take: $0 placeholder SKUs, Cloud
Services meters, mirrors dated years ago, spot history without on-demand, error bodies,
duplicates and other currencies."""

from __future__ import annotations

import copy
import json
import os
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard.pricing.catalog import Market, PriceStatus
from costguard.pricing.refresh.merge import FreshPrices, RowOutcome, merge_row
from costguard.pricing.refresh.parse import row_key
from costguard.pricing.refresh.parse_aws import aws_offer_products, aws_ondemand, aws_spot
from costguard.pricing.refresh.parse_azure import azure_item, azure_prices
from costguard.pricing.refresh.parse_gcp import gcp_prices, gcp_sku_from_json, gcp_unit_prices
from costguard.pricing.tables import load_catalog
from tests.refresh.records import GCP_A4_SKUS
from tests.refresh.servers import aws_product
from tests.refresh.servers import azure_item as azure_record

RECORDED = Path(__file__).parent / "recorded"
BUNDLED = load_catalog()
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / name).read_text(encoding="utf-8"))


def bundled_row(provider: str, region: str, instance_type: str):
    return next(
        r
        for r in BUNDLED.instances
        if (r.provider, r.region, r.instance_type) == (provider, region, instance_type)
    )


def gcp_fresh(skus: list[dict[str, Any]], rows: list) -> FreshPrices:
    dated: dict[tuple[str, Market], datetime] = {}
    parsed = (gcp_sku_from_json(s) for s in skus)
    units = gcp_unit_prices((s for s in parsed if s is not None), dated)
    regions = frozenset(r.region for r in rows)
    return FreshPrices(
        "gcp", regions, frozenset(Market), gcp_prices(units, rows, dated), "test", NOW, len(skus)
    )


def write(folder: Path, name: str, value: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(value, default=str), encoding="utf-8")


def one_azure_page(mirror: Path) -> None:
    """A mirror's first Azure page: one NC4as_T4_v3 in eastus at $0.5 an hour."""
    write(
        mirror / "azure",
        "prices-1.json",
        {"Items": [azure_record("Standard_NC4as_T4_v3", "eastus", "0.5")]},
    )


# --- GCP -------------------------------------------------------------------------------


def test_a_recorded_gcp_page_prices_a2_highgpu_1g_exactly() -> None:
    skus = recorded("gcp-skus-a2-americas.json")["skus"]
    rows = [bundled_row("gcp", region, "a2-highgpu-1g") for region in ("us-central1", "us-east1")]
    fresh = gcp_fresh(skus, rows)
    for row in rows:
        # 12 vCPU x 0.031611 + 85 GiB x 0.004237 + 1 GPU x 2.933908
        assert fresh.rows.prices[row_key(row)] == {Market.ON_DEMAND: Decimal("3.673385")}
        # The page lists no spot SKU: on-demand was read there, spot was not.
        assert fresh.markets_in(row.region) == {Market.ON_DEMAND}
    assert fresh.rows.dated["us-central1"].date() == date(2023, 3, 24)


def test_the_real_a3_mega_skus_price_every_a3_megagpu_row() -> None:
    # GCP names the A3 Mega host "A3Plus Instance Core/Ram" and its GPU "Nvidia H100 80GB
    # Mega GPU" ("... Plus GPU" in us-central1), not "A3 Mega Instance".
    skus = recorded("gcp-skus-a3plus-2024-09.json")["skus"]
    rows = [r for r in BUNDLED.instances if r.instance_type == "a3-megagpu-8g"]
    # SkyPilot's three and the eight read from Cyclenerd's pricing.yml (2026-07-30), which
    # these 2024 SKUs price within 1.1% of (on-demand).
    assert {r.region for r in rows} == {
        "us-central1",
        "us-west1",
        "europe-west4",
        "asia-northeast1",
        "asia-southeast1",
        "australia-southeast1",
        "europe-west1",
        "europe-west3",
        "us-east4",
        "us-east5",
        "us-west4",
    }
    fresh = gcp_fresh(skus, rows)
    for row in rows:
        assert set(fresh.rows.prices[row_key(row)]) == {Market.ON_DEMAND, Market.SPOT}, row
        steady = fresh.rows.prices[row_key(row)][Market.ON_DEMAND]
        # Cyclenerd's us-east4 figure (92.28, pricing/README.md) is the same tier.
        assert Decimal(85) < steady < Decimal(125), (row.region, steady)


def test_a_zero_priced_gcp_sku_is_no_price_and_the_real_spot_price_stays() -> None:
    skus = copy.deepcopy(recorded("gcp-skus-a2-americas.json")["skus"])
    gpu = next(s for s in skus if s["description"].startswith("Nvidia Tesla A100"))
    gpu["pricingInfo"][-1]["pricingExpression"]["tieredRates"][0]["unitPrice"].update(
        units="0", nanos=0
    )  # the catalogue's placeholder, as the bundled B200 host has one
    for description, usd_nanos in (
        ("Spot Preemptible A2 Instance Core running in Americas", 9_483_000),
        ("Spot Preemptible A2 Instance Ram running in Americas", 1_271_000),
        ("Nvidia Tesla A100 GPU attached to Spot Preemptible VMs running in Americas", 0),
    ):
        like = "Nvidia" if "Nvidia" in description else "Core" if "Core" in description else "Ram"
        spot = copy.deepcopy(next(s for s in skus if like in s["description"]))
        spot["description"] = description
        spot["category"]["usageType"] = "Preemptible"
        rate = spot["pricingInfo"][-1]["pricingExpression"]["tieredRates"][0]["unitPrice"]
        rate.update(units="1" if "Nvidia" in description else "0", nanos=usd_nanos)
        skus.append(spot)
    row = bundled_row("gcp", "us-central1", "a2-highgpu-1g")
    new, outcome = merge_row(row, gcp_fresh(skus, [row]))
    # Not host-only 0.739477 passed off as "listed": the old price, flagged.
    assert new.ondemand_usd_per_hour == row.ondemand_usd_per_hour
    assert new.ondemand_status is PriceStatus.UNVERIFIED
    # ... and the real spot price is not dropped as "above on-demand".
    assert new.spot_usd_per_hour == Decimal(12) * Decimal("0.009483") + Decimal(85) * Decimal(
        "0.001271"
    ) + Decimal(1)
    assert new.spot_status is PriceStatus.LISTED
    assert outcome is RowOutcome.UPDATED


def test_a_refresh_reprices_the_bundled_a4_rows_from_their_gpu_slices() -> None:
    # The slice SKUs as GCP names them (tests/refresh/records.py); before, the refresh
    # looked for "A4 Instance Core/Ram" SKUs, which do not exist, and the rows kept the
    # catalogue's figure, flagged.
    row = bundled_row("gcp", "us-east1", "a4-highgpu-8g")
    new, outcome = merge_row(row, gcp_fresh(GCP_A4_SKUS, [row]))
    assert (new.ondemand_usd_per_hour, new.spot_usd_per_hour) == (
        Decimal("128.88"),
        Decimal("39.6336"),
    )
    assert (new.ondemand_status, new.spot_status) == (PriceStatus.LISTED, PriceStatus.LISTED)
    assert outcome is RowOutcome.UPDATED


# --- Azure -----------------------------------------------------------------------------


def test_azure_cloud_services_dedicated_host_and_basic_items_are_not_vm_prices() -> None:
    vm = azure_record("Standard_B2ats_v2", "eastus", "0.0094")
    vm["productName"] = "Virtual Machines Basv2 Series"
    others = [
        {**vm, "productName": "Basv2 Series Cloud Services", "retailPrice": Decimal("0.0211")},
        {**vm, "productName": "Basv2 Series CloudServices", "retailPrice": Decimal("0.03")},
        {**vm, "productName": "Basv2 Series Dedicated Host", "retailPrice": Decimal("1.9")},
        {**vm, "productName": "Virtual Machines A Series Basic", "armSkuName": "Basic_A1"},
    ]
    assert all(azure_item(item) is None for item in others)
    rows = [bundled_row("azure", "eastus", "Standard_NC4as_T4_v3")]
    b2 = rows[0].__class__(**{**_fields(rows[0]), "instance_type": "Standard_B2ats_v2"})
    found = azure_prices([*others, vm], [b2])
    assert found.prices[row_key(b2)] == {Market.ON_DEMAND: Decimal("0.0094")}


def _fields(row: Any) -> dict[str, Any]:
    return row._asdict()


def test_a_real_azure_page_names_the_nd96asr_v4_size_with_its_gpu() -> None:
    # The API's armSkuName is Standard_ND96asr_A100_v4; the VM size (and the table's
    # name) is Standard_ND96asr_v4.
    items = recorded("azure-westeurope-nd96-2026-07.json")["Items"]
    row = bundled_row("azure", "eastus", "Standard_ND96asr_v4")._replace(region="westeurope")
    prices = azure_prices(items, [row])
    assert prices.prices[row_key(row)] == {Market.SPOT: Decimal("7.77854")}


def test_azure_duplicates_keep_the_newest_effective_date() -> None:
    old = azure_record("Standard_NC4as_T4_v3", "eastus", "0.60")
    old["effectiveStartDate"] = "2021-01-01T00:00:00Z"
    new = azure_record("Standard_NC4as_T4_v3", "eastus", "0.526")
    new["effectiveStartDate"] = "2024-06-01T00:00:00Z"
    row = bundled_row("azure", "eastus", "Standard_NC4as_T4_v3")
    for order in ([old, new], [new, old]):
        found = azure_prices(order, [row])
        assert found.prices[row_key(row)][Market.ON_DEMAND] == Decimal("0.526")


# --- mirrors (refresh --from) -------------------------------------------------------------


def _age(path: Path, when: datetime) -> None:
    for file in path.rglob("*.json"):
        os.utime(file, (when.timestamp(), when.timestamp()))


def test_a_mirror_of_2014_stays_dated_2014_and_the_estimate_says_stale(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    # The recorded AWS CLI spot answer (2014), for an instance type the tables carry.
    mirror = tmp_path / "responses"
    spot = recorded("aws-spot-m1-2014.json")
    for record in spot["SpotPriceHistory"]:
        record.update(
            InstanceType="g5.xlarge", AvailabilityZone="us-east-1" + record["AvailabilityZone"][-1]
        )
    write(mirror / "aws", "spot-1.json", spot)
    pricing = recorded("aws-pricing-storage-2018.json")
    pricing["PriceList"].append(json.dumps(aws_product("g5.xlarge", "us-east-1", "1.006")))
    write(mirror / "aws", "pricing-1.json", pricing)
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--region", "us-east-1")
    assert result.exit_code == 0, result.stderr
    cached = load_catalog(cache_dir / "current")
    part = cached.tables["gpu_instances"].part("aws", "us-east-1")
    assert part.as_of == date(2014, 1, 6)  # the records' date, not the day of the refresh
    estimate = run_cli(
        "estimate", "--instance-type", "g5.xlarge", "--hours", "1", "--region", "us-east-1"
    )
    assert estimate.exit_code == 0, estimate.stderr
    shown = estimate.stdout + estimate.stderr
    assert "2014-01-06" in shown
    assert "old" in shown.lower() or "stale" in shown.lower()


def test_a_mirror_dates_its_prices_by_fetched_json(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = tmp_path / "responses"
    one_azure_page(mirror)
    write(mirror / "azure", "fetched.json", {"fetched_at": "2026-10-02T08:00:00Z"})
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--region", "eastus")
    assert result.exit_code == 0, result.stderr
    part = load_catalog(cache_dir / "current").tables["gpu_instances"].part("azure", "eastus")
    assert part.as_of == date(2026, 10, 2)


def test_a_mirror_without_dates_is_as_old_as_its_files(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = tmp_path / "responses"
    item = azure_record("Standard_NC4as_T4_v3", "eastus", "0.5")
    del item["effectiveStartDate"]
    write(mirror / "azure", "prices-1.json", {"Items": [item]})
    _age(mirror, datetime(2025, 5, 17, 12, tzinfo=UTC))
    assert run_cli("pricing", "refresh", "--from", str(mirror), "--region", "eastus").exit_code == 0
    part = load_catalog(cache_dir / "current").tables["gpu_instances"].part("azure", "eastus")
    assert part.as_of == date(2025, 5, 17)


def test_spot_history_alone_does_not_mark_on_demand_unlisted(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = tmp_path / "responses"
    write(
        mirror / "aws",
        "pricing-1.json",
        {"PriceList": [json.dumps(aws_product("g5.xlarge", "us-west-2", "1.006"))]},
    )
    spot = {
        "SpotPriceHistory": [
            {
                "AvailabilityZone": "us-east-1a",
                "InstanceType": "g5.xlarge",
                "ProductDescription": "Linux/UNIX",
                "SpotPrice": "0.41",
                "Timestamp": "2026-11-30T10:00:00Z",
            }
        ]
    }
    write(mirror / "aws", "spot-1.json", spot)
    write(mirror, "fetched.json", {"fetched_at": "2026-11-30T12:00:00Z"})
    result = run_cli(
        "pricing",
        "refresh",
        "--from",
        str(mirror),
        "--region",
        "us-east-1",
        "--region",
        "us-west-2",
    )
    assert result.exit_code == 0, result.stderr
    cached = load_catalog(cache_dir / "current")
    before = {row_key(r): r for r in BUNDLED.instances if r.region == "us-east-1"}
    for row in cached.instances:
        if row.provider == "aws" and row.region == "us-east-1" and row.instance_type != "g5.xlarge":
            old = before[row_key(row)]
            # On-demand was not read in us-east-1: kept as it was, not "not listed".
            assert (row.ondemand_usd_per_hour, row.ondemand_status) == (
                old.ondemand_usd_per_hour,
                old.ondemand_status,
            )
            assert "on-demand not listed" not in row.note
    g5 = next(
        r for r in cached.instances if (r.region, r.instance_type) == ("us-east-1", "g5.xlarge")
    )
    assert g5.spot_usd_per_hour == Decimal("0.41")
    assert g5.ondemand_status == before[row_key(g5)].ondemand_status


def test_an_error_body_among_good_pages_fails_the_provider_with_its_message(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = tmp_path / "responses"
    one_azure_page(mirror)
    error = {"Error": {"Code": "TooManyRequests", "Message": "Rate limit exceeded, retry later"}}
    write(mirror / "azure", "prices-2.json", error)
    write(mirror / "gcp", "skus-1.json", recorded("gcp-skus-a2-americas.json"))
    write(
        mirror / "gcp",
        "skus-2.json",
        {
            "error": {
                "code": 403,
                "message": "Cloud Billing API has not been used",
                "status": "PERMISSION_DENIED",
            }
        },
    )
    result = run_cli(
        "pricing", "refresh", "--from", str(mirror), "--region", "eastus", "--region", "us-central1"
    )
    assert result.exit_code == 1
    assert "TooManyRequests: Rate limit exceeded, retry later" in result.stderr
    assert "PERMISSION_DENIED (403): Cloud Billing API has not been used" in result.stderr


def test_a_page_in_euros_is_an_error_naming_the_currency(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = tmp_path / "responses"
    item = {**azure_record("Standard_NC4as_T4_v3", "eastus", "0.48"), "currencyCode": "EUR"}
    write(mirror / "azure", "prices-1.json", {"BillingCurrency": "EUR", "Items": [item]})
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--region", "eastus")
    assert result.exit_code == 1
    assert "EUR, not USD" in result.stderr
    assert "no prices came back" not in result.stderr


def test_a_real_price_list_product_without_region_code_is_read_from_its_location() -> None:
    # The 2021 product names its region only as "US East (N. Virginia)".
    product = recorded("aws-getproducts-m5-large-2021.json")
    assert "regionCode" not in product["product"]["attributes"]
    dated: dict[tuple[str, Market], datetime] = {}
    assert aws_ondemand([product], dated) == {("us-east-1", "m5.large"): Decimal("0.096")}
    assert dated[("us-east-1", Market.ON_DEMAND)].date() == date(2021, 2, 5)


def test_aws_spot_and_products_carry_their_dates() -> None:
    dated: dict[tuple[str, Market], datetime] = {}
    spot = recorded("aws-spot-m1-2014.json")["SpotPriceHistory"]
    assert aws_spot(spot, dated) == {("us-west-1", "m1.xlarge"): Decimal("0.080000")}
    assert dated["us-west-1", Market.SPOT].date() == date(2014, 1, 6)
    products = recorded("aws-pricing-storage-2018.json")["PriceList"]
    assert aws_ondemand(json.loads(p) for p in products) == {}  # EBS: not an instance
    euro = aws_product("g5.xlarge", "us-east-1", "1")
    for term in euro["terms"]["OnDemand"].values():
        for dimension in term["priceDimensions"].values():
            dimension["pricePerUnit"] = {"CNY": "7.1"}
    with pytest.raises(Exception, match="CNY, not USD"):
        aws_ondemand([euro])


# --- AWS bulk offer file (a recorded real GPU price) ------------------------------------


def test_a_recorded_aws_offer_file_prices_p4d_exactly_without_its_zero_capacity_block() -> None:
    offer = recorded("aws-offer-p4d-us-east-1-2024.json")
    dated: dict[tuple[str, Market], datetime] = {}
    prices = aws_ondemand(aws_offer_products(offer), dated)
    # The Linux on-demand product, exactly; the Capacity Block product of the same type
    # ($0.00 per hour in the file) is another purchase option, not a price.
    assert prices == {("us-east-1", "p4d.24xlarge"): Decimal("32.7726000000")}
    assert dated["us-east-1", Market.ON_DEMAND].date() == date(2024, 5, 28)


def test_a_mirror_holding_the_public_offer_file_refreshes_aws_on_demand(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = tmp_path / "responses"
    (mirror / "aws").mkdir(parents=True)
    # Byte for byte as recorded: the file a region's offer URL serves, trimmed by its recorder.
    (mirror / "aws" / "pricing-us-east-1.json").write_bytes(
        (RECORDED / "aws-offer-p4d-us-east-1-2024.json").read_bytes()
    )
    result = run_cli(
        "pricing", "refresh", "--from", str(mirror), "--provider", "aws", "--region", "us-east-1"
    )
    assert result.exit_code == 0, result.stderr
    cached = load_catalog(cache_dir / "current")
    p4d = next(
        r
        for r in cached.instances
        if (r.provider, r.region, r.instance_type) == ("aws", "us-east-1", "p4d.24xlarge")
    )
    assert p4d.ondemand_usd_per_hour == Decimal("32.7726")
    assert p4d.ondemand_status is PriceStatus.LISTED
    part = cached.tables["gpu_instances"].part("aws", "us-east-1")
    assert part.as_of == date(2024, 5, 28)  # the file's publicationDate


def test_a_real_azure_page_one_of_many_is_an_incomplete_answer(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    # Page 1 of eastus2 (NextPageLink set), as its recorder saved it: 1,000 of the
    # region's items, 12 of them for sizes the tables have.
    page = recorded("azure-eastus2-page1-2026-01.json")
    assert page["NextPageLink"]
    write(tmp_path / "mirror" / "azure", "prices-eastus2-1.json", page)
    before = BUNDLED.tables["gpu_instances"].part("azure", "eastus2").as_of
    result = run_cli(
        "pricing", "refresh", "--from", str(tmp_path / "mirror"), "--region", "eastus2",
        "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.json()["providers"][0]["regions_incomplete"] == ["eastus2"]
    fresh = load_catalog(cache_dir / "current")
    rows = {r.instance_type: r for r in fresh.instances if r.region == "eastus2"}
    assert rows["Standard_NC48ads_A100_v4"].ondemand_usd_per_hour == Decimal("7.346")
    # The page prices NC6s_v3 too (0.565488 spot): a retired size, it gets no row back.
    assert "Standard_NC6s_v3" not in rows
    # The 13 sizes the page does not reach are not "not listed": they are on later pages.
    assert not any("not listed" in r.note for r in rows.values())
    assert len(rows) == len([r for r in BUNDLED.instances if r.region == "eastus2"])
    # The region keeps its date: only part of it was read.
    assert fresh.tables["gpu_instances"].part("azure", "eastus2").as_of == before


def test_an_azure_mirror_is_dated_when_it_was_read_not_when_its_prices_took_effect(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    # A whole answer (no NextPageLink) downloaded on 2026-01-11 whose newest price took
    # effect on 2025-12-01: its prices were read, and held, on 2026-01-11.
    mirror = tmp_path / "responses"
    item = azure_record("Standard_NC4as_T4_v3", "eastus", "0.5")
    item["effectiveStartDate"] = "2025-12-01T00:00:00Z"
    write(mirror / "azure", "prices-1.json", {"Items": [item], "NextPageLink": None})
    _age(mirror, datetime(2026, 1, 11, 9, tzinfo=UTC))
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--region", "eastus")
    assert result.exit_code == 0, result.stderr
    part = load_catalog(cache_dir / "current").tables["gpu_instances"].part("azure", "eastus")
    assert part.as_of == date(2026, 1, 11)


def test_an_answer_about_one_cpu_type_neither_flags_nor_redates_the_gpu_table(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    # The real m5.large product and spot history of 2021: nothing about any GPU type.
    mirror = tmp_path / "responses"
    product = recorded("aws-getproducts-m5-large-2021.json")
    write(mirror / "aws", "pricing-1.json", {"FormatVersion": "aws_v1",
                                             "PriceList": [json.dumps(product)]})  # fmt: skip
    write(mirror / "aws", "spot-1.json", recorded("aws-spot-m5-large-2021.json"))
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--region", "us-east-1")
    assert result.exit_code == 0, result.stderr
    fresh = load_catalog(cache_dir / "current")
    gpu = fresh.tables["gpu_instances"].part("aws", "us-east-1")
    assert gpu.as_of == BUNDLED.tables["gpu_instances"].part("aws", "us-east-1").as_of
    east = [r for r in fresh.instances if (r.provider, r.region) == ("aws", "us-east-1")]
    assert not any("not listed" in r.note for r in east if r.accelerator)
    m5 = next(r for r in east if r.instance_type == "m5.large")
    assert m5.ondemand_usd_per_hour == Decimal("0.096")
    assert m5.spot_usd_per_hour == Decimal("0.0381")  # the newest per zone, lowest zone


def test_a_mirrors_spot_history_of_one_family_says_nothing_about_the_others(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    # Spot history as someone asked for the g5 family (DescribeSpotPriceHistory's
    # documented shape): it prices g5 and says nothing about p4d's or g6's spot.
    mirror = tmp_path / "responses"
    record = {"AvailabilityZone": "us-east-1a", "InstanceType": "g5.xlarge",
              "ProductDescription": "Linux/UNIX", "SpotPrice": "0.41",
              "Timestamp": "2026-12-01T10:00:00Z"}  # fmt: skip
    write(mirror / "aws", "spot-1.json", {"SpotPriceHistory": [record]})
    write(mirror / "aws", "pricing-1.json", {"FormatVersion": "aws_v1", "PriceList": []})
    write(mirror, "fetched.json", {"fetched_at": "2026-12-02T12:00:00Z"})
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--region", "us-east-1")
    assert result.exit_code == 0, result.stderr
    fresh = load_catalog(cache_dir / "current")
    east = {r.instance_type: r for r in fresh.instances
            if (r.provider, r.region) == ("aws", "us-east-1") and r.accelerator}  # fmt: skip
    assert east["g5.xlarge"].spot_usd_per_hour == Decimal("0.41")
    assert "spot not listed" in east["g5.2xlarge"].note  # a size of the family it read
    others = [r for t, r in east.items() if not t.startswith("g5.")]
    assert len(others) > 40
    for row in others:
        old = bundled_row("aws", "us-east-1", row.instance_type)
        assert (row.spot_usd_per_hour, row.spot_status) == (old.spot_usd_per_hour, old.spot_status)
        assert "not listed" not in row.note, row.instance_type
    part = fresh.tables["gpu_instances"].part("aws", "us-east-1")
    assert part.as_of == BUNDLED.tables["gpu_instances"].part("aws", "us-east-1").as_of
    assert part.source.startswith("spot of g5 from ")


def test_the_bundled_eastus2_rows_agree_with_the_recorded_2026_page() -> None:
    # Every price the real page of 2026-01-11 lists for a bundled eastus2 row is the
    # bundled price (NC6s_v3 spot was 0.40484 in the SkyPilot fork, 0.565488 in the API).
    items = recorded("azure-eastus2-page1-2026-01.json")["Items"]
    rows = [r for r in BUNDLED.instances if (r.provider, r.region) == ("azure", "eastus2")]
    read = azure_prices(items, rows).prices
    assert read
    for row in rows:
        for market, price in read.get(row_key(row), {}).items():
            assert row.usd_per_hour(market) == price, (row.instance_type, market)
