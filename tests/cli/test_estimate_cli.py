"""`costguard estimate` as users and scripts call it."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

ARGS = ("estimate", "--gpu", "a10g", "--hours", "8", "--count", "4")


def test_table_shows_both_markets_and_assumptions(run_cli) -> None:
    result = run_cli(*ARGS)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "On-demand" in out
    assert "Spot" in out
    assert "g5.xlarge" in out
    assert "$32.19" in out  # us-east-1 on-demand compute
    assert "as of 2026-11-30" in out
    assert "Not included: taxes" in out
    assert "total = compute + storage + egress" in out
    assert "100 GB per instance" in out  # the default disk is shown


def test_json_document_shape_and_issue_example(run_cli) -> None:
    result = run_cli(*ARGS, "--format", "json", "--top", "0")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert set(doc) >= {"query", "pricing_as_of", "options", "assumptions"}
    assert doc["pricing_as_of"] == "2026-11-30"
    assert doc["query"]["hours"] == "8"
    assert doc["query"]["count"] == 4
    options = doc["options"]
    totals = [Decimal(o["total_usd"]) for o in options]
    assert totals == sorted(totals)
    required = {
        "provider",
        "region",
        "instance_type",
        "accelerator",
        "gpus_per_instance",
        "market",
        "usd_per_hour",
        "compute_usd",
        "storage_usd",
        "egress_usd",
        "total_usd",
    }
    for option in options:
        assert required <= set(option)
        assert option["market"] in ("on-demand", "spot")
        for key in ("usd_per_hour", "compute_usd", "storage_usd", "egress_usd", "total_usd"):
            assert isinstance(option[key], str)
            Decimal(option[key])
    (example,) = [o for o in options if (o["region"], o["market"]) == ("us-east-1", "on-demand")]
    assert example["instance_type"] == "g5.xlarge"
    assert example["compute_usd"] == "32.192"
    assert Decimal(example["total_usd"]) == (
        Decimal(example["compute_usd"])
        + Decimal(example["storage_usd"])
        + Decimal(example["egress_usd"])
    )


def test_csv_output_is_clean_with_assumptions_on_stderr(run_cli) -> None:
    result = run_cli(*ARGS, "--format", "csv", "--on-demand")
    assert result.exit_code == 0
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert rows
    assert {r["market"] for r in rows} == {"on-demand"}
    assert all(r["pricing_as_of"] == "2026-11-30" for r in rows)
    assert "Not included" in result.stderr


def test_spot_only(run_cli) -> None:
    doc = run_cli(*ARGS, "--spot", "--format", "json").json()
    assert {o["market"] for o in doc["options"]} == {"spot"}
    assert doc["query"]["markets"] == ["spot"]


def test_filters_and_top(run_cli) -> None:
    doc = run_cli(
        "estimate",
        "--gpu",
        "t4",
        "--hours",
        "2",
        "--provider",
        "gcp",
        "--top",
        "2",
        "--format",
        "json",
    ).json()
    assert {o["provider"] for o in doc["options"]} == {"gcp"}
    assert len({o["region"] for o in doc["options"]}) == 2
    assert doc["options_total"] > len(doc["options"])
    doc = run_cli(
        "estimate",
        "--gpu",
        "t4",
        "--hours",
        "2",
        "--region",
        "eastus",
        "--region",
        "us-east-1",
        "--format",
        "json",
        "--top",
        "0",
    ).json()
    assert {o["region"] for o in doc["options"]} == {"eastus", "us-east-1"}


def test_instance_type_and_gpus_per_instance(run_cli) -> None:
    doc = run_cli(
        "estimate", "--instance-type", "p5.48xlarge", "--hours", "1", "--format", "json"
    ).json()
    assert {o["instance_type"] for o in doc["options"]} == {"p5.48xlarge"}
    doc = run_cli(
        "estimate",
        "--gpu",
        "h100",
        "--gpus-per-instance",
        "8",
        "--hours",
        "1",
        "--format",
        "json",
        "--top",
        "0",
    ).json()
    assert {o["gpus_per_instance"] for o in doc["options"]} == {8}


def test_unverified_prices_are_flagged(run_cli) -> None:
    result = run_cli(
        "estimate", "--gpu", "h200", "--gpus-per-instance", "8", "--hours", "1", "--provider", "gcp"
    )
    assert result.exit_code == 0
    assert "*" in result.stdout
    assert "unverified price" in result.stdout
    doc = run_cli(
        "estimate",
        "--gpu",
        "h200",
        "--gpus-per-instance",
        "8",
        "--hours",
        "1",
        "--provider",
        "gcp",
        "--format",
        "json",
    ).json()
    assert all(o["price_status"] == "unverified" for o in doc["options"])


def test_data_region_in_output(run_cli) -> None:
    doc = run_cli(
        "estimate",
        "--gpu",
        "a10g",
        "--hours",
        "8",
        "--data-region",
        "us-west-2",
        "--data-gb",
        "500",
        "--format",
        "json",
        "--top",
        "0",
    ).json()
    assert doc["near_data"]["region"] == "us-west-2"
    assert doc["near_data"]["data_transfer_usd"] == "0"
    remote = [o for o in doc["options"] if o["region"] == "us-east-1"]
    assert all(o["data_transfer_usd"] == "10" for o in remote)  # 500 GB x $0.02


def test_budget_exceeded_exits_1_after_printing(run_cli) -> None:
    result = run_cli(*ARGS, "--budget", "5")
    assert result.exit_code == 1
    assert "g5" in result.stdout  # the table is still printed
    assert "over the budget of $5.00" in result.stderr
    assert "Hint:" in result.stderr


def test_budget_met_exits_0(run_cli) -> None:
    result = run_cli(*ARGS, "--budget", "1000", "--format", "json")
    assert result.exit_code == 0
    assert result.json()["within_budget"] is True


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (("--gpu", "a10q", "--hours", "8"), "did you mean"),
        (("--gpu", "a10g", "--hours", "0"), "--hours"),
        (("--gpu", "a10g", "--hours", "-3"), "--hours"),
        (("--gpu", "a10g", "--hours", "nan"), "--hours"),
        (("--gpu", "a10g", "--hours", "inf"), "--hours"),
        (("--gpu", "a10g", "--hours", "eight"), "--hours"),
        (("--gpu", "a10g", "--hours", "8", "--count", "0"), "--count"),
        (("--gpu", "a10g", "--hours", "8", "--count", "2.5"), "--count"),
        (("--gpu", "a10g", "--hours", "8", "--count", "-1"), "--count"),
        (("--gpu", "a10g", "--hours", "8", "--provider", "oracle"), "provider"),
        (("--gpu", "a10g", "--hours", "8", "--region", "us-east-9"), "region"),
        (("--gpu", "a10g", "--hours", "8", "--region", "us-central1"), "not offered"),
        (("--gpu", "a10g", "--hours", "8", "--disk-gb", "-1"), "--disk-gb"),
        (("--gpu", "a10g", "--hours", "8", "--data-gb", "10"), "--data-region"),
        (("--gpu", "a10g", "--hours", "8", "--data-region", "mars-1"), "region"),
        (("--gpu", "a10g", "--hours", "8", "--budget", "0"), "--budget"),
        (("--gpu", "a10g", "--hours", "8", "--format", "xml"), "--format"),
        (("--hours", "8"), "GPU or an instance type"),
        (("--gpu", "a10g"), "--hours"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_a_hint(run_cli, extra, needle) -> None:
    result = run_cli("estimate", *extra)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Error: ")
    assert needle in result.stderr
    assert len(lines) == 2
    assert lines[1].startswith("Hint: ")
    assert "Traceback" not in result.stderr


def test_help_has_an_example(run_cli) -> None:
    result = run_cli("estimate", "--help")
    assert result.exit_code == 0
    assert "costguard estimate --gpu a10g --hours 8 --count 4" in result.stdout


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSTGUARD_")}
    env["XDG_CONFIG_HOME"] = "/nonexistent-costguard-test"
    env["COSTGUARD_CACHE_DIR"] = "/nonexistent-costguard-test/cache"
    return env


def test_python_dash_m_and_console_script(tmp_path) -> None:
    script = str(Path(sys.executable).with_name("costguard"))
    for command in ([sys.executable, "-m", "costguard"], [script]):
        done = subprocess.run(
            [*command, *ARGS, "--format", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env=clean_env(),
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert '"compute_usd": "32.192"' in done.stdout


def test_real_process_bad_input_has_no_traceback(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "costguard", "estimate", "--gpu", "a10g", "--hours", "nan"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=clean_env(),
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("Error: ")
    assert "Traceback" not in done.stderr
