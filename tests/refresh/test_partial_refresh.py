"""Partial refreshes: a provider failing in any way, regions with no prices, two refreshes
at once, and how old the prices an estimate shows are after a partial refresh."""

from __future__ import annotations

import csv
import io
import json
import threading
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
from google.auth import credentials as google_credentials
from google.auth.exceptions import RefreshError

from costguard.pricing.refresh.runner import current_tables, plan_refresh, refresh_tables
from costguard.pricing.tables import load_catalog, load_tables
from costguard.settings import Settings
from tests.refresh.records import G5_XLARGE_USD, NC4AS_T4_USD, write_mirror

REGIONS = ("--region", "us-east-1", "--region", "us-central1", "--region", "eastus")
BUNDLED_AS_OF = date(2026, 11, 30)


class RevokedCredentials(google_credentials.Credentials):
    """Google credentials whose token cannot be refreshed (a revoked login, say)."""

    def refresh(self, request: Any) -> None:
        raise RefreshError("the refresh token was revoked")


def statuses(report: dict) -> dict[str, str]:
    return {p["provider"]: p["status"] for p in report["providers"]}


def test_gcp_credentials_failing_fails_only_gcp(
    run_cli,
    refresh_env: dict[str, Any],
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("costguard.clouds.gcp.default_credentials", RevokedCredentials)
    result = run_cli("pricing", "refresh", *REGIONS, "--format", "json")
    assert result.exit_code == 1, result.stderr
    assert statuses(result.json()) == {"aws": "refreshed", "gcp": "failed", "azure": "refreshed"}
    assert "Error: gcp: Google Cloud credentials failed" in result.stderr
    assert "revoked" in result.stderr
    assert "gcloud auth application-default login" in result.stderr
    assert not refresh_env["gcp"].requests  # refused before anything was sent
    gpu = load_catalog(cache_dir / "current").tables["gpu_instances"]
    assert gpu.part("aws", "us-east-1").source.startswith("AWS Price List Query API")
    assert gpu.part("azure", "eastus").source.startswith("Azure Retail Prices API")
    assert gpu.part("gcp", "us-central1").as_of == BUNDLED_AS_OF  # kept as it was


def test_an_unexpected_error_fails_only_its_provider(
    run_cli, tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("armRegionName")

    monkeypatch.setattr("costguard.pricing.refresh.azure.fetch", broken)
    mirror = write_mirror(tmp_path / "responses")
    result = run_cli("pricing", "refresh", "--from", str(mirror), *REGIONS, "--format", "json")
    assert result.exit_code == 1
    assert statuses(result.json()) == {"aws": "refreshed", "gcp": "refreshed", "azure": "failed"}
    assert (
        "Error: azure: unexpected KeyError while reading azure prices: 'armRegionName'"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
    gpu = load_catalog(cache_dir / "current").tables["gpu_instances"]
    assert gpu.part("azure", "eastus").as_of == BUNDLED_AS_OF


def test_a_mirror_of_some_regions_refreshes_only_those(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = write_mirror(tmp_path / "responses")  # AWS: us-east-1 and us-west-2 only
    result = run_cli(
        "pricing", "refresh", "--from", str(mirror), "--provider", "aws", "--format", "json"
    )
    assert result.exit_code == 0, result.stderr
    assert result.json()["providers"][0]["regions"] == ["us-east-1", "us-west-2"]
    bundled = load_catalog()
    cached = load_catalog(cache_dir / "current")
    today = datetime.now(UTC).date()
    gpu, old = cached.tables["gpu_instances"], bundled.tables["gpu_instances"]
    east = gpu.part("aws", "us-east-1")  # on-demand read for every type, spot for g5's
    assert east.source.startswith("on-demand, spot of g5 from AWS Price List")
    assert east.as_of == min(today, BUNDLED_AS_OF)  # the other spot rows are as old as before
    for region in ("eu-west-1", "ap-northeast-1"):  # not in the mirror: not stamped fresh
        assert gpu.part("aws", region).as_of == BUNDLED_AS_OF
        assert gpu.part("aws", region).source.startswith(old.part("aws", region).source)
        rows = sorted((r for r in cached.instances if r.region == region), key=repr)
        assert rows == sorted((r for r in bundled.instances if r.region == region), key=repr)


def test_regions_named_that_come_back_empty_are_kept_and_reported(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = write_mirror(tmp_path / "responses")
    some = run_cli(
        "pricing",
        "refresh",
        "--from",
        str(mirror),
        "--region",
        "us-east-1",
        "--region",
        "eu-west-1",
        "--format",
        "json",
    )
    assert some.exit_code == 0, some.stderr
    (aws,) = some.json()["providers"]
    assert (aws["regions"], aws["regions_without_prices"]) == (["us-east-1"], ["eu-west-1"])
    assert "Warning: aws: no prices came back for eu-west-1" in some.stderr
    gpu = load_catalog(cache_dir / "current").tables["gpu_instances"]
    assert gpu.part("aws", "eu-west-1").as_of == BUNDLED_AS_OF
    none = run_cli("pricing", "refresh", "--from", str(mirror), "--region", "eu-west-1")
    assert none.exit_code == 1
    assert "Error: aws: no prices came back for any region asked for (eu-west-1)" in none.stderr


def test_two_refreshes_at_once_both_count(tmp_path: Path) -> None:
    mirror = write_mirror(tmp_path / "responses")
    output = tmp_path / "pricing"
    start = current_tables(output)  # both start from the same tables
    plans = [
        plan_refresh(start, [provider], [region], output=output, mirror_dir=mirror)
        for provider, region in (("aws", "us-east-1"), ("azure", "eastus"))
    ]
    errors: list[BaseException] = []

    def run(plan: Any) -> None:
        try:
            assert refresh_tables(plan, start, Settings()).written
        except BaseException as exc:  # every failure counts
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(plan,)) for plan in plans]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    final = load_tables(cache_dir=output)
    gpu = final.tables["gpu_instances"]
    assert "from AWS Price List" in gpu.part("aws", "us-east-1").source  # neither lost
    assert gpu.part("azure", "eastus").source.startswith("Azure Retail Prices API")
    price = {(r.region, r.instance_type): r.ondemand_usd_per_hour for r in final.instances}
    assert price[("us-east-1", "g5.xlarge")] == G5_XLARGE_USD
    assert price[("eastus", "Standard_NC4as_T4_v3")] == NC4AS_T4_USD


def test_estimate_dates_prices_by_the_parts_it_used(
    run_cli, tmp_path: Path, cache_dir: Path
) -> None:
    mirror = write_mirror(tmp_path / "responses")
    # Spot history of every other family in us-east-1 too: the mirror read the region whole.
    records = [{"AvailabilityZone": "us-east-1a", "InstanceType": r.instance_type,
                "ProductDescription": "Linux/UNIX", "SpotPrice": str(r.spot_usd_per_hour),
                "Timestamp": "2026-11-30T12:00:00+00:00"}
               for r in load_catalog().instances
               if (r.provider, r.region) == ("aws", "us-east-1") and r.spot_usd_per_hour
               and not r.instance_type.startswith("g5.")]  # fmt: skip
    (mirror / "aws" / "spot-002.json").write_text(json.dumps({"SpotPriceHistory": records}))
    refresh = ("pricing", "refresh", "--from", str(mirror), "--region", "us-east-1")
    assert run_cli(*refresh).exit_code == 0
    today = datetime.now(UTC).date().isoformat()
    query = ("estimate", "--instance-type", "g5.xlarge", "--hours", "1", "--disk-gb", "0")
    east = ("--region", "us-east-1")
    both = (*east, "--region", "us-west-2")

    fresh = run_cli(*query, *east, "--format", "json").json()
    assert fresh["pricing_source"]["origin"] == "cache"
    assert fresh["pricing_as_of"] == today  # not the oldest region in the tables
    assert {o["pricing_as_of"] for o in fresh["options"]} == {today}

    # us-west-2 was not refreshed: its rows keep their own dates (on-demand of vantage's
    # 2026-08-26 data, spot of no known date), the oldest price shown.
    west = {("us-west-2", "on-demand", "2026-08-26"), ("us-west-2", "spot", "unknown")}
    east_dates = {("us-east-1", "on-demand", today), ("us-east-1", "spot", today)}
    mixed = run_cli(*query, *both, "--format", "json").json()
    assert mixed["pricing_as_of"] == "unknown"
    assert {(o["region"], o["market"], o["pricing_as_of"]) for o in mixed["options"]} == {
        *east_dates,
        *west,
    }

    rows = list(csv.DictReader(io.StringIO(run_cli(*query, *both, "--format", "csv").stdout)))
    assert {(r["region"], r["market"], r["pricing_as_of"]) for r in rows} == {*east_dates, *west}
    assert f"cache prices as of {today}" in run_cli(*query, *east).stdout


def test_pricing_dir_can_be_a_folder_refresh_wrote(run_cli, tmp_path: Path) -> None:
    mirror = write_mirror(tmp_path / "responses")
    shared = tmp_path / "lab-pricing"
    refresh = ("pricing", "refresh", "--from", str(mirror), "--region", "us-east-1")
    assert run_cli(*refresh, "--output", str(shared)).exit_code == 0
    doc = run_cli(
        "--pricing-dir",
        str(shared),
        "estimate",
        "--instance-type",
        "g5.xlarge",
        "--region",
        "us-east-1",
        "--hours",
        "1",
        "--on-demand",
        "--format",
        "json",
    ).json()
    assert doc["pricing_source"]["origin"] == "directory"
    assert doc["options"][0]["usd_per_hour"] == str(G5_XLARGE_USD)
