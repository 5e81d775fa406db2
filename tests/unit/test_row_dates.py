"""Every instance row carries its price's own date and source (issue 48): the bundled
tables, the loader's rules for a blank or unknown date, what `estimate` and `pricing
show` say about them, and the share of GPU rows priced before the newest dated copies."""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Callable
from datetime import date
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard.errors import CostguardError
from costguard.pricing.catalog import (
    Market,
    as_of_text,
    price_date,
    stale_summary,
    staleness,
)
from costguard.pricing.refresh.cache import render_instances
from costguard.pricing.tables import bundled_tables_dir, load_catalog

CATALOG = load_catalog()
#: The day the newest dated copies read (AWS 2026-08-26, Azure 2026-08-22) were made:
#: a price dated before it is "old" for issue 48's measure, and so is an unknown date.
CURRENT_FROM = date(2026, 8, 1)
#: Issue 48's target: at most 5% of the bundled GPU rows priced before CURRENT_FROM.
TARGET_OLD_SHARE = 0.05
#: How many GPU rows are old today (2026-12-06): the count may fall, never grow, so that a
#: row added or re-read from an old or undated copy fails here even while the share test
#: above is an expected failure. Lower it when rows are re-dated.
OLD_ROWS_TODAY = 146


def gpu_rows() -> list[Any]:
    return [row for row in CATALOG.instances if row.accelerator]


def test_every_bundled_gpu_row_names_its_date_and_source() -> None:
    with (bundled_tables_dir() / "gpu_instances.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows
    for row in rows:
        assert row["as_of"], row  # a date or "unknown", never left to the region's part
        assert row["source"], row


def old_gpu_rows() -> list[Any]:
    """GPU rows priced before CURRENT_FROM, an unknown date counted as old."""
    return [r for r in gpu_rows() if r.as_of is None or r.as_of < CURRENT_FROM]


def test_every_aws_on_demand_row_is_priced_from_august_2026() -> None:
    old_aws = [r for r in old_gpu_rows() if r.provider == "aws"]
    aws = [r for r in gpu_rows() if r.provider == "aws"]
    # every AWS on-demand row re-dated to 2026-08-26; p5e.48xlarge (spot only) stays unknown
    assert len(old_aws) / len(aws) <= TARGET_OLD_SHARE, old_aws


@pytest.mark.xfail(
    strict=True,
    reason="issue 48's target is not reached: 146 of 1,624 GPU rows (9.0%) have no copy of "
    "August 2026 or later reachable (GCP N1 + T4/P4/V100/P100 125 and TPU v5e 10, of 2026-07-02; "
    "TPU v2/v3 6, H200 2; Azure US 1; AWS p5e 2; the 70 rows of retired Azure series, 9 of them "
    "old, left both counts): pricing/README.md, 'Row dates and sources'",
)
def test_at_most_five_percent_of_gpu_rows_are_priced_before_august_2026() -> None:
    rows = gpu_rows()
    old = old_gpu_rows()
    share = len(old) / len(rows)
    by_provider = {
        p: sum(1 for r in old if r.provider == p) / sum(1 for r in rows if r.provider == p)
        for p in ("aws", "gcp", "azure")
    }
    each = ", ".join(f"{p} {s:.1%}" for p, s in by_provider.items())
    print(f"GPU rows priced before {CURRENT_FROM} (unknown counted): {len(old)} of {len(rows)}, "
          f"{share:.1%}; {each}")  # fmt: skip
    assert share <= TARGET_OLD_SHARE, f"{len(old)} of {len(rows)} ({share:.1%}); {each}"


def test_the_old_rows_never_grow_beyond_todays_count() -> None:
    old = old_gpu_rows()
    each = sorted({(r.provider, r.source) for r in old})
    assert len(old) <= OLD_ROWS_TODAY, f"{len(old)} old GPU rows, at most {OLD_ROWS_TODAY}: {each}"


def test_a3_edge_is_priced_as_its_dated_copy_lists_it() -> None:
    edge = [r for r in gpu_rows() if r.provider == "gcp" and r.instance_type == "a3-edgegpu-8g"]
    # anycloud-sh/catalog gcp/vms.csv @ 0337606d lists a3-edgegpu-8g in these 15 regions
    assert len({r.region for r in edge}) == 15, sorted(r.region for r in edge)
    compared = 0
    for row in edge:
        assert (row.accelerator, row.accelerator_count) == ("H100", 8)
        assert row.as_of == date(2026, 8, 13)
        assert row.source == "gcp-anycloud-0337606d"
        high = CATALOG.row("gcp", row.region, "a3-highgpu-8g")
        if high is not None:  # the same SKUs: A3 vCPUs and memory and 8 H100, no Local SSD
            assert row.ondemand_usd_per_hour is not None
            assert high.ondemand_usd_per_hour is not None
            gap = abs(row.ondemand_usd_per_hour - high.ondemand_usd_per_hour)
            assert gap <= Decimal("0.00002"), row.region
            compared += 1
    assert compared == 13


#: Rows of SkyPilot's catalog v9 `gcp/vms.csv` @ 2c3d7ea7 (GPU and TPU rows: region, GPU,
#: count, on-demand, spot) and the n1 host of Cyclenerd's `pricing.yml` @ 10e6ce4 (`hour`,
#: `hour_spot`; the copy's own n1 rows carry the same figures), as read on 2026-12-06.
JULY_GPU_ROWS = {
    ("us-central1", "T4", 1): ("0.35", "0.1915"),
    ("us-central1", "T4", 2): ("0.7", "0.383"),
    ("us-central1", "T4", 4): ("1.4", "0.766"),
    ("southamerica-east1", "T4", 1): ("0.48", "0.2394"),
    ("europe-west4", "V100", 1): ("2.604", "0.722"),
    ("asia-east1", "P100", 2): ("3.2", "0.288"),
}
JULY_N1_HOSTS = {
    ("us-central1", "n1-highmem-4"): ("0.236606", "0.079478"),
    ("us-central1", "n1-highmem-8"): ("0.473212", "0.158956"),
    ("us-central1", "n1-standard-64"): ("3.039984", "1.0212"),
    ("southamerica-east1", "n1-highmem-4"): ("0.37557", "0.07148"),
    ("europe-west4", "n1-highmem-8"): ("0.520944", "0.275248"),
    ("asia-east1", "n1-highmem-16"): ("1.095856", "0.22568"),
}
JULY_TPU_ROWS = {("us-central1", "tpu-v5litepod-4"): ("4.8", "1.19084"),
                 ("asia-east1", "tpu-v5litepod-1"): ("1.38948", "0.47652")}  # fmt: skip


def test_n1_gpu_and_tpu_rows_are_the_july_copy_host_plus_gpu() -> None:
    n1 = [r for r in gpu_rows() if r.provider == "gcp" and r.instance_type.startswith("n1-")]
    assert len(n1) == 125
    v5e = [r for r in gpu_rows() if r.instance_type.startswith("tpu-v5litepod")]
    for row in n1 + v5e:  # none of unknown date or of CoCalc's February copy left
        assert row.as_of == date(2026, 7, 2), row
        assert row.source == "gcp-skypilot-v9-2026-07-02", row
    cent = Decimal("0.00001")
    checked = 0
    for row in n1:
        gpu = JULY_GPU_ROWS.get((row.region, row.accelerator, row.accelerator_count))
        host = JULY_N1_HOSTS.get((row.region, row.instance_type))
        if gpu is None or host is None:
            continue
        # on-demand: the figure the row had, where the copy's sum is within rounding of it
        ondemand = Decimal(host[0]) + Decimal(gpu[0])
        assert row.ondemand_usd_per_hour is not None
        assert abs(row.ondemand_usd_per_hour - ondemand) <= Decimal("0.00002"), row.region
        spot = (Decimal(host[1]) + Decimal(gpu[1])).quantize(cent, ROUND_HALF_UP)
        assert row.spot_usd_per_hour == spot, (row.region, row.instance_type)
        checked += 1
    assert checked == 6
    for (region, tpu), (tpu_ondemand, tpu_spot) in JULY_TPU_ROWS.items():
        found = CATALOG.row("gcp", region, tpu)
        assert found is not None
        assert found.usd_per_hour(Market.ON_DEMAND) == Decimal(tpu_ondemand)
        assert found.usd_per_hour(Market.SPOT) == Decimal(tpu_spot)


G4_SLICES = {"g4-standard-6": ("RTXPRO6000-1/8", 8), "g4-standard-12": ("RTXPRO6000-1/4", 4),
             "g4-standard-24": ("RTXPRO6000-1/2", 2)}  # fmt: skip


def test_g4_slices_are_priced_wherever_the_whole_gpu_is() -> None:
    whole = {r.region: r for r in gpu_rows() if r.instance_type == "g4-standard-48"}
    assert len(whole) == 17
    for instance_type, (accelerator, parts) in G4_SLICES.items():
        for region, full in whole.items():
            row = CATALOG.row("gcp", region, instance_type)
            assert row is not None, (region, instance_type)
            assert (row.accelerator, row.accelerator_count) == (accelerator, 1)
            assert row.as_of == date(2026, 8, 20)
            assert row.source == "gcp-cyclenerd-2026-08-20"
            assert row.ondemand_usd_per_hour is not None
            assert full.ondemand_usd_per_hour is not None
            # 1/parts of the machine with one GPU (its memory a little less than 1/parts)
            share = row.ondemand_usd_per_hour * parts / full.ondemand_usd_per_hour
            assert Decimal("0.98") < share < Decimal("1.0001"), (region, instance_type, share)


def test_a_whole_gpu_is_never_priced_by_a_slice(run_cli: Callable[..., Any]) -> None:
    def instance_types(gpu: str) -> set[str]:
        result = run_cli("estimate", "--gpu", gpu, "--hours", "1", "--provider", "gcp",
                         "--region", "us-central1", "--format", "json")  # fmt: skip
        assert result.exit_code == 0, result.stderr
        return {o["instance_type"] for o in json.loads(result.stdout)["options"]}

    assert instance_types("rtx-pro-6000") == {"g4-standard-48"}
    assert instance_types("rtx-pro-6000-1/8") == {"g4-standard-6"}
    assert instance_types("rtx-pro-6000-1/2") == {"g4-standard-24"}


def test_an_aws_row_is_dated_by_its_on_demand_copy_and_its_spot_is_unknown() -> None:
    row = CATALOG.row("aws", "us-east-1", "g5.xlarge")
    assert row is not None
    assert row.price_as_of(Market.ON_DEMAND) == date(2026, 8, 26)
    assert row.price_as_of(Market.SPOT) is None
    assert "aws-vantage-2026-08-26" in row.source
    place = ("gpu_instances", "aws", "us-east-1", Market.SPOT, "g5.xlarge")
    assert price_date(CATALOG, place) is None


#: On-demand figures of anycloud-sh/catalog `azure/vms.csv` @ 0498db74 (2026-08-01 or later)
#: that differ from the bundled Linux price, as read on 2026-12-06 (offsets 4,436,000 to its
#: end, its N-series rows): all 18 of the 175 bundled Azure rows it priced, less the 5 of the
#: retired NCv3 and NVv4 series the tables dropped since (costguard.pricing.retired). The
#: European ones are rows whose Linux price the Retail Prices snapshot of 2026-08-22 gives.
WINDOWS_METER_ROWS = {
    ("eastus", "Standard_NC4as_T4_v3"): "0.71",
    ("eastus2", "Standard_NC40ads_H100_v5"): "8.82",
    ("eastus2", "Standard_ND96isr_H200_v5"): "89.216",
    ("eastus2", "Standard_NV36adms_A10_v5"): "6.176",
    ("westus2", "Standard_NV12ads_A10_v5"): "1.46",
    ("westus2", "Standard_NV72ads_A10_v5"): "9.832",
    ("francecentral", "Standard_NC16as_T4_v3"): "2.143",
    ("francecentral", "Standard_NV36adms_A10_v5"): "7.306",
    ("francecentral", "Standard_NV72ads_A10_v5"): "11.462",
    ("northeurope", "Standard_NC64as_T4_v3"): "7.797",
    ("northeurope", "Standard_NC8as_T4_v3"): "1.206",
    ("swedencentral", "Standard_NC80adis_H100_v5"): "21.828",
    ("swedencentral", "Standard_ND96isr_H200_v5"): "114.688",
}
#: Azure's Windows Server license on these VMs, per vCPU-hour.
WINDOWS_LICENSE = Decimal("0.046")


def test_a_us_row_is_dated_by_a_copy_that_lists_its_windows_meter() -> None:
    """The 2026-08-01 copy prices some sizes at their Windows meter: exactly the Linux price
    plus the license per vCPU, in Europe (where a dated Linux snapshot gives the Linux price)
    as in the US, so the US rows whose Linux price it implies carry its date."""
    redated = 0
    for (region, instance_type), windows in WINDOWS_METER_ROWS.items():
        row = CATALOG.row("azure", region, instance_type)
        assert row is not None, (region, instance_type)
        assert row.ondemand_usd_per_hour is not None
        assert row.vcpus is not None
        license_fee = row.vcpus * WINDOWS_LICENSE
        assert Decimal(windows) - row.ondemand_usd_per_hour == license_fee, (region, instance_type)
        if region in ("eastus", "eastus2", "westus2"):
            assert row.as_of == date(2026, 8, 1), row
            assert row.source.startswith("azure-anycloud-0498db74"), row
            redated += 1
        else:
            assert row.as_of == date(2026, 8, 22), row
    assert redated == 6


def _copy(tmp_path: Path, edit: Callable[[list[dict[str, str]]], None]) -> Path:
    folder = tmp_path / "tables"
    shutil.copytree(bundled_tables_dir(), folder)
    path = folder / "gpu_instances.csv"
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    edit(rows)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return folder


def _first(rows: list[dict[str, str]], region: str) -> dict[str, str]:
    return next(r for r in rows if r["region"] == region)


def test_a_blank_date_is_its_parts_and_unknown_is_none(tmp_path: Path) -> None:
    def edit(rows: list[dict[str, str]]) -> None:
        _first(rows, "af-south-1").update(as_of="", spot_as_of="", source="")
        _first(rows, "ap-east-1").update(as_of="unknown", spot_as_of="2026-09-01")

    catalog = load_catalog(_copy(tmp_path, edit))
    blank = next(r for r in catalog.instances if r.region == "af-south-1")
    part = catalog.tables["gpu_instances"].part("aws", "af-south-1")
    assert (blank.as_of, blank.spot_as_of, blank.source) == (part.as_of, part.as_of, part.source)
    unknown = next(r for r in catalog.instances if r.region == "ap-east-1")
    assert unknown.as_of is None
    assert unknown.spot_as_of == date(2026, 9, 1)


def test_a_malformed_row_date_fails_with_its_line(tmp_path: Path) -> None:
    folder = _copy(tmp_path, lambda rows: rows[0].update(as_of="last week"))
    with pytest.raises(CostguardError) as info:
        load_catalog(folder)
    assert "line 2" in info.value.message
    assert "as_of" in info.value.message


def test_a_refresh_writes_the_row_dates_it_read(tmp_path: Path) -> None:
    """What `pricing refresh` writes keeps every row's dates and source (a region it
    did not read keeps its rows' own, not the day of the refresh)."""
    folder = _copy(tmp_path, lambda rows: None)
    rows = [r for r in CATALOG.instances if r.accelerator]
    (folder / "gpu_instances.csv").write_bytes(render_instances(rows))
    again = load_catalog(folder)
    assert [(r.as_of, r.spot_as_of, r.source) for r in again.instances if r.accelerator] == [
        (r.as_of, r.spot_as_of, r.source) for r in rows
    ]


def test_the_stale_warning_counts_the_old_prices_shown() -> None:
    places = [
        ("gpu_instances", "aws", "us-east-1", Market.ON_DEMAND, "g5.xlarge"),  # 2026-08-26
        ("gpu_instances", "aws", "us-east-1", Market.SPOT, "g5.xlarge"),  # unknown
        ("gpu_instances", "azure", "westeurope", Market.ON_DEMAND, "Standard_NV36ads_A10_v5"),
    ]
    today = date(2026, 9, 10)
    stale = staleness(CATALOG, places, today)
    assert stale is not None
    assert (stale.old, stale.shown, stale.unknown) == (1, 3, 1)
    assert stale_summary(stale, today) == "1 of 3 prices shown are old: 1 of unknown date"
    later = staleness(CATALOG, places, date(2026, 12, 6))
    assert later is not None
    assert (later.old, later.oldest, later.newest) == (3, date(2026, 8, 22), date(2026, 8, 26))
    assert stale_summary(later, date(2026, 12, 6)).startswith(
        "3 of 3 prices shown are old: from 2026-08-22 (106 days) to 2026-08-26"
    )


def test_estimate_json_gives_each_option_its_price_date(run_cli: Callable[..., Any]) -> None:
    result = run_cli("estimate", "--gpu", "a10g", "--hours", "1", "--provider", "aws",
                     "--region", "us-east-1", "--format", "json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    options = json.loads(result.stdout)["options"]
    assert options
    for option in options:
        row = CATALOG.row("aws", "us-east-1", option["instance_type"])
        assert row is not None
        assert option["price_as_of"] == as_of_text(row.price_as_of(Market(option["market"])))
    assert {o["price_as_of"] for o in options} >= {"2026-08-26"}


def test_pricing_show_gives_each_row_its_date_and_source(run_cli: Callable[..., Any]) -> None:
    result = run_cli("pricing", "show", "gpu_instances", "--provider", "azure",
                     "--region", "westeurope", "--format", "json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    assert rows
    assert {r["as_of"] for r in rows} == {"2026-08-22"}
    assert all(r["source"].startswith("azure-radar-2026-08-22") for r in rows)
