"""Small things a newcomer meets in the first hour (issue 33, item 6)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import costguard
from costguard.checkpoint.notices import Notice
from costguard.errors import InputError
from tests.helpers.output import on_terminal


def test_the_python_api_asks_for_hours_as_the_cli_does() -> None:
    with pytest.raises(InputError) as info:
        costguard.estimate(gpu="a10g")
    assert info.value.message == "hours is required: how long the run takes"
    assert info.value.hint == "e.g. costguard.estimate(gpu='a10g', hours=8)"
    assumptions = costguard.estimate(gpu="a10g", hours=8).document()["assumptions"]
    assert "Compute: price per hour x 8 h x 1 instance(s)" in assumptions


def test_a_signal_notice_is_named_once() -> None:
    assert Notice("signal", "signal", None, "SIGTERM").describe() == "signal notice (SIGTERM)"
    assert Notice("aws", "terminate", None).describe() == "aws terminate notice"


@pytest.mark.parametrize("typed", ["00", "000", ".50", ""])
@pytest.mark.parametrize("command", [("estimate", "--gpu", "a10g", "--hours", "8"), ("burn",)])
def test_a_budget_the_shell_ate_says_to_quote_it(
    command: tuple[str, ...], typed: str, run_cli: Callable[..., Any]
) -> None:
    """``--budget $200`` unquoted reaches costguard as ``00``."""
    result = run_cli(*command, "--budget", typed)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"Error: --budget {typed!r} is not an amount in USD",
        "Hint: in a shell, $ starts a variable ($200 arrives as 00): write --budget 200, "
        "or quote it: --budget '$200'",
    ]


def test_a_quoted_dollar_amount_is_taken(run_cli: Callable[..., Any]) -> None:
    args = ("estimate", "--gpu", "a10g", "--hours", "8", "--format", "json")
    assert run_cli(*args, "--budget", "$200").json() == run_cli(*args, "--budget", "200").json()


def test_the_tests_keep_pid_files_out_of_system_folders(tmp_path: Path) -> None:
    """A real `costguard run` started as the tests start them: its pid file goes to the
    tests' own folder, never to /run/costguard/jobs."""
    jobs = Path(os.environ["COSTGUARD_JOBS_DIR"])
    assert not jobs.is_relative_to("/run")
    script = "import os; print(sorted(os.listdir(os.environ['COSTGUARD_JOBS_DIR'])))"
    result = subprocess.run(
        [sys.executable, "-m", "costguard", "run", "--checkpoint", str(tmp_path / "ckpt"),
         "--", sys.executable, "-c", script],
        capture_output=True, text=True, timeout=120, env=dict(os.environ), check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(".pid']"), result.stdout


@pytest.mark.parametrize("answer", [b"n\n", b""])
def test_a_declined_launch_leaves_no_folder(answer: bytes, tmp_path: Path) -> None:
    """Declined at a real terminal (exit 1, not 130 as for Ctrl-C), or refused without one:
    the checkpoint folder made for the job, and its parents, are gone again."""
    costguard = str(Path(sys.executable).parent / "costguard")
    args = [costguard, "launch", "--provider", "local", "--gpu", "a10g", "--checkpoint",
            str(tmp_path / "runs" / "r1"), "--", "python", "-c", "pass"]  # fmt: skip
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    if answer:
        code, screen = on_terminal(args, 80, env, typed=answer)
        assert code == 1, screen
        assert "Error: not launched: declined at the confirmation" in screen
    else:
        done = subprocess.run(args, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 2, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "error", "hint"),
    [
        (
            ("--gpu", "a10g"),  # AWS only: AWS names
            "Error: unknown AWS region 'us-east'",
            "Hint: did you mean us-east-2 or us-east-1 (AWS)?",
        ),
        (
            ("--gpu", "a100", "--provider", "aws"),
            "Error: unknown AWS region 'us-east'",
            "Hint: did you mean us-east-2 or us-east-1 (AWS)?",
        ),
        (
            ("--gpu", "l4", "--provider", "gcp"),
            "Error: unknown GCP region 'us-east'",
            "Hint: did you mean us-east5 or us-east4 (GCP)?",
        ),
    ],
)
def test_region_suggestions_are_of_the_providers_in_question(
    args: tuple[str, ...], error: str, hint: str, run_cli: Callable[..., Any]
) -> None:
    result = run_cli("estimate", *args, "--hours", "1", "--region", "us-east")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [error, hint]


def test_a_gpu_on_every_cloud_gets_suggestions_per_cloud(run_cli: Callable[..., Any]) -> None:
    result = run_cli("estimate", "--gpu", "h100", "--hours", "1", "--region", "us-east")
    hint = result.stderr.splitlines()[1]
    for cloud in ("(AWS)", "(GCP)", "(Azure)"):
        assert cloud in hint
    assert "us-east-1" in hint


def test_a_second_ctrl_c_reports_130_and_nothing_else(tmp_path: Path) -> None:
    """A rank saved on the first Ctrl-C (its record written) and another hangs: the second
    Ctrl-C stops everything, and `costguard run` says 130 only, not "reporting 75" first."""
    script = (
        "import os, pathlib, time\n"
        "pathlib.Path(os.environ['COSTGUARD_PREEMPTED_FILE']).write_text('{}')\n"
        "print('up', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "costguard", "run", "--checkpoint", str(tmp_path / "ck"),
         "--", sys.executable, "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)},
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "up"
    assert proc.stderr is not None
    proc.send_signal(signal.SIGINT)
    for _ in range(50):  # until costguard says it relayed the first
        if "Ctrl-C: asking the script to save" in proc.stderr.readline():
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "stopped at once by a second Ctrl-C" in err
    assert "reporting" not in err, err
