"""`costguard pricing refresh --from DIR` with the AWS Spot Instance Advisor's file:
interruptions.csv rewritten and dated, a file of another shape refused."""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from pathlib import Path

import pytest

from costguard.pricing.tables import bundled_tables_dir
from tests.refresh.records import write_mirror

RECORDED = Path(__file__).parent / "recorded" / "aws-spot-advisor-excerpt-2025-06.json"
REGIONS = ("--region", "us-east-1", "--region", "us-central1", "--region", "eastus")


def advisor_mirror(folder: Path, fetched_at: str | None = "2026-08-10T06:54:02Z") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(RECORDED, folder / "spot-advisor-data.json")
    if fetched_at is not None:
        (folder / "fetched.json").write_text(json.dumps({"fetched_at": fetched_at}))
    return folder


def index(output: Path) -> dict:
    return tomllib.loads((output / "current" / "tables.toml").read_text(encoding="utf-8"))


def test_the_advisor_file_alone_rewrites_and_dates_the_table(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = advisor_mirror(tmp_path / "responses")
    out = tmp_path / "out"
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--output", str(out))
    assert result.exit_code == 0, result.stderr
    assert "5 rows as of 2026-08-10" in result.stdout
    entry = index(out)["interruptions"]
    assert entry["as_of"].isoformat() == "2026-08-10"
    assert "fetched.json" in entry["source"]
    assert str(mirror / "spot-advisor-data.json") in entry["source"]
    lines = (out / "current" / "interruptions.csv").read_text().splitlines()
    assert lines[1:] == [
        "aws,eu-west-1,g4dn.xlarge,5-10%,5,10,54",
        "aws,eu-west-1,g5.xlarge,10-15%,10,15,56",
        "aws,us-east-1,g4dn.xlarge,15-20%,15,20,64",
        "aws,us-east-1,g5.xlarge,>20%,20,,59",
        "aws,us-east-1,p4d.24xlarge,10-15%,10,15,67",
    ]
    # the estimate reads the refreshed table and says its date
    monkeypatch.setenv("COSTGUARD_PRICING_DIR", str(out))
    g5 = ("estimate", "--instance-type", "g5.xlarge", "--region", "us-east-1", "--hours", "10")
    doc = run_cli(*g5, "--interruptions-per-day", "advisor", "--format", "json").json()
    assert doc["interruptions"]["advisor_as_of"] == "2026-08-10"


def test_without_fetched_json_the_files_date_is_used(run_cli, tmp_path: Path) -> None:
    mirror = advisor_mirror(tmp_path / "responses", fetched_at=None)
    os.utime(mirror / "spot-advisor-data.json", (1_750_000_000, 1_750_000_000))  # 2025-06-15
    out = tmp_path / "out"
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--output", str(out))
    assert result.exit_code == 0, result.stderr
    assert index(out)["interruptions"]["as_of"].isoformat() == "2025-06-15"


def test_a_price_refresh_keeps_the_table_it_had(run_cli, tmp_path: Path) -> None:
    mirror = write_mirror(tmp_path / "responses")
    out = tmp_path / "out"
    result = run_cli("pricing", "refresh", "--from", str(mirror), *REGIONS, "--output", str(out))
    assert result.exit_code == 0, result.stderr
    assert index(out)["interruptions"]["as_of"].isoformat() == "2025-06-28"
    written = (out / "current" / "interruptions.csv").read_bytes()
    assert written == (bundled_tables_dir() / "interruptions.csv").read_bytes()


def test_prices_and_the_advisor_file_together(run_cli, tmp_path: Path) -> None:
    mirror = write_mirror(tmp_path / "responses")
    advisor_mirror(mirror, fetched_at=None)
    out = tmp_path / "out"
    result = run_cli(
        "pricing",
        "refresh",
        "--from",
        str(mirror),
        *REGIONS,
        "--output",
        str(out),
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["interruptions"]["rows"] == 5
    assert {p["provider"] for p in doc["providers"]} == {"aws", "gcp", "azure"}
    assert len((out / "current" / "interruptions.csv").read_text().splitlines()) == 6


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"ranges": [], "spot_advisor": {}}),
        json.dumps({"ranges": [{"index": 0, "label": "<5%"}], "spot_advisor": {"us-east-1": 3}}),
        json.dumps([1, 2, 3]),
    ],
)
def test_a_file_of_another_shape_is_refused_and_nothing_written(
    run_cli, tmp_path: Path, content: str
) -> None:
    mirror = tmp_path / "responses"
    mirror.mkdir()
    (mirror / "spot-advisor-data.json").write_text(content)
    out = tmp_path / "out"
    result = run_cli("pricing", "refresh", "--from", str(mirror), "--output", str(out))
    assert result.exit_code != 0
    assert result.stderr.startswith("Error: ")
    assert "spot-advisor-data.json" in result.stderr
    assert "Hint: " in result.stderr
    assert not (out / "current").exists()
