"""`costguard pricing show` and `costguard pricing gpus`."""

from __future__ import annotations

import csv
import io
import shutil
from decimal import Decimal
from pathlib import Path

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
