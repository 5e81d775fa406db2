"""`costguard estimate --from-run URL --steps N`: hours from a run's measured pace, priced
like typed ones, every figure stated. The records are written with the library's own
writer (:func:`costguard.checkpoint.pace.write_pace`), as the Checkpointer writes them."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pytest

from costguard.checkpoint.pace import Pace, write_pace
from costguard.checkpoint.store import Store
from tests.helpers.output import assert_fits
from tests.helpers.stores import make_s3_bucket

#: 390 steps in 195 s: 0.5 s a step, on an A10G.
A10G_PACE = Pace(
    390, 195.0, 400, 2_000_000_000.0, 1_999_999_800.0, warmup_steps=5, outlier_steps=2,
    outlier_s=12.0, saves=3, overhead_s=0.6, device="NVIDIA A10G", host="box",
)  # fmt: skip


def recorded(tmp_path: Path, pace: Pace = A10G_PACE) -> str:
    url = str(tmp_path / "run1")
    write_pace(Store.open(url), pace)
    return url


def test_measured_hours_are_priced_as_typed_ones_and_stated(run_cli, tmp_path: Path) -> None:
    url = recorded(tmp_path)
    measured = run_cli("estimate", "--from-run", url, "--steps", "36000", "--format", "json")
    assert measured.exit_code == 0, measured.stderr
    doc = measured.json()
    assert Decimal(doc["query"]["hours"]) == Decimal("5.0000")  # 36000 x 0.5 s
    assert doc["query"]["gpus"] == ["A10G"]  # from the device's name
    source = doc["query"]["hours_from"]
    assert source["run"] == url
    assert source["steps_measured"] == 390
    assert source["seconds_measured"] == 195.0
    # With the 2 slow steps (12 s) and 0.6 s inside step(): the wall-clock rate, stated too.
    assert source["wall_seconds_per_step"] == round((195.0 + 12.0 + 0.6) / 392, 6)
    assert source["device"] == "NVIDIA A10G"
    assert source["warmup_steps_left_out"] == 5
    assert source["slow_steps_left_out"] == 2
    assert source["saves"] == 3
    assert source["seconds_inside_step_left_out"] == 0.6
    assert source["scaled"] is False
    said = " ".join(doc["assumptions"])
    assert "390 steps measured over 195.0 s on NVIDIA A10G" in said
    assert "left out" in said
    typed = run_cli("estimate", "--gpu", "a10g", "--hours", "5", "--format", "json").json()
    assert [o["total_usd"] for o in doc["options"]] == [o["total_usd"] for o in typed["options"]]
    assert all(isinstance(o["total_usd"], str) and "." in o["total_usd"] for o in doc["options"])


def test_table_says_the_hours_are_measured(run_cli, tmp_path: Path) -> None:
    result = run_cli("estimate", "--from-run", recorded(tmp_path), "--steps", "36000")
    assert result.exit_code == 0, result.stderr
    assert "5.0000 h (measured)" in result.stdout
    assert "hours measured, not guessed" in result.stdout


def test_the_runs_total_steps_are_the_default(run_cli, tmp_path: Path) -> None:
    pace = Pace(100, 100.0, 120, 2.0, 1.0, total_steps=7200, device="Tesla T4")
    result = run_cli("estimate", "--from-run", recorded(tmp_path, pace), "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert Decimal(doc["query"]["hours"]) == Decimal(2)
    assert doc["query"]["gpus"] == ["T4"]


def test_epochs_are_the_trainers_steps_per_epoch(run_cli, tmp_path: Path) -> None:
    # A trainer's record: 0.5 s a step, 1200 steps an epoch, 4 evaluations of 10 s.
    pace = Pace(390, 195.0, 400, 2.0, 1.0, steps_per_epoch=1200, evaluations=4,
                evaluation_s=40.0, device="NVIDIA A10G")  # fmt: skip
    url = recorded(tmp_path, pace)
    result = run_cli("estimate", "--from-run", url, "--epochs", "2.5", "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert Decimal(doc["query"]["hours"]) == Decimal("0.4167")  # 3000 steps x 0.5 s
    source = doc["query"]["hours_from"]
    assert (source["steps"], source["epochs"], source["steps_per_epoch"]) == (3000, "2.5", 1200)
    assert (source["evaluations"], source["evaluation_s_left_out"]) == (4, 40.0)
    said = " ".join(doc["assumptions"])
    assert "3000 steps (2.5 epochs x 1200 steps)" in said
    assert "4 evaluations (40.0 s)" in said
    table = run_cli("estimate", "--from-run", url, "--epochs", "1")
    assert table.exit_code == 0, table.stderr
    assert "1200 steps (1 epoch x 1200 steps)" in " ".join(table.stdout.split())


def test_another_gpu_needs_a_stated_speedup_and_is_flagged(run_cli, tmp_path: Path) -> None:
    url = recorded(tmp_path)
    refused = run_cli("estimate", "--from-run", url, "--steps", "36000", "--gpu", "h100")
    assert refused.exit_code == 2
    assert "Error: " in refused.stderr
    assert "measured on A10G, not on H100" in refused.stderr
    assert "Hint: pass --speedup" in refused.stderr
    scaled = run_cli(
        "estimate", "--from-run", url, "--steps", "36000", "--gpu", "h100", "--speedup", "4",
        "--format", "json",
    )  # fmt: skip
    assert scaled.exit_code == 0, scaled.stderr
    doc = scaled.json()
    assert Decimal(doc["query"]["hours"]) == Decimal("1.25")
    assert doc["query"]["hours_from"]["scaled"] is True
    assert doc["query"]["hours_from"]["speedup"] == "4"
    assert all(o["scaled"] is True for o in doc["options"])
    assert any(a.startswith("SCALED: measured on A10G, priced on H100") for a in doc["assumptions"])
    table = run_cli(
        "estimate", "--from-run", url, "--steps", "36000", "--gpu", "h100", "--speedup", "4"
    )
    assert "(measured, SCALED)" in table.stdout


def test_a_cpu_measurement_prices_a_gpu_only_scaled(run_cli, tmp_path: Path) -> None:
    url = recorded(tmp_path, Pace(50, 5.0, 60, 2.0, 1.0, device="cpu"))
    result = run_cli("estimate", "--from-run", url, "--steps", "100")
    assert result.exit_code == 2
    assert "measured on cpu, which the tables do not price" in result.stderr
    assert "Hint: " in result.stderr
    result = run_cli("estimate", "--from-run", url, "--steps", "100", "--gpu", "t4")
    assert result.exit_code == 2
    assert "--speedup" in result.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--gpu", "a10g", "--hours", "2", "--steps", "10"), "is for --from-run"),
        (("--hours", "2", "--from-run", "{url}", "--steps", "5"), "both give the hours"),
        (("--from-run", "{url}"), "needs --steps"),
        (("--from-run", "{url}", "--steps", "5", "--gpu", "t4,l4"), "prices one GPU"),
        (("--from-run", "{missing}", "--steps", "5"), "no such folder"),
        (("--from-run", "{empty}", "--steps", "5"), "holds no measured pace"),
        (("--from-run", "{thin}", "--steps", "5"), "measured 4 training step(s)"),
        (("--from-run", "{url}", "--steps", "10000000000000"), "--steps"),
        ((), "give --hours, or --from-run"),
        (("--from-run", "{url}", "--epochs", "3"), "recorded no steps per epoch"),
        (("--from-run", "{url}", "--epochs", "3", "--steps", "5"), "both give the run's"),
        (("--gpu", "a10g", "--hours", "2", "--epochs", "3"), "is for --from-run"),
        (("--from-run", "{url}", "--epochs", "0"), "--epochs"),
        (("--from-run", "{url}", "--epochs", "nan"), "--epochs"),
    ],
)
def test_bad_input_is_refused_before_any_pricing(
    run_cli, tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    places = {
        "url": recorded(tmp_path),
        "missing": str(tmp_path / "nothing-here"),
        "empty": str(tmp_path),
        "thin": recorded(tmp_path / "t", Pace(4, 2.0, 10, 2.0, 1.0, device="NVIDIA L4")),
    }
    result = run_cli("estimate", *(a.format(**places) for a in args))
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Error: ")
    assert said in result.stderr
    assert any(line.startswith("Hint: ") for line in lines)
    assert result.stdout == ""


def test_a_run_in_s3(run_cli, aws_env: str, tmp_path: Path) -> None:
    make_s3_bucket(os.environ["AWS_ENDPOINT_URL"], "pilot-runs")
    write_pace(Store.open("s3://pilot-runs/run1"), A10G_PACE)
    result = run_cli(
        "estimate", "--from-run", "s3://pilot-runs/run1", "--steps", "7200", "--format", "json"
    )
    assert result.exit_code == 0, result.stderr
    assert Decimal(result.json()["query"]["hours"]) == 1
    assert result.json()["query"]["hours_from"]["run"] == "s3://pilot-runs/run1"


def test_help_example_fits_80_columns(run_cli) -> None:
    result = run_cli("estimate", "--help")
    examples = result.stdout[result.stdout.index("Examples:") :].splitlines()
    ours = [
        line
        for line in examples
        if "--from-run" in line or "measured step" in line or "steps per epoch" in line
    ]
    assert len(ours) == 4
    assert_fits(
        "\n".join(ours),
        80,
        [
            "--from-run s3://my-bucket/run1 --steps 20000",
            "--from-run s3://my-bucket/run1 --epochs 3",
        ],
    )
