"""The exit line of ``costguard run --sync-dir`` tells the truth (issue 45 items 5-8), on a
local and an S3 (moto) store, with real processes and real signals: a script that ends (0,
or by the signal) after costguard passed on a notice, before the trainer's own state says
it reached its end, was preempted (exit 75, resumable); one that had done its work is not
"the script failed"; the line names the newest checkpoint in the store; a script that
ignores notices is told so, with the fix.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.processes import StreamLines
from tests.helpers.stores import make_s3_bucket
from tests.helpers.training import Followed, child_env, costguard_command

HERE = Path(__file__).parent


@pytest.fixture(params=["local", "s3"])
def url_env(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    env = child_env(tmp_path, COSTGUARD_CLOUD="none")
    if request.param == "local":
        return str(tmp_path / "store"), env
    endpoint = request.getfixturevalue("aws_env")
    make_s3_bucket(endpoint, "exits")
    env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    return "s3://exits/run1", env


def started(url_env: tuple[str, dict[str, str]], out: Path, *args: str) -> Followed:
    url, env = url_env
    command = [*costguard_command(), "run", "--checkpoint", url, "--sync-dir", str(out), "--"]
    command += [sys.executable, str(HERE / "notice_script.py"), "--out", str(out), *args]
    run = Followed(command, env, 120)
    run.read_until(lambda line: line == "READY")
    return run


def exit_line(run: Followed) -> str:
    return next(line for line in run.stderr().splitlines() if "exit " in line and ": " in line)


@pytest.mark.parametrize("on_term", ["exit0", "die"])
def test_a_script_that_stops_on_the_notice_before_its_end_was_preempted(
    url_env: tuple[str, dict[str, str]], tmp_path: Path, on_term: str
) -> None:
    """Lightning without the callback exits 0 on SIGTERM; a Trainer without it dies of it:
    either way the run is not over (step 20 of 30) and resumes from checkpoint-20."""
    run = started(url_env, tmp_path / "out", "--done", "20", "--max", "30", "--on-term", on_term)
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 75, run.stderr()
    assert "before the trainer reached its end (step 20 of 30)" in run.stderr()
    line = [t for t in run.stderr().splitlines() if t.startswith("costguard: exit 75")]
    assert line, run.stderr()
    assert "newest checkpoint: step 20 (checkpoint-20 as ckpt-000000000020-" in line[0]
    assert "none yet" not in run.stderr()


def test_a_signal_after_the_work_was_done_is_not_a_failure(
    url_env: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    run = started(url_env, tmp_path / "out", "--done", "30", "--max", "30", "--on-term", "die")
    run.proc.send_signal(signal.SIGTERM)  # lands in teardown, after the final save
    assert run.finish() == 0, run.stderr()
    assert "work was done (step 30 of 30)" in run.stderr()
    assert "failed" not in run.stderr()
    assert "final checkpoint: step 30 (checkpoint-30 as ckpt-000000000030-" in run.stderr()


def test_a_script_that_ignores_the_notice_is_told_the_fix(
    url_env: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    run = started(url_env, tmp_path / "out", "--done", "10", "--max", "30", "--on-term", "ignore")
    assert run.proc.stderr is not None
    stderr = StreamLines(run.proc.stderr)
    # Each signal once the one before has had its effect (a signal sent while the same
    # one is pending is delivered once): the first SIGTERM reaches the script, which
    # ignores it; the second makes costguard say so; the first Ctrl-C reaches the script
    # as a relayed notice; the second stops it at once.
    run.proc.send_signal(signal.SIGTERM)
    run.read_until("TERM ignored".__eq__)
    run.proc.send_signal(signal.SIGTERM)
    stderr.wait_until("has not acted on the notice")
    run.proc.send_signal(signal.SIGINT)
    run.read_until("NOTICE".__eq__)
    run.proc.send_signal(signal.SIGINT)
    assert run.proc.wait(timeout=60) == 130
    said_all = stderr.text()
    run.finish()  # the rest of stdout; the pipes closed
    run.err = said_all
    said = [t for t in run.stderr().splitlines() if "has not acted on the notice" in t]
    assert len(said) == 1, run.stderr()
    assert "transformers.PreemptionCallback()" in said[0]


def test_the_fix_is_said_once_when_a_ctrl_c_comes_while_it_is_being_said(
    url_env: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """The second SIGTERM's handler is deciding whether the script ignored the first
    (and saying so) when a Ctrl-C's handler interrupts it with the same question: the
    line is said once, not by both."""
    run = started(url_env, tmp_path / "out", "--done", "10", "--max", "30", "--on-term", "ignore")
    assert run.proc.stderr is not None
    stderr = StreamLines(run.proc.stderr)
    run.proc.send_signal(signal.SIGTERM)
    run.read_until("TERM ignored".__eq__)
    run.proc.send_signal(signal.SIGTERM)  # passed on to the script, then the question
    run.read_until("TERM ignored".__eq__)
    run.proc.send_signal(signal.SIGINT)  # at once: while costguard may still be deciding
    run.read_until("NOTICE".__eq__)
    run.proc.send_signal(signal.SIGINT)
    assert run.proc.wait(timeout=60) == 130
    said_all = stderr.text()
    run.finish()
    said = [t for t in said_all.splitlines() if "has not acted on the notice" in t]
    assert len(said) == 1, said_all


def test_a_wrong_sync_dir_is_named_with_the_folder_the_trainer_writes(
    url_env: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """The script writes out/, costguard watches output/: said, naming both."""
    url, env = url_env
    out, wrong = tmp_path / "out", tmp_path / "output"
    command = [*costguard_command(), "run", "--checkpoint", url, "--sync-dir", str(wrong), "--"]
    command += [sys.executable, str(HERE / "notice_script.py"), "--out", str(out)]
    command += ["--done", "10", "--max", "30", "--on-term", "exit0"]
    run = Followed(command, env, 120, cwd=tmp_path)
    run.read_until(lambda line: line == "READY")
    run.proc.send_signal(signal.SIGTERM)
    run.finish()
    said = [t for t in run.stderr().splitlines() if "nothing appeared in --sync-dir" in t]
    assert len(said) == 1, run.stderr()
    assert str(wrong) in said[0]
    assert f"--sync-dir {out}" in said[0]
    assert not wrong.exists()  # made by costguard, left empty: not left behind


#: Started by the script, in its own session: once the script has exited, SIGTERM to
#: ``costguard run`` every 5 ms until it too has exited (20 s at most).
LATE_SIGNALS = """
import os, signal, sys, time
run, script = int(sys.argv[1]), int(sys.argv[2])
deadline = time.monotonic() + 20
def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
while alive(script) and time.monotonic() < deadline:
    time.sleep(0.002)
while alive(run) and time.monotonic() < deadline:
    os.kill(run, signal.SIGTERM)
    time.sleep(0.005)
"""
SCRIPT = f"""
import os, subprocess, sys
subprocess.Popen([sys.executable, "-c", {LATE_SIGNALS!r}, str(os.getppid()), str(os.getpid())],
                 start_new_session=True)
print("DONE", flush=True)
"""


def test_a_notice_after_the_script_ended_does_not_cut_costguards_report_short(
    url_env: tuple[str, dict[str, str]],
) -> None:
    """SIGTERMs that keep coming once the script has ended (a spot reclaim as the job
    finishes) reach ``costguard run`` while it says how the script ended and records it:
    it finishes that and exits 0, not killed by the signal (-15) half way."""
    url, env = url_env
    done = subprocess.run(
        [*costguard_command(), "run", "--checkpoint", url, "--", sys.executable, "-c", SCRIPT],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "DONE" in done.stdout
    assert "costguard: exit 0: the script finished" in done.stderr
