"""Commands the CLI prints for a person to paste (hints, next steps, a launch's report):
each in backticks, each word quoted as a shell needs it (a folder with a space stays one
word), and never broken over lines at an 80-column terminal: one longer than the line
stands alone on its own line, whole."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from costguard.alarms.guard import require_alarm
from costguard.checkpoint.store import Store
from costguard.cli import render, wrap_words
from costguard.errors import CostguardError
from costguard.spot import report
from costguard.spot.job import Job, save_job
from tests.helpers.output import assert_commands_whole
from tests.spot.test_offers_and_job import spec

COMMAND = re.compile(r"`([^`]*)`")
WIDTH = 80


def pasted(text: str) -> list[list[str]]:
    """The words a shell makes of each command in ``text`` (wrapped or not)."""
    return [shlex.split(found) for found in COMMAND.findall(" ".join(text.split()))]


@pytest.fixture
def folder(tmp_path: Path) -> str:
    """A checkpoint folder whose path has spaces: unquoted, a shell makes several words."""
    path = tmp_path / "my runs" / "run 1"
    path.mkdir(parents=True)
    return str(path)


class _NoAlarm:
    def has_alarm(self) -> bool:
        return False


def test_a_running_jobs_hint_names_commands_that_paste(
    run_cli: Callable[..., Any], folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COSTGUARD_LOCAL_DIR", str(tmp_path / "local"))
    store = Store.open(folder)
    save_job(store, Job(spec(store.url)))
    args = ("--provider", "local", "--gpu", "t4", "--checkpoint", folder, "--yes")
    result = run_cli("launch", *args, "--", "python", "train.py")
    assert result.exit_code == 2, result.stderr
    hint = result.stderr.splitlines()[-1]
    assert pasted(hint) == [
        ["costguard", "launch", "--attach", store.url],
        ["costguard", "jobs", "status", store.url],
    ]
    assert_commands_whole(wrap_words("Hint: ", hint.removeprefix("Hint: "), WIDTH), WIDTH, hint)


def test_the_offer_hint_names_an_estimate_that_pastes(
    run_cli: Callable[..., Any], folder: str
) -> None:
    args = ("--provider", "local", "--gpu", "a10g", "--gpus-per-instance", "3", "--yes")
    result = run_cli("launch", *args, "--checkpoint", folder, "--", "python", "train.py")
    assert result.exit_code == 2, result.stderr
    (command,) = pasted(result.stderr.splitlines()[-1])
    assert command[:2] == ["costguard", "estimate"]
    assert command[command.index("--gpus-per-instance") + 1] == "3"


def test_the_alarm_guard_names_the_alarm_command() -> None:
    with pytest.raises(CostguardError) as refused:
        require_alarm("gcp", _NoAlarm())
    assert pasted(refused.value.hint or "") == [
        ["costguard", "alarm", "--provider", "gcp", "--budget", "200", "--email", "you@uni.edu"]
    ]


@pytest.mark.parametrize("released", [True, False])
def test_a_launchs_report_and_its_interruption_name_commands_that_paste(
    terminal: Callable[[int], None],
    capsys: pytest.CaptureFixture[str],
    folder: str,
    released: bool,
) -> None:
    """The weights' export after the report (`jobs status`, the end of a launch) and the
    `--attach` that takes over after Ctrl-C, printed at 80 columns as the CLI prints them."""
    job = Job(spec(folder))
    checkpoint = {"name": "ckpt-000000000007-0a1b2c3d", "step": 7, "reason": "final"}
    lines = report.summary_lines(job, [], 2000.0, checkpoint)
    interrupted = report.interrupted_line(folder, released=released)
    assert pasted(" ".join(lines)) == [
        ["costguard", "checkpoint", "export", folder, "--to", "model.safetensors"]
    ]
    assert pasted(interrupted) == [["costguard", "launch", "--attach", folder]]
    terminal(WIDTH)
    for line in lines:
        render.print_prose(line, first="", indent="  ")
    render.print_prose(interrupted, first="costguard: ", indent="  ")
    shown = capsys.readouterr().out.splitlines()
    assert_commands_whole(shown, WIDTH, " ".join([*lines, interrupted]))
