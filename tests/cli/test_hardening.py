"""The measured defects of issue 14 that bad input caused, one by one (the sweep in
test_hostile_input.py covers every option; these name the cases the audit found)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

LOCAL_LAUNCH = ("launch", "--provider", "local", "--gpu", "a10g", "--yes")


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--poll-seconds", "nan"),  # launched attempt 1, then the controller died
        ("--poll-seconds", "inf"),
        ("--timeout-hours", "nan"),  # exited 1 "unexpected ValueError"
        ("--timeout-hours", "1e400"),
        ("--every-minutes", "nan"),
        ("--every-minutes", "inf"),
        ("--every-minutes", "1e400"),
        ("--preempt-every", "nan"),
        ("--notice-seconds", "-inf"),
    ],
)
def test_launch_refuses_non_finite_numbers_before_anything_starts(
    run_cli: Any, tmp_path: Path, flag: str, value: str
) -> None:
    ckpt = tmp_path / "ckpt"
    result = run_cli(*LOCAL_LAUNCH, "--checkpoint", str(ckpt), flag, value, "--", "true")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(f"Error: Invalid value for '{flag}'")
    assert not ckpt.exists()  # no job.json: nothing says "running" with nobody supervising


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400", "0", "5\n", "\uff15"])
def test_run_refuses_a_bad_save_interval_before_the_script_starts(
    run_cli: Any, tmp_path: Path, value: str
) -> None:
    marker = tmp_path / "started"
    result = run_cli(
        "run", "--checkpoint", str(tmp_path / "ckpt"), "--every-minutes", value,
        "--", "touch", str(marker),
    )  # fmt: skip
    assert result.exit_code == 2, result.stderr
    assert "--every-minutes" in result.stderr.splitlines()[0]
    assert not marker.exists()
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize(
    "args",
    [
        ("run", "--checkpoint", "s3://", "--", "true"),
        ("launch", "--provider", "aws", "--gpu", "a10g", "--checkpoint", "s3://", "--", "true"),
        ("jobs", "status", "s3://"),
        ("slurm", "script", "--time", "1:00:00", "--checkpoint", "gs://", "--", "true"),
    ],
)
def test_a_url_without_a_bucket_exits_2_at_once(run_cli: Any, args: tuple[str, ...]) -> None:
    """It exited 1 after retrying botocore's ParamValidationError four times."""
    result = run_cli(*args)
    assert result.exit_code == 2, result.stderr
    assert "has no bucket" in result.stderr
    assert "retry" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("launch", "--option", "x" * 131_000, "--gpu", "a10g", "--", "true"),
        ("estimate", "--gpu", "a" * 131_000),
        ("estimate", "--gpu", "a10g", "--hours", "9" * 131_000),
        ("slurm", "script", "--time", "1" * 131_000, "--checkpoint", "c/", "--", "true"),
        ("reap", "--protect-tag", "=" + "k" * 131_000),
    ],
)
def test_a_huge_argument_is_not_echoed_whole(run_cli: Any, args: tuple[str, ...]) -> None:
    result = run_cli(*args)
    assert result.exit_code == 2, result.stderr[:300]
    lines = result.stderr.splitlines()
    assert lines[0].startswith("Error: ")
    assert len(lines) == 2
    assert all(len(line) <= 700 for line in lines), [len(line) for line in lines]
