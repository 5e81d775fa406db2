"""The integrations' notices (:mod:`costguard.integrations.notices`): what ``costguard run``
relays is seen at the next step boundary; outside ``costguard run`` nothing is installed
and nothing is ever pending."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from costguard.checkpoint.distributed import ENV_NOTICE_FILE, ENV_PREEMPTED_FILE, append_notice
from costguard.checkpoint.notices import Notice
from costguard.contract import ENV_EVENTS_FILE
from costguard.integrations.notices import EXIT_PREEMPTED, Watch
from tests.helpers.training import child_env

PROBE = """
import signal
from costguard.integrations.accelerate import notice
print(notice(), signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
signal.raise_signal(signal.SIGTERM)
print("survived")
"""


def test_outside_costguard_run_the_helpers_do_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=child_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.split() == ["False", "True"]  # no notice, SIGTERM left alone
    assert done.returncode == -signal.SIGTERM


def test_a_relayed_notice_is_seen_at_the_next_call_and_recorded_on_exit(tmp_path: Path) -> None:
    notices, preempted = tmp_path / "notices.jsonl", tmp_path / "preempted.json"
    watch = Watch({ENV_NOTICE_FILE: str(notices), ENV_PREEMPTED_FILE: str(preempted)})
    try:
        assert watch.active
        assert watch.pending() is None
        append_notice(notices, Notice("gcp", "preempt", None, "TRUE"))
        seen = watch.pending()
        assert seen is not None
        assert seen.source == "gcp"
        with pytest.raises(SystemExit) as exited:
            watch.exit_preempted(42, output_dir="out")
        assert exited.value.code == EXIT_PREEMPTED
        assert '"step": 42' in preempted.read_text()
    finally:
        watch.close()


def test_sigterm_under_costguard_run_is_a_notice_not_the_end(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    watch = Watch({ENV_NOTICE_FILE: str(tmp_path / "notices.jsonl")})
    try:
        signal.raise_signal(signal.SIGTERM)
        seen = watch.pending()
        assert seen is not None
        assert seen.detail == "SIGTERM"
    finally:
        watch.close()
    assert signal.getsignal(signal.SIGTERM) is before  # given back


#: A script's end as its watch reports it: ``looks`` calls of notice() after the signal,
#: ``chained``: another handler installed over costguard's that calls it in turn (as
#: Lightning's does).
REPORTED = """
import os, signal, sys
from costguard.integrations.accelerate import notice
looks, chained = int(sys.argv[1]), sys.argv[2] == "chained"
notice()
if chained:
    ours = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: ours(signum, frame))
signal.raise_signal(signal.SIGTERM)
for _ in range(looks):
    notice()
"""


@pytest.mark.parametrize(
    ("looks", "chained", "seen", "alone"),
    [(0, "alone", False, True), (1, "alone", True, True), (0, "chained", False, False)],
)
def test_the_watch_reports_its_start_and_whether_the_script_saw_a_notice(
    tmp_path: Path, looks: int, chained: str, seen: bool, alone: bool
) -> None:
    """What ``costguard run`` decides a script's exit 0 after a notice from: the watch was
    installed, and at the end whether the script was handed the notice, how many signals
    the watch took and whether another handler took them too."""
    events = tmp_path / "events.jsonl"
    env = child_env(tmp_path, **{ENV_NOTICE_FILE: str(tmp_path / "n"),
                                 ENV_EVENTS_FILE: str(events)})  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", REPORTED, str(looks), chained],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    start, end = (json.loads(line) for line in events.read_text().splitlines())
    assert start == {"event": "watch", "pid": end["pid"]}
    assert (end["event"], end["seen"], end["alone"], end["signals"]) == (
        "watch-end",
        seen,
        alone,
        1,
    )
