"""`Error:` and `Hint:` on a real pseudo-terminal of 80 and 120 columns: prose wrapped at
word boundaries to the width, a `command` in backticks never broken (one longer than the
line stands alone on its own), nothing lost; to a pipe, one line each."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.output import on_terminal

COSTGUARD = shutil.which("costguard", path=str(Path(sys.executable).parent))
#: Errors with long hints, each before any cloud call (no credentials: none is made).
ERRORS = [
    ("burn", "--budget", "200"),  # the AWS credentials hint, with `aws sso login ...`
    ("checkpoint", "ls", "s3:/my-bucket/run1"),
    ("estimate", "--gpu", "a10g", "--hours", "8", "--budget", "00"),
    ("reap", "--region", "us-east-9"),
    ("checkpoint", "ls", "az://runs/r1"),
]


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    drop = ("AWS_", "AZURE_", "COSTGUARD_", "COLUMNS", "LINES")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        XDG_CONFIG_HOME=str(tmp_path),
        COSTGUARD_JOBS_DIR=str(tmp_path / "jobs"),
    )
    return env


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("args", ERRORS, ids=lambda a: " ".join(a[:3]))
def test_errors_fit_the_terminal(
    args: tuple[str, ...], columns: int, clean_env: dict[str, str]
) -> None:
    assert COSTGUARD, "the costguard script is installed next to this python"
    code, screen = on_terminal([COSTGUARD, *args], columns, {**clean_env, "COLUMNS": f"{columns}"})
    piped = subprocess.run(
        [COSTGUARD, *args], capture_output=True, text=True, env=clean_env, timeout=120
    )
    assert code == piped.returncode == 2, screen
    error, hint = piped.stderr.splitlines()  # a pipe: one line each, whole
    lines = screen.splitlines()
    if len(hint) > columns:
        assert len(lines) > 2  # wrapped, not left to the terminal
    for line in lines:
        alone = re.fullmatch(r"\s*`[^`]*`\S*", line)  # a command standing alone
        assert len(line) <= columns or alone, f"{len(line)} > {columns}: {line!r}"
    assert " ".join(screen.split()) == " ".join(f"{error}\n{hint}".split())  # nothing lost
    commands = re.findall(r"`[^`]*`", hint)
    for command in commands:  # never broken over lines
        assert any(command in line for line in lines), command


@pytest.mark.parametrize("columns", [80, 120])
def test_the_alarms_done_line_fits_the_terminal(
    columns: int, aws_env: str, clean_env: dict[str, str]
) -> None:
    """`costguard alarm` against moto server, at a real terminal: its "Done:" and "No
    changes:" summaries wrapped to the width."""
    assert COSTGUARD
    env = {
        **clean_env,
        **{k: v for k, v in os.environ.items() if k.startswith("AWS_")},
        "AWS_MAX_ATTEMPTS": "1",
        "COLUMNS": f"{columns}",
    }
    args = [COSTGUARD, "alarm", "--budget", "200", "--thresholds", "25,50,75,90,100,110",
            "--email", "someone.long@university.example.edu", "--name", "thesis"]  # fmt: skip
    for first in ("Done: ", "No changes: "):
        code, screen = on_terminal(args, columns, env)
        assert code == 0, screen
        lines = screen.splitlines()
        (start,) = [n for n, line in enumerate(lines) if line.startswith(first)]
        summary = [lines[start]]  # and its continuation lines, indented under its text
        for line in lines[start + 1 :]:
            if not line.startswith(" " * len(first)):
                break
            summary.append(line)
        assert all(len(line) <= columns for line in summary), summary
        assert "costguard-thesis" in " ".join(" ".join(summary).split())
        # issue 49 item 6: the calls made, listed after "Done:", were 85-93 wide
        wide = [line for line in lines if len(line) > columns]
        assert not wide, wide
    code, screen = on_terminal([COSTGUARD, "alarm", "delete", "--yes"], columns, env)
    assert code == 0, screen
    lines = screen.splitlines()
    assert all(len(line) <= columns for line in lines), lines  # they were 109-135
    params = [json.loads(line) for line in lines if line.strip().startswith("{")]
    assert {"BudgetName": "costguard-thesis"}.items() <= params[0].items()  # JSON whole
    assert len(params) == len([line for line in lines if "  # " in line or " # " in line])


@pytest.mark.parametrize("columns", [80, 120])
def test_a_failed_refresh_fits_the_terminal(
    columns: int, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 49 item 6: a refresh without AWS credentials printed its Error and a
    307-character Hint unwrapped (the terminal split `AWS_PR|OFILE`)."""
    assert COSTGUARD
    args = [COSTGUARD, "pricing", "refresh", "--provider", "aws", "--region", "us-east-1"]
    env = {**clean_env, "COLUMNS": f"{columns}", "COSTGUARD_CACHE_DIR": str(tmp_path / "c")}
    code, screen = on_terminal(args, columns, env)
    piped = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert code == piped.returncode == 1, screen
    hint = next(line for line in piped.stderr.splitlines() if line.startswith("Hint: "))
    assert len(hint) > columns  # one line to a pipe; the terminal's is wrapped
    lines = screen.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("Error: "))
    told = lines[start:]
    for line in told:
        alone = re.fullmatch(r"\s*`[^`]*`\S*", line)
        assert len(line) <= columns or alone, f"{len(line)} > {columns}: {line!r}"
    for word in hint.split():  # each word whole on a line, nothing lost
        assert any(word in line.split() for line in told), word


@pytest.mark.parametrize("columns", [80, 120])
def test_costguard_runs_own_lines_fit_the_terminal(
    columns: int, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 49 item 6: `costguard run`'s own lines were 83-159 wide ("Ctrl-C again stops
    it n|ow"); the script's own line is its own."""
    assert COSTGUARD
    store = tmp_path / "a-checkpoint-folder-with-a-long-name"
    args = [COSTGUARD, "run", "--checkpoint", str(store), "--every-steps", "10",
            "--", sys.executable, "-c", "print('the script ran')"]  # fmt: skip
    code, screen = on_terminal(args, columns, {**clean_env, "COLUMNS": f"{columns}"})
    assert code == 0, screen
    ours = [line for line in screen.splitlines() if line != "the script ran"]
    assert ours[0].startswith("costguard: ")
    assert "the script ran" in screen.splitlines()
    for line in ours:  # a path longer than the line stands alone, whole
        alone = re.fullmatch(r"\s*\S+", line)
        assert len(line) <= columns or alone, f"{len(line)} > {columns}: {line!r}"
    piped = subprocess.run(args, capture_output=True, text=True, env=clean_env, timeout=120)
    told = [line.removeprefix("costguard: ") for line in piped.stderr.splitlines()]
    assert " ".join(" ".join(told).split()) in " ".join(" ".join(ours).split()).replace(
        "costguard: ", ""
    )
