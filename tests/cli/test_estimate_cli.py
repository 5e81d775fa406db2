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
T4_2H = ("estimate", "--gpu", "t4", "--hours", "2")
SLURM_ARGS = ("--provider", "slurm", "--su-per-gpu-hour", "32")


def test_table_shows_both_markets_and_assumptions(run_cli) -> None:
    result = run_cli(*ARGS)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "on-demand" in out
    assert "spot" in out
    assert "g5.xlarge" in out
    assert "$32.19" in out  # us-east-1 on-demand compute
    # the title dates the prices shown by the date most of them carry (AWS on-demand:
    # vantage's data of 2026-08-26); the spot rows, of no known date, are marked
    assert "as of 2026-08-26" in out
    assert "^ priced as of another date than the title's 2026-08-26" in out
    assert "Not included: taxes" in out
    assert "total = compute + storage + egress" in out
    assert "100 GB per instance" in out  # the default disk is shown


def test_json_document_shape_and_issue_example(run_cli) -> None:
    result = run_cli(*ARGS, "--format", "json", "--top", "0")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert set(doc) >= {"query", "pricing_as_of", "options", "assumptions"}
    assert doc["pricing_as_of"] == "unknown"  # the oldest price shown: a spot one, undated
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
    # each row is dated by its own price: every AWS on-demand price is of 2026-08-26
    dated = {r["region"]: r["pricing_as_of"] for r in rows}
    assert set(dated.values()) == {"2026-08-26"}
    assert "Not included" in result.stderr


def test_a_csv_notes_cell_is_its_notes_in_words_not_a_python_list(run_cli) -> None:
    """An option's notes are a list in JSON; in CSV one cell, joined by "; " (it was the
    list's Python repr: "['spot price unverified: ...']")."""
    args = ("estimate", "--gpu", "t4", "--hours", "8", "--region", "af-south-1")
    doc = run_cli(*args, "--format", "json").json()
    noted = {(o["instance_type"], o["market"]): o["notes"] for o in doc["options"] if o["notes"]}
    assert noted  # af-south-1's spot price of g4dn.xlarge is unverified: a note
    result = run_cli(*args, "--format", "csv")
    assert result.exit_code == 0, result.stderr
    read = csv.DictReader(io.StringIO(result.stdout))
    rows = {(r["instance_type"], r["market"]): r for r in read}
    for key, notes in noted.items():
        assert rows[key]["notes"] == "; ".join(notes)
        assert not rows[key]["notes"].startswith("[")


def test_spot_only(run_cli) -> None:
    doc = run_cli(*ARGS, "--spot", "--format", "json").json()
    assert {o["market"] for o in doc["options"]} == {"spot"}
    assert doc["query"]["markets"] == ["spot"]


def test_filters_and_top(run_cli) -> None:
    doc = run_cli(*T4_2H, "--provider", "gcp", "--top", "2", "--format", "json").json()
    assert {o["provider"] for o in doc["options"]} == {"gcp"}
    assert len({o["region"] for o in doc["options"]}) == 2
    assert doc["options_total"] > len(doc["options"])
    doc = run_cli(
        *T4_2H, "--region", "eastus", "--region", "us-east-1", "--format", "json", "--top", "0"
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
        "--region",
        "europe-west4",  # the SkyPilot row at half the others' price, no second source
        "--format",
        "json",
    ).json()
    assert doc["options"]
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
        (("--gpu", "a10g", "--hours", "8", "--provider", "slurm"), "--su-per-gpu-hour"),
        (("--gpu", "a10g", "--hours", "8", "--provider", "SLURM"), "--su-per-gpu-hour"),
        (("--gpu", "a10g", "--hours", "8", "--su-per-gpu-hour", "4"), "--provider slurm"),
        (("--gpu", "a10g", "--hours", "8", "--usd-per-su", "1"), "--provider slurm"),
        (
            ("--gpu", "a10g", "--hours", "8", *SLURM_ARGS[:2], "--su-per-gpu-hour", "0"),
            "more than 0",
        ),
        (("--gpu", "a10g", "--hours", "8", *SLURM_ARGS, "--su-budget", "-5"), "--su-budget"),
        (("--gpu", "a10g", "--hours", "8", *SLURM_ARGS, "--usd-per-su", "x"), "--usd-per-su"),
        (("--instance-type", "g5.xlarge", "--hours", "8", *SLURM_ARGS), "--gpu"),
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


def clean_env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSTGUARD_")}
    env["XDG_CONFIG_HOME"] = "/nonexistent-costguard-test"
    env["COSTGUARD_CACHE_DIR"] = str(folder / "cache")
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
            env=clean_env(tmp_path),
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
        env=clean_env(tmp_path),
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("Error: ")
    assert "Traceback" not in done.stderr


# SLURM allocations: service units next to the cloud options.


def test_slurm_table_sits_next_to_every_cloud(run_cli) -> None:
    result = run_cli(*ARGS, *SLURM_ARGS, "--su-budget", "4096", "--top", "0")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "g5.xlarge" in out
    assert "us-east-1" in out
    assert "SLURM allocation: 4 x A10G GPU(s), 8 h" in out
    assert "1,024" in out  # 4 GPUs x 8 h x 32 SU
    assert "25.0% of 4,096" in out
    assert "allocation, not billed" in out
    assert "The SLURM run uses 1,024 SU of the allocation (not billed)" in out
    assert "4 GPU(s) x 8 h x 32 SU per GPU-hour" in out  # the assumption


def test_slurm_json_in_su_and_dollars_only_when_given(run_cli) -> None:
    doc = run_cli(*ARGS, *SLURM_ARGS, "--provider", "aws", "--format", "json").json()
    assert doc["query"]["providers"] == ["aws"]
    assert {o["provider"] for o in doc["options"]} == {"aws"}
    slurm = doc["slurm"]
    assert slurm["service_units"] == "1024"
    assert slurm["gpu_hours"] == "32"
    assert slurm["billed"] is False
    assert slurm["total_usd"] is None
    assert Decimal(slurm["cheapest_cloud_total_usd"]) == Decimal(doc["options"][0]["total_usd"])
    assert any(a.startswith("SLURM: an allocation, not billed") for a in doc["assumptions"])

    priced = run_cli(*ARGS, *SLURM_ARGS, "--usd-per-su", "0.05", "--format", "json").json()
    assert priced["slurm"]["billed"] is True
    assert priced["slurm"]["total_usd"] == "51.2"  # 1024 SU x $0.05
    assert priced["query"]["slurm"]["usd_per_su"] == "0.05"
    assert "more than the cloud" in priced["slurm"]["notes"][0]


def test_no_slurm_key_content_without_slurm(run_cli) -> None:
    doc = run_cli(*ARGS, "--format", "json").json()
    assert doc["slurm"] is None
    assert doc["query"]["slurm"] is None


def test_slurm_csv_row_and_columns(run_cli) -> None:
    result = run_cli(*ARGS, *SLURM_ARGS, "--format", "csv", "--top", "2")
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    *clouds, slurm = rows
    assert clouds
    assert all(r["service_units"] == "" for r in clouds)
    assert slurm["provider"] == "slurm"
    assert slurm["market"] == "allocation"
    assert slurm["service_units"] == "1024"
    assert slurm["total_usd"] == ""  # not billed
    assert "not billed" in slurm["notes"]
    assert "SLURM: service units" in result.stderr

    plain = run_cli(*ARGS, "--format", "csv")
    assert "service_units" not in plain.stdout.splitlines()[0]


def test_su_budget_exceeded_exits_1_after_printing(run_cli) -> None:
    result = run_cli(*ARGS, *SLURM_ARGS, "--su-budget", "1000")
    assert result.exit_code == 1
    assert "SLURM allocation" in result.stdout
    assert "needs 1,024 SU, more than the --su-budget of 1,000 SU" in result.stderr
    assert "Hint:" in result.stderr


def test_slurm_counts_nodes_or_array_tasks_times_gpus(run_cli) -> None:
    """`--count 10 --gpus-per-instance 4`: a 10-task array (or 10 nodes) of 4 GPUs each."""
    args = ("estimate", "--gpu", "a100", "--gpus-per-instance", "4", "--count", "10")
    doc = run_cli(*args, "--hours", "2", *SLURM_ARGS, "--format", "json").json()
    assert doc["slurm"]["gpus"] == 40
    assert doc["slurm"]["gpu_hours"] == "80"
    assert doc["slurm"]["service_units"] == "2560"  # 10 x 4 GPUs x 2 h x 32 SU
    assert any("40 GPU(s) = 10 x 4 GPU(s)" in line for line in doc["assumptions"])
    help_text = run_cli("estimate", "--help").stdout
    assert "--array 0-9: --count 10" in " ".join(help_text.split())
