"""`costguard pricing refresh` end to end, and how `estimate` then uses what it wrote.

Every API is on loopback: the AWS Price List server and EC2 (moto), the GCP catalog
and Azure Retail Prices servers (see conftest.py).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tomllib
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costguard.pricing.catalog import Catalog
from costguard.pricing.refresh import cache
from costguard.pricing.tables import bundled_tables_dir, load_catalog
from tests.refresh.records import (
    G2_STANDARD_4_SPOT_USD,
    G2_STANDARD_4_USD,
    G5_XLARGE_USD,
    MOTO_SPOT_USD,
    NC4AS_T4_SPOT_USD,
    NC4AS_T4_USD,
    write_mirror,
)
from tests.refresh.servers import Reply, gcp_error

REGIONS = ("--region", "us-east-1", "--region", "us-central1", "--region", "eastus")
#: One hour of an A10G in us-east-1: the question the staleness tests ask.
A10G_HOUR = ("estimate", "--gpu", "a10g", "--hours", "1", "--region", "us-east-1")


def estimate(run_cli, instance_type: str, region: str, *extra: str) -> dict:
    result = run_cli(
        "estimate",
        "--instance-type",
        instance_type,
        "--region",
        region,
        "--hours",
        "8",
        "--count",
        "4",
        "--disk-gb",
        "0",
        "--format",
        "json",
        *extra,
    )
    assert result.exit_code == 0, result.stderr
    return result.json()


def gcp_rows(catalog: Catalog) -> list[tuple[object, ...]]:
    return sorted(
        (r.region, r.instance_type, r.accelerator or "", r.ondemand_usd_per_hour)
        for r in catalog.instances
        if r.provider == "gcp"
    )


def by_market(document: dict) -> dict[str, Decimal]:
    return {o["market"]: Decimal(o["compute_usd"]) for o in document["options"]}


def test_round_trip_refresh_then_estimate_uses_the_new_prices(
    run_cli, refresh_env: dict[str, Any], cache_dir: Path
) -> None:
    result = run_cli("pricing", "refresh", *REGIONS, "--format", "json")
    assert result.exit_code == 0, result.stderr
    report = result.json()
    assert report["written"] is True
    assert report["output"] == str(cache_dir)
    assert {p["provider"]: p["status"] for p in report["providers"]} == {
        "aws": "refreshed",
        "gcp": "refreshed",
        "azure": "refreshed",
    }
    assert all(p["records"] > 0 and p["rows_updated"] > 0 for p in report["providers"])
    assert (cache_dir / "current" / "tables.toml").is_file()

    hours_x_count = Decimal(8 * 4)
    aws = estimate(run_cli, "g5.xlarge", "us-east-1")
    assert by_market(aws) == {
        "on-demand": G5_XLARGE_USD * hours_x_count,
        "spot": MOTO_SPOT_USD * hours_x_count,
    }
    assert aws["pricing_source"]["origin"] == "cache"
    assert aws["pricing_source"]["directory"] == str((cache_dir / "current").resolve())
    gcp = estimate(run_cli, "g2-standard-4", "us-central1")
    assert by_market(gcp) == {
        "on-demand": G2_STANDARD_4_USD * hours_x_count,
        "spot": G2_STANDARD_4_SPOT_USD * hours_x_count,
    }
    azure = estimate(run_cli, "Standard_NC4as_T4_v3", "eastus")
    assert by_market(azure) == {
        "on-demand": NC4AS_T4_USD * hours_x_count,
        "spot": NC4AS_T4_SPOT_USD * hours_x_count,
    }
    # Regions not refreshed keep their rows and their date.
    other = estimate(run_cli, "g5.xlarge", "us-west-2", "--on-demand")
    assert other["options"][0]["usd_per_hour"] == "1.006"
    table = run_cli(
        "estimate", "--instance-type", "g5.xlarge", "--region", "us-east-1", "--hours", "1"
    )
    assert "cache prices as of" in table.stdout


def test_cache_metadata_says_what_was_refreshed_and_what_was_kept(
    run_cli, refresh_env: dict[str, Any], cache_dir: Path
) -> None:
    assert run_cli("pricing", "refresh", "--region", "us-east-1").exit_code == 0
    current = cache_dir / "current"
    index = tomllib.loads((current / "tables.toml").read_text())
    gpu = index["gpu_instances"]
    assert gpu["refreshed_at"].tzinfo is not None
    fresh = gpu["parts"]["aws"]["us-east-1"]
    assert fresh["as_of"] >= date(2026, 12, 1)
    assert "AWS Price List Query API GetProducts (http://127.0.0.1:" in fresh["source"]
    assert "EC2 DescribeSpotPriceHistory" in fresh["source"]
    kept = gpu["parts"]["gcp"]["us-central1"]
    assert kept["as_of"] == date(2026, 11, 30)
    assert "kept from the bundled tables" in kept["source"]
    assert "refresh updates instance prices only" in index["storage"]["source"]
    # The same columns as the bundled tables, so load_catalog reads the cache as is.
    for name in ("gpu_instances", "cpu_instances", "storage", "transfer", "regions"):
        header = (current / f"{name}.csv").read_text().splitlines()[0]
        assert header == (bundled_tables_dir() / f"{name}.csv").read_text().splitlines()[0]
    assert (current / "storage.csv").read_bytes() == (
        bundled_tables_dir() / "storage.csv"
    ).read_bytes()
    cached = load_catalog(current)
    assert len(cached.instances) == len(load_catalog().instances)
    summary = run_cli("pricing", "show", "--format", "json").json()
    assert summary["origin"] == "cache"
    assert all(t["refreshed_at"] for t in summary["tables"] if t["table"].endswith("instances"))


def test_one_provider_failing_keeps_its_rows_and_exits_1(
    run_cli, refresh_env: dict[str, Any], cache_dir: Path
) -> None:
    assert run_cli("pricing", "refresh", *REGIONS).exit_code == 0
    before = load_catalog(cache_dir / "current")
    refresh_env["gcp"].always = gcp_error("INTERNAL")
    refresh_env["azure"].always = Reply(
        503, {"Error": "down for maintenance"}, {"Retry-After": "0"}
    )
    result = run_cli("pricing", "refresh", *REGIONS)
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 2
    assert errors[0].startswith("Error: gcp: ")
    assert "500" in errors[0]
    assert errors[1].startswith("Error: azure: ")
    assert "HTTP 503" in errors[1]
    assert "Hint: " in result.stderr
    assert "refreshed" in result.stdout
    assert "FAILED" in result.stdout
    after = load_catalog(cache_dir / "current")

    assert gcp_rows(after) == gcp_rows(before)  # the failed provider's cached rows stay
    assert after.tables["gpu_instances"].part("gcp", "us-central1") == before.tables[
        "gpu_instances"
    ].part("gcp", "us-central1")
    assert (
        after.tables["gpu_instances"]
        .part("aws", "us-east-1")
        .source.startswith("AWS Price List Query API")
    )


def test_every_provider_failing_writes_nothing(
    run_cli, refresh_env: dict[str, Any], cache_dir: Path
) -> None:
    refresh_env["gcp"].always = gcp_error("INTERNAL")
    refresh_env["azure"].always = Reply(500, {"Error": "no"}, {"Retry-After": "0"})
    result = run_cli("pricing", "refresh", "--region", "us-central1", "--region", "eastus")
    assert result.exit_code == 1
    assert "Nothing written" in result.stdout
    assert not cache_dir.exists()


def test_from_mirror_needs_no_network(
    run_cli, tmp_path: Path, cache_dir: Path, monkeypatch
) -> None:
    from tests.helpers.processes import free_port

    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens: any call would fail
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_PRICING", "COSTGUARD_GCP_ENDPOINT"):
        monkeypatch.setenv(name, nowhere)
    monkeypatch.setenv("COSTGUARD_AZURE_PRICES_ENDPOINT", nowhere)
    mirror = write_mirror(tmp_path / "responses")
    result = run_cli("pricing", "refresh", "--from", str(mirror), *REGIONS, "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert all(str(mirror) in p["source"] for p in result.json()["providers"])
    hours_x_count = Decimal(32)
    assert by_market(estimate(run_cli, "g5.xlarge", "us-east-1")) == {
        "on-demand": G5_XLARGE_USD * hours_x_count,
        "spot": Decimal("0.4321") * hours_x_count,  # lowest zone; the Local Zone is ignored
    }
    assert by_market(estimate(run_cli, "g2-standard-4", "us-central1"))["on-demand"] == (
        G2_STANDARD_4_USD * hours_x_count
    )
    assert by_market(estimate(run_cli, "Standard_NC4as_T4_v3", "eastus"))["spot"] == (
        NC4AS_T4_SPOT_USD * hours_x_count
    )


def test_from_mirror_defaults_to_the_providers_it_has(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = write_mirror(tmp_path / "responses")
    shutil.rmtree(mirror / "gcp")
    shutil.rmtree(mirror / "aws")
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert [p["provider"] for p in result.json()["providers"]] == ["azure"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--provider", "oracle"), "unknown provider"),
        (("--region", "mars-1"), "unknown region"),
        (("--provider", "gcp", "--region", "us-east-1"), "is an aws region"),
        (("--from", "/nonexistent/responses"), "is not a folder"),
        (("--format", "xml"), "--format"),
    ],
)
def test_bad_input_exits_2_before_any_network_call(
    run_cli, refresh_env: dict[str, Any], args: tuple[str, ...], needle: str
) -> None:
    result = run_cli("pricing", "refresh", *args)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("Error: ")
    assert needle in result.stderr
    assert "Hint: " in result.stderr
    assert all(not server.requests for server in refresh_env.values())


def test_mirror_without_a_provider_folder_is_bad_input(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = write_mirror(tmp_path / "responses")
    shutil.rmtree(mirror / "gcp")
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--provider", "gcp")
    assert result.exit_code == 2
    assert "no gcp responses" in result.stderr


def test_refuses_to_replace_a_folder_of_other_files(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("precious")
    mirror = write_mirror(tmp_path / "responses")
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--output", str(mine))
    assert result.exit_code == 2
    assert "did not write" in result.stderr
    assert (mine / "chapter1.tex").read_text() == "precious"


def test_a_half_written_cache_is_never_read(
    run_cli, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = write_mirror(tmp_path / "responses")
    assert (
        run_cli("pricing", "refresh", "--from", str(mirror), "--region", "us-east-1").exit_code == 0
    )
    good = (cache_dir / "current" / "gpu_instances.csv").read_bytes()

    # A crash after the new version is written and before `current` is switched to it.
    switch = cache._switch_current

    def crash(target: Path, version: Path) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "_switch_current", crash)
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--region", "eastus")
    assert result.exit_code == 130
    assert (cache_dir / "current" / "gpu_instances.csv").read_bytes() == good
    # A crashed run's staging folder, half written, in the cache: never read.
    staging = cache_dir / "versions" / ".tmp-crashed"
    staging.mkdir()
    (staging / "tables.toml").write_text("[gpu_instances]\nfile = 'gpu_instances.csv'\n")
    (staging / "gpu_instances.csv").write_text("provider,region\naws,us-")
    doc = estimate(run_cli, "g5.xlarge", "us-east-1")
    assert doc["pricing_source"]["origin"] == "cache"
    assert by_market(doc)["on-demand"] == G5_XLARGE_USD * 32
    monkeypatch.setattr(cache, "_switch_current", switch)
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--region", "eastus")
    assert result.exit_code == 0, result.stderr
    assert not staging.exists()  # the next refresh clears it


def test_crash_of_an_earlier_release_between_its_renames_is_repaired(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = write_mirror(tmp_path / "responses")
    assert (
        run_cli("pricing", "refresh", "--from", str(mirror), "--region", "us-east-1").exit_code == 0
    )
    # An earlier release kept the tables in the folder itself and swapped folders by
    # renaming: it moved the old tables aside, then died. No cache at all.
    aside = cache_dir.with_name(f".{cache_dir.name}.old-deadbeef")
    shutil.copytree(cache_dir / "current", aside)
    shutil.rmtree(cache_dir)
    assert estimate(run_cli, "g5.xlarge", "us-east-1")["pricing_source"]["origin"] == "bundled"
    assert run_cli("pricing", "refresh", "--from", str(mirror), "--region", "eastus").exit_code == 0
    assert not aside.exists()
    doc = estimate(run_cli, "g5.xlarge", "us-east-1")  # the earlier AWS refresh survived
    assert by_market(doc)["on-demand"] == G5_XLARGE_USD * 32
    # The earlier layout's files stay for one refresh (a reader may be on them), then go.
    assert (cache_dir / "tables.toml").is_file()
    assert run_cli("pricing", "refresh", "--from", str(mirror), "--region", "eastus").exit_code == 0
    assert sorted(p.name for p in cache_dir.iterdir()) == [".lock", "current", "versions"]
    assert by_market(estimate(run_cli, "g5.xlarge", "us-east-1"))["on-demand"] == (
        G5_XLARGE_USD * 32
    )


def _date_rows(folder: Path, region: str, as_of: str, spot_as_of: str = "") -> None:
    """Give every GPU row of ``region`` in the tables in ``folder`` these price dates."""
    path = folder / "gpu_instances.csv"
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    for row in rows:
        if row["region"] == region:
            row.update(as_of=as_of, spot_as_of=spot_as_of)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def test_stale_prices_warn_once_and_the_warning_can_be_turned_off(
    run_cli, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # us-east-1's rows dated in the future, then long ago (each row carries its date).
    shutil.copytree(bundled_tables_dir(), cache_dir)
    index = cache_dir / "tables.toml"
    index.write_text(index.read_text().replace('as_of = "2026-11-30"', 'as_of = "2099-01-01"'))
    _date_rows(cache_dir, "us-east-1", "2099-01-01")
    fresh = run_cli(*A10G_HOUR)
    assert "Warning" not in fresh.stderr
    index.write_text(index.read_text().replace('as_of = "2099-01-01"', 'as_of = "2020-01-01"'))
    _date_rows(cache_dir, "us-east-1", "2020-01-01")
    # Older than the bundled tables now: the bundled ones are used.
    assert run_cli(*A10G_HOUR, "--format", "json").json()["pricing_source"]["origin"] == "bundled"
    stale_dir = tmp_path / "old-tables"
    shutil.copytree(cache_dir, stale_dir)
    result = run_cli("--pricing-dir", str(stale_dir), *A10G_HOUR)
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning: ")]
    assert len(warnings) == 1
    assert "prices shown are old: from 2020-01-01" in warnings[0]
    assert "costguard pricing refresh" in warnings[0]
    doc = run_cli("--pricing-dir", str(stale_dir), *A10G_HOUR, "--format", "json").json()
    shown = len(doc["options"])
    assert f"{shown} of {shown} prices shown are old" in doc["pricing_source"]["stale_warning"]
    assert "2020-01-01" in doc["pricing_source"]["stale_warning"]
    quiet = run_cli("--pricing-dir", str(stale_dir), *A10G_HOUR, "--no-stale-warning")
    assert quiet.exit_code == 0
    assert "Warning" not in quiet.stderr
    monkeypatch.setenv("COSTGUARD_STALE_WARNING", "0")
    assert "Warning" not in run_cli("--pricing-dir", str(stale_dir), *A10G_HOUR).stderr


def test_spot_only_staleness_says_spot(run_cli, tmp_path: Path, cache_dir: Path) -> None:
    from datetime import UTC, datetime, timedelta

    today = datetime.now(UTC).date()
    ten_days_ago = (today - timedelta(days=10)).isoformat()
    stale_dir = tmp_path / "tables"
    shutil.copytree(bundled_tables_dir(), stale_dir)
    _date_rows(stale_dir, "us-east-1", today.isoformat(), ten_days_ago)
    on_demand = run_cli("--pricing-dir", str(stale_dir), *A10G_HOUR, "--on-demand")
    assert "Warning" not in on_demand.stderr
    spot = run_cli("--pricing-dir", str(stale_dir), *A10G_HOUR, "--spot")
    assert f"spot prices shown are old: from {ten_days_ago} (10 days)" in spot.stderr


def test_unreadable_cache_is_an_error_with_a_way_out(run_cli, cache_dir: Path) -> None:
    cache_dir.mkdir(parents=True)
    (cache_dir / "tables.toml").write_text("this is [not toml")
    result = run_cli("estimate", "--gpu", "a10g", "--hours", "1")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: the price cache {cache_dir} cannot be used")
    assert "delete" in result.stderr


def test_help_documents_the_mirror_layout(run_cli) -> None:
    result = run_cli("pricing", "refresh", "--help")
    assert result.exit_code == 0
    for needle in ("DIR/aws/pricing-*.json", "DIR/gcp/skus-*.json", "DIR/azure/prices-*.json"):
        assert needle in result.stdout
    assert "costguard pricing refresh --provider aws" in result.stdout


def test_json_report_of_a_mirror_refresh(run_cli, tmp_path: Path, cache_dir: Path) -> None:
    mirror = write_mirror(tmp_path / "responses")
    result = run_cli(
        "pricing", "refresh", "--from", str(mirror), "--provider", "aws", "--format", "json"
    )
    report = result.json()
    (aws,) = report["providers"]
    # The mirror holds prices for two regions: only those are refreshed.
    assert aws["regions"] == ["us-east-1", "us-west-2"]
    assert aws["regions_without_prices"] == []  # regions not named: no warning
    assert "Warning" not in result.stderr
    # Rows of those regions the mirror does not list are flagged, not dropped.
    assert aws["rows_updated"] == 6  # g5.xlarge, g4dn.xlarge, p4d, m5.large, c5.large east; g5 west
    assert aws["rows_not_found"] > 0
    assert {t["table"] for t in report["tables"]} == {
        "gpu_instances",
        "cpu_instances",
        "storage",
        "transfer",
        "regions",
    }
    flagged = run_cli(
        "pricing",
        "show",
        "gpu_instances",
        "--provider",
        "aws",
        "--region",
        "us-east-1",
        "--unverified",
        "--format",
        "json",
    ).json()
    assert flagged["rows"]
    # Flagged by this refresh, or unverified before it (a spot price the mirror's g5 spot
    # history says nothing about keeps its own note).
    before = {r.instance_type for r in load_catalog().instances
              if (r.provider, r.region) == ("aws", "us-east-1") and r.note}  # fmt: skip
    assert all(
        "not listed by the API" in row["note"] or row["instance_type"] in before
        for row in flagged["rows"]
    )
    assert any("not listed by the API" in row["note"] for row in flagged["rows"])
    assert json.dumps(report)  # plain JSON


def test_progress_bar_on_a_terminal(
    run_cli, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("costguard.cli.render.is_terminal", lambda stream=None: True)
    mirror = write_mirror(tmp_path / "responses")
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--region", "eastus")
    assert result.exit_code == 0, result.stderr
    assert "refreshed" in result.stdout


def test_a_mirror_refresh_needs_no_cloud_sdk(tmp_path: Path) -> None:
    mirror = write_mirror(tmp_path / "responses")
    probe = (
        "import json, sys\n"
        "from costguard.cli import cli\n"
        "code = cli.main(['pricing', 'refresh', '--from', sys.argv[1], '--format', 'json'],"
        " standalone_mode=False)\n"
        "assert code in (0, None), code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore',"
        " 'google', 'azure'))\n"
        "print(json.dumps(heavy))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSTGUARD_")}
    env.update(COSTGUARD_CACHE_DIR=str(tmp_path / "cache"), XDG_CONFIG_HOME=str(tmp_path / "none"))
    done = subprocess.run(
        [sys.executable, "-c", probe, str(mirror)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_a_live_refresh_process_exits_cleanly(
    tmp_path: Path, gcp_catalog: Any, azure_prices: Any
) -> None:
    """The console script's process, gRPC channel and all: its output whole, its exit
    quiet (the heap is frozen on the way out, see ``_skip_the_last_collections``)."""
    child = (
        "import sys\n"
        "from google.auth.credentials import AnonymousCredentials\n"
        "import costguard.clouds.gcp\n"
        "costguard.clouds.gcp.default_credentials = AnonymousCredentials\n"
        "from costguard.cli import main\n"
        "sys.argv[0] = 'costguard'\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSTGUARD_")}
    env.update(
        COSTGUARD_CACHE_DIR=str(tmp_path / "cache"),
        COSTGUARD_GCP_ENDPOINT=gcp_catalog.url,
        COSTGUARD_AZURE_PRICES_ENDPOINT=azure_prices.url,
        XDG_CONFIG_HOME=str(tmp_path / "none"),
    )
    command = [sys.executable, "-c", child, "pricing", "refresh", "--format", "json"]
    done = subprocess.run(
        [*command, "--region", "us-central1", "--region", "eastus"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {p["provider"]: p["status"] for p in report["providers"]} == {
        "gcp": "refreshed",
        "azure": "refreshed",
    }
    assert "Traceback" not in done.stderr
    assert "Exception ignored" not in done.stderr
    assert gcp_catalog.requests
    assert azure_prices.requests
    assert (tmp_path / "cache" / "current").exists()


def test_a_broken_mirror_file_fails_only_its_provider(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = write_mirror(tmp_path / "responses")
    (mirror / "gcp" / "skus-002.json").write_text('{"skus": [')
    (mirror / "azure" / "prices-001.json").write_text('{"Items": "not a list"}')
    result = run_cli("pricing", "refresh", "--from", str(mirror), *REGIONS, "--format", "json")
    assert result.exit_code == 1
    status = {p["provider"]: p["status"] for p in result.json()["providers"]}
    assert status == {"aws": "refreshed", "gcp": "failed", "azure": "failed"}
    assert f"Error: gcp: cannot read {mirror / 'gcp' / 'skus-002.json'}" in result.stderr
    assert "Error: azure: a response's 'Items' is not a list" in result.stderr
    doc = estimate(run_cli, "g5.xlarge", "us-east-1", "--on-demand")
    assert by_market(doc) == {"on-demand": G5_XLARGE_USD * 32}
