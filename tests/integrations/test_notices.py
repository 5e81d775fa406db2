"""The integrations' notices (:mod:`costguard.integrations.notices`): what ``costguard run``
relays is seen at the next step boundary; outside ``costguard run`` nothing is installed
and nothing is ever pending."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from costguard.checkpoint.distributed import ENV_NOTICE_FILE, ENV_PREEMPTED_FILE, append_notice
from costguard.checkpoint.notices import Notice
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
