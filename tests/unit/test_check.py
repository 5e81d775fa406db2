"""``costguard pricing check``: suspect rows are found; the bundled tables pass (every
suspect row there carries a status and a note the estimate shows)."""

from __future__ import annotations

import shutil
from datetime import date
from decimal import Decimal
from pathlib import Path

from costguard.pricing.catalog import InstancePrice, Market, PriceStatus
from costguard.pricing.check import check_catalog, check_instances
from costguard.pricing.tables import load_catalog, load_gpu_parts

CATALOG = load_catalog()
PARTS = load_gpu_parts(CATALOG.directory)


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
        r._replace(
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
        id(two): two._replace(ondemand_usd_per_hour=Decimal("1.47895")),  # host part only
        id(eight): eight._replace(accelerator_count=4, vcpus=Decimal(48), memory_gib=Decimal(340)),
        id(g5): g5._replace(spot_usd_per_hour=g5.ondemand_usd_per_hour),
    }
    west = row("us-west1", "a2-highgpu-1g")
    zero = west._replace(spot_usd_per_hour=Decimal(0))
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
    csv_path.write_text(text.replace(line, line.replace("3.67339", "2.2")), encoding="utf-8")
    result = run_cli("pricing", "check", "--pricing-dir", str(tables), "--format", "json")
    assert result.exit_code == 1
    document = result.json()
    new = [f for f in document["findings"] if not f["known"]]
    assert document["new"] == len(new) == 4
    assert {(f["region"], f["instance_type"]) for f in new} == {("us-east1", "a2-highgpu-1g")}
    # $2.20 (above its spot, $2.12) is below its A100 alone ($2.93): the host is missing too,
    # and so from its spot.
    assert {(f["market"], f["check"]) for f in new} == {
        (str(Market.ON_DEMAND), "regional-outlier"),
        (str(Market.ON_DEMAND), "family-sum"),
        (str(Market.ON_DEMAND), "missing-host"),
        (str(Market.SPOT), "missing-host"),
    }


def listed(rows: list[InstancePrice], wanted: dict[tuple[str, str, str], str | None]):
    """``rows`` with the named rows (and GPU, where given) put back as their source had
    them: both prices ``listed``, no note."""
    out = []
    for r in rows:
        key = (r.provider, r.region, r.instance_type)
        if key in wanted and wanted[key] in (None, r.accelerator):
            r = r._replace(
                ondemand_status=PriceStatus.LISTED, spot_status=PriceStatus.LISTED, note=""
            )
        out.append(r)
    return out


def test_the_rows_issue_26_found_are_flagged_when_put_back_as_listed() -> None:
    put_back = listed(
        list(CATALOG.instances),
        {
            ("gcp", "europe-west4", "a3-ultragpu-8g"): None,  # $49.48/h: 0.57x other H200s
            ("aws", "us-east-2", "p3.16xlarge"): None,  # spot $2.448 = 0.1 x $24.48
            ("aws", "eu-central-1", "p3.16xlarge"): None,
            ("aws", "eu-central-1", "p3.8xlarge"): None,
            ("aws", "ap-northeast-1", "p3.8xlarge"): None,
            ("aws", "ap-southeast-3", "p5.48xlarge"): None,  # the H100 headline's placeholder
            ("aws", "us-east-1", "p4d.24xlarge"): None,  # spot 0.25x its other regions
        },
    )
    found = {(f.region, f.instance_type, f.market, f.kind) for f in check_instances(put_back)
             if not f.known}  # fmt: skip
    spot, steady = Market.SPOT, Market.ON_DEMAND
    assert ("europe-west4", "a3-ultragpu-8g", steady, "regional-outlier") in found
    for region, size in (
        ("us-east-2", "p3.16xlarge"),
        ("eu-central-1", "p3.16xlarge"),
        ("eu-central-1", "p3.8xlarge"),
        ("ap-northeast-1", "p3.8xlarge"),
        ("ap-southeast-3", "p5.48xlarge"),
    ):
        assert (region, size, spot, "spot-placeholder") in found
    assert ("us-east-1", "p4d.24xlarge", spot, "regional-outlier") in found
    # asia-east1's P100 spot (0.28x when only the US and europe-west4 priced P100 spot) is
    # within range since australia-southeast1 and europe-west1 are priced (pricing/README).


def test_outliers_per_gpu_both_directions_any_size_of_the_family() -> None:
    # Another GPU, another cloud, another size: g6.12xlarge (4 x L4) in eu-central-1.
    base = row("eu-central-1", "g6.12xlarge", "aws")
    ondemand, spot = base.ondemand_usd_per_hour, base.spot_usd_per_hour
    assert ondemand is not None
    assert spot is not None
    for moved, market in (
        (base._replace(ondemand_usd_per_hour=ondemand / 2), Market.ON_DEMAND),
        (base._replace(ondemand_usd_per_hour=ondemand * Decimal("2.5")), Market.ON_DEMAND),
        (base._replace(spot_usd_per_hour=spot / 5), Market.SPOT),
        (base._replace(spot_usd_per_hour=spot * 8, ondemand_usd_per_hour=spot * 16), Market.SPOT),
    ):
        rows = [moved if r is base else r for r in CATALOG.instances]
        outliers = {
            (f.instance_type, f.market)
            for f in check_instances(rows)
            if f.kind == "regional-outlier" and f.region == "eu-central-1" and not f.known
        }
        assert ("g6.12xlarge", market) in outliers, moved


def test_a_placeholder_ratio_in_any_row_and_a_row_older_than_its_cited_source() -> None:
    g6 = row("us-east-1", "g6.xlarge", "aws")
    assert g6.ondemand_usd_per_hour is not None
    tenth = g6._replace(spot_usd_per_hour=g6.ondemand_usd_per_hour / 10)
    assert {f.kind for f in check_instances([tenth])} == {"spot-placeholder"}
    cited = g6._replace(note="on-demand read from the Price List of 2026-12-01")
    old = {f.kind for f in check_instances([cited], lambda r: date(2026, 1, 21))}
    assert old == {"older-than-source"}
    assert check_instances([cited], lambda r: date(2026, 12, 1)) == []


def test_the_check_dates_rows_by_their_table_part() -> None:
    findings = check_catalog(CATALOG)
    assert [f for f in findings if not f.known] == []
    assert {f.kind for f in findings} >= {"spot-placeholder", "regional-outlier"}


def test_a_total_that_is_the_gpus_alone_lacks_its_host() -> None:
    # GCP a4-highgpu-8g as the catalogue had it: $90.216 = 8 B200s at $11.277, host $0.
    put_back = listed(list(CATALOG.instances), {("gcp", "us-central1", "a4-highgpu-8g"): None})
    found = {
        (f.region, f.instance_type, f.market)
        for f in check_instances(put_back, parts=PARTS)
        if f.kind == "missing-host" and not f.known
    }
    assert found == {
        ("us-central1", "a4-highgpu-8g", Market.ON_DEMAND),
        ("us-central1", "a4-highgpu-8g", Market.SPOT),
    }
    # The bundled rows say so already (unverified, with the note): known, not new.
    bundled = [f for f in check_catalog(CATALOG, PARTS) if f.kind == "missing-host"]
    assert {f.instance_type for f in bundled} == {"a4-highgpu-8g"}
    assert all(f.known for f in bundled)
    # Without the parts, nothing tells a GPU-only total from a whole one.
    assert not [f for f in check_instances(put_back) if f.kind == "missing-host"]


def test_any_gpu_billed_apart_priced_without_its_host_is_found() -> None:
    alone = {(p.region, p.accelerator): p.ondemand_usd_per_gpu_hour for p in PARTS}
    for region, size, gpu in (
        ("us-central1", "g2-standard-4", "L4"),  # the host is 21% of the total
        ("asia-northeast1", "a3-highgpu-8g", "H100"),
        ("europe-west4", "n1-highmem-8", "T4"),  # GPUs attached to n1
        ("us-east5", "a3-ultragpu-8g", "H200"),
    ):
        whole = next(
            r
            for r in CATALOG.instances
            if (r.region, r.instance_type, r.accelerator) == (region, size, gpu)
        )
        assert not [f for f in check_instances([whole], parts=PARTS) if f.kind == "missing-host"]
        gpus = alone[(region, gpu)] * whole.accelerator_count
        for price in (gpus, gpus * Decimal("1.01"), gpus * Decimal("0.9")):
            bare = whole._replace(ondemand_usd_per_hour=price, spot_usd_per_hour=None)
            found = {(f.market, f.kind) for f in check_instances([bare], parts=PARTS)}
            assert found == {(Market.ON_DEMAND, "missing-host")}, (size, price)


def test_check_cli_flags_the_b200_row_put_back(run_cli, tmp_path: Path) -> None:
    tables = tmp_path / "tables"
    shutil.copytree(CATALOG.directory, tables)
    csv_path = tables / "gpu_instances.csv"
    text = csv_path.read_text(encoding="utf-8")
    line = next(x for x in text.splitlines() if x.startswith("gcp,us-east1,a4-highgpu-8g,"))
    fields = line.split(",")[:9]
    dates = line.split(",")[-3:]  # as_of, spot_as_of, source
    csv_path.write_text(text.replace(line, ",".join([*fields, "listed", "listed", "", *dates])))
    result = run_cli("pricing", "check", "--pricing-dir", str(tables), "--format", "json")
    assert result.exit_code == 1
    new = [f for f in result.json()["findings"] if not f["known"]]
    assert {(f["instance_type"], f["market"], f["check"]) for f in new} == {
        ("a4-highgpu-8g", str(Market.ON_DEMAND), "missing-host"),
        ("a4-highgpu-8g", str(Market.SPOT), "missing-host"),
    }
