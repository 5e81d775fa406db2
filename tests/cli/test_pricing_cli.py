"""`costguard pricing show` and `costguard pricing gpus`."""

from __future__ import annotations

import csv
import io
import shutil
from decimal import Decimal
from pathlib import Path

from costguard.pricing.catalog import Market

REPO_PRICING = Path(__file__).resolve().parents[2] / "pricing"


def test_show_summary_lists_every_table_with_date_and_source(run_cli) -> None:
    doc = run_cli("pricing", "show", "--format", "json").json()
    names = {t["table"] for t in doc["tables"]}
    tables = {"gpu_instances", "cpu_instances", "storage", "transfer", "regions", "interruptions"}
    assert names == tables
    assert all(t["as_of"] and t["source"] and t["rows"] > 0 for t in doc["tables"])
    table = run_cli("pricing", "show")
    assert table.exit_code == 0
    assert "gpu_instances" in table.stdout


def test_show_dates_each_table_by_its_oldest_price_never_the_day_it_was_written(
    run_cli, catalog
) -> None:
    """Issue 48: a price's date is its source's, never the day it was read. The summary
    dated gpu_instances, cpu_instances, storage and transfer 2026-11-30, the day their
    files were written, with rows of 2022 and of no known date in them."""
    doc = run_cli("pricing", "show", "--format", "json").json()
    dated = {t["table"]: t["as_of"] for t in doc["tables"]}
    assert dated["gpu_instances"] == "unknown"  # AWS spot prices of no known date
    assert dated["cpu_instances"] == "unknown"  # SkyPilot's undated copy
    assert dated["storage"] == min(r.as_of for r in catalog.storage).isoformat()
    assert dated["transfer"] == min(r.as_of for r in catalog.transfer).isoformat()
    assert dated["regions"] == catalog.tables["regions"].as_of.isoformat()  # a list, not prices
    undated = {
        p: sum(
            1
            for row in catalog.instances
            for market in Market
            if row.provider == p
            and row.usd_per_hour(market) is not None
            and row.price_as_of(market) is None
        )
        for p in ("aws", "gcp", "azure")
    }
    assert undated["aws"] > 0
    for cloud, figures in doc["instance_prices_by_cloud"].items():
        assert figures["unknown_date"] == undated[cloud]
    said = " ".join(run_cli("pricing", "show").stdout.split())
    assert f"{undated['aws']} of unknown date" in said
    storage = run_cli("pricing", "show", "storage").stdout.splitlines()[0]
    assert f"as of {dated['storage']}" in storage


def test_show_says_per_cloud_how_old_its_newest_and_oldest_prices_are(run_cli) -> None:
    doc = run_cli("pricing", "show", "--format", "json").json()
    by_cloud = doc["instance_prices_by_cloud"]
    assert set(by_cloud) == {"aws", "gcp", "azure"}
    # Every AWS on-demand price is of vantage's data of 2026-08-26 (its spot: unknown).
    assert by_cloud["aws"]["newest"] >= "2026-08-26"  # the CPU sample: its table's date
    assert by_cloud["aws"]["oldest"] == "2026-08-26"
    assert by_cloud["gcp"]["oldest"] == "2026-02-24"
    assert by_cloud["aws"]["oldest_age_days"] >= by_cloud["aws"]["newest_age_days"] >= 0
    table = " ".join(run_cli("pricing", "show").stdout.split())
    assert "aws newest" in table
    assert "oldest 2026-02-24" in table


def test_show_rows_with_filters(run_cli) -> None:
    doc = run_cli(
        "pricing",
        "show",
        "gpu_instances",
        "--gpu",
        "a100-80gb",
        "--region",
        "us-central1",
        "--region",
        "europe-west4",
        "--format",
        "json",
    ).json()
    assert doc["rows"]
    assert {r["accelerator"] for r in doc["rows"]} == {"A100-80GB"}
    assert {r["ondemand_status"] for r in doc["rows"]} == {"corrected"}
    assert doc["as_of"] == "2026-08-20"  # both prices from Cyclenerd's copy of that day


def test_show_unverified_gives_reasons(run_cli) -> None:
    result = run_cli("pricing", "show", "gpu_instances", "--unverified", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert rows
    for row in rows:
        assert "unverified" in (row["ondemand_status"], row["spot_status"])
        assert row["note"]


def test_show_storage_table_view(run_cli) -> None:
    result = run_cli("pricing", "show", "storage", "--region", "eastus")
    assert result.exit_code == 0
    assert "Premium SSD P10" in result.stdout
    assert "row(s)" in result.stdout


def test_gpus_lists_names_and_lowest_price(run_cli, catalog) -> None:
    doc = run_cli("pricing", "gpus", "--format", "json").json()
    by_name = {g["gpu"]: g for g in doc["gpus"]}
    assert {"A10G", "L4", "T4", "H100", "H200", "B200", "A100-80GB"} <= set(by_name)
    a10g = by_name["A10G"]
    assert a10g["providers"] == "aws"
    per_gpu = [
        i.ondemand_usd_per_hour / i.accelerator_count
        for i in catalog.instances
        if i.accelerator == "A10G" and i.ondemand_usd_per_hour is not None
    ]
    assert Decimal(a10g["ondemand_usd_per_gpu_hour"]) == min(per_gpu).quantize(Decimal("0.000001"))
    assert "a10g" in a10g["aliases"]


def test_gpus_table_view(run_cli) -> None:
    result = run_cli("pricing", "gpus", "--provider", "azure")
    assert result.exit_code == 0
    assert "A100-80GB" in result.stdout
    assert "A10G" not in result.stdout


def test_pricing_dir_override(run_cli, tmp_path) -> None:
    directory = tmp_path / "mirror"
    shutil.copytree(REPO_PRICING, directory)
    path = directory / "gpu_instances.csv"
    path.write_text(
        path.read_text().replace(
            "aws,us-east-1,g5.xlarge,A10G,1,4,16,1.006,", "aws,us-east-1,g5.xlarge,A10G,1,4,16,2.5,"
        )
    )
    doc = run_cli(
        "--pricing-dir",
        str(directory),
        "estimate",
        "--instance-type",
        "g5.xlarge",
        "--region",
        "us-east-1",
        "--on-demand",
        "--hours",
        "2",
        "--format",
        "json",
    ).json()
    assert doc["options"][0]["compute_usd"] == "5"
    assert doc["pricing_source"]["origin"] == "directory"
    assert any(str(directory) in a for a in doc["assumptions"])


def test_broken_pricing_dir_is_a_clear_error(run_cli, tmp_path) -> None:
    """A --pricing-dir without tables is bad input, exit 2 (it was 1, a failure's code)."""
    result = run_cli("--pricing-dir", str(tmp_path), "estimate", "--gpu", "t4", "--hours", "1")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: no price tables in")
    assert "Hint:" in result.stderr
