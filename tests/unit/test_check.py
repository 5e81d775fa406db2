"""``costguard pricing check``: suspect rows are found; the bundled tables pass (every
suspect row there carries a status and a note the estimate shows)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

from costguard.pricing.catalog import InstancePrice, Market, PriceStatus
from costguard.pricing.check import check_instances
from costguard.pricing.tables import load_catalog

CATALOG = load_catalog()


def row(region: str, instance_type: str, provider: str = "gcp") -> InstancePrice:
    return next(
        r
        for r in CATALOG.instances
        if (r.provider, r.region, r.instance_type) == (provider, region, instance_type)
    )


def kinds(rows: list[InstancePrice]) -> set[tuple[str, str, str]]:
    return {(f.region, f.instance_type, f.kind) for f in check_instances(rows) if not f.known}


def test_the_bundled_tables_pass_the_check() -> None:
    findings = check_instances(CATALOG.instances)
    assert [f for f in findings if not f.known] == []
    # The europe-west4 A100 rows the check found are corrected from a second source,
    # and say so.
    a100 = row("europe-west4", "a2-highgpu-1g")
    assert a100.ondemand_status is PriceStatus.CORRECTED
    assert "0.55x the US price" in a100.note
    assert a100.ondemand_usd_per_hour == Decimal("3.74797")


def test_the_europe_west4_a100_case_is_found_when_it_is_listed() -> None:
    # As the source had them: the GPU part at 0.55x the US price, "listed".
    source = {
        "a2-highgpu-1g": "2.42771",
        "a2-highgpu-2g": "4.85543",
        "a2-highgpu-4g": "9.71086",
        "a2-highgpu-8g": "19.4217",
        "a2-megagpu-16g": "35.50241",
    }
    rows = [
        replace(
            r,
            ondemand_usd_per_hour=Decimal(source[r.instance_type]),
            ondemand_status=PriceStatus.LISTED,
            note="",
        )
        if r.region == "europe-west4" and r.instance_type in source
        else r
        for r in CATALOG.instances
    ]
    found = kinds(rows)
    for size in ("a2-highgpu-1g", "a2-highgpu-8g", "a2-megagpu-16g"):
        assert ("europe-west4", size, "regional-outlier") in found
    assert not any(region == "us-central1" for region, _, _ in found)


def test_zero_prices_spot_at_on_demand_host_only_sums_and_gpu_counts() -> None:
    two = row("us-central1", "a2-highgpu-2g")
    eight = row("us-central1", "a2-highgpu-8g")
    g5 = row("us-east-1", "g5.xlarge", "aws")
    broken = {
        id(two): replace(two, ondemand_usd_per_hour=Decimal("1.47895")),  # host part only
        id(eight): replace(eight, accelerator_count=4, vcpus=Decimal(48), memory_gib=Decimal(340)),
        id(g5): replace(g5, spot_usd_per_hour=g5.ondemand_usd_per_hour),
    }
    west = row("us-west1", "a2-highgpu-1g")
    zero = replace(west, spot_usd_per_hour=Decimal(0))
    rows = [broken.get(id(r), r) for r in CATALOG.instances if r != west]
    found = kinds([*rows, zero])
    assert ("us-central1", "a2-highgpu-2g", "family-sum") in found
    assert ("us-central1", "a2-highgpu-2g", "regional-outlier") in found
    assert ("us-central1", "a2-highgpu-8g", "gpu-count") in found
    assert ("us-east-1", "g5.xlarge", "spot-not-cheaper") in found
    assert ("us-west1", "a2-highgpu-1g", "zero-price") in found


def test_check_cli_exits_1_on_a_new_suspect_row(run_cli, tmp_path: Path) -> None:
    assert run_cli("pricing", "check").exit_code == 0
    tables = tmp_path / "tables"
    shutil.copytree(CATALOG.directory, tables)
    csv_path = tables / "gpu_instances.csv"
    text = csv_path.read_text(encoding="utf-8")
    line = next(x for x in text.splitlines() if x.startswith("gcp,us-east1,a2-highgpu-1g,"))
    csv_path.write_text(text.replace(line, line.replace("3.67339", "1.9")), encoding="utf-8")
    result = run_cli("pricing", "check", "--pricing-dir", str(tables), "--format", "json")
    assert result.exit_code == 1
    document = result.json()
    new = [f for f in document["findings"] if not f["known"]]
    assert document["new"] == len(new) == 2
    assert {(f["region"], f["instance_type"], f["market"]) for f in new} == {
        ("us-east1", "a2-highgpu-1g", str(Market.ON_DEMAND))
    }
    assert {f["check"] for f in new} == {"regional-outlier", "family-sum"}
