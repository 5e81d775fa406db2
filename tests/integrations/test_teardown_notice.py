"""A notice that reaches a script after its work is done (issue 45): an Accelerate loop
whose last ``save_state`` is its final step, shutting down (``end_training``, a tracker's
flush) when ``costguard run`` passes on a SIGTERM. costguard's handler turns the signal into
a notice the script never looks at again, and the script exits 0 by itself: that is its
own end, not a preemption. It was reported 75 ("saved on a notice, run the same command to
resume") every time, and a relaunch resumed at the same final checkpoint, ended in the
same teardown, and was relaunched again (7 times in one randomized trial).

Real processes, real signals, a local and an S3 (moto) store. A script that did look at the
notice and left its loop early is still preempted.
"""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers.training import Followed, costguard_command
from tests.helpers.waiting import wait_for
from tests.integrations.test_exit_truth import url_env
from tests.integrations.test_trainers import kept

__all__ = ["url_env"]  # the store fixture (local, s3), shared with the exit-line tests

HERE = Path(__file__).parent
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def accelerate(
    url_env: tuple[str, dict[str, str]], tmp_path: Path, *args: str, run_args: tuple[str, ...] = ()
) -> Followed:
    """``costguard run --sync-dir out/ RUN_ARGS -- python accelerate_train.py ARGS``: 20
    steps, a save every 10."""
    url, env = url_env
    out = tmp_path / "out"
    command = [*costguard_command(), "run", "--checkpoint", url, "--sync-dir", str(out)]
    command += [*run_args, "--"]
    command += [sys.executable, str(HERE / "accelerate_train.py"), "--out", str(out)]
    command += ["--final", str(tmp_path / "final.pt"), "--steps", "20", *args]
    return Followed(command, env, 300)


def test_a_notice_in_an_accelerate_scripts_teardown_ends_the_run(
    url_env: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    first = accelerate(url_env, tmp_path, "--teardown-s", "2")
    first.read_until(lambda line: line == "DONE")
    first.proc.send_signal(signal.SIGTERM)  # the script is in its teardown
    assert first.finish() == 0, first.stderr()[-3000:]
    assert "never looked at the notice" in first.stderr(), first.stderr()[-3000:]
    assert "final checkpoint: step 20 (checkpoint_20 as ckpt-000000000020-" in first.stderr()
    # The same command on a new machine (as a launcher relaunching a 75 would): it resumes
    # at the final checkpoint, has no step left, and a notice in its teardown ends it too.
    shutil.rmtree(tmp_path / "out")
    again = accelerate(url_env, tmp_path, "--teardown-s", "2")
    assert again.read_until(lambda line: line.startswith("READY")) == "READY 20"
    again.read_until(lambda line: line == "DONE")
    again.proc.send_signal(signal.SIGTERM)
    assert again.finish() == 0, again.stderr()[-3000:]
    assert "saved on a notice" not in again.stderr()


@pytest.mark.parametrize("url_env", ["local"], indirect=True)  # the store plays no part
def test_an_accelerate_script_that_left_its_loop_on_the_notice_was_preempted(
    url_env: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """It read the notice and stopped early without a save, then exited 0 as if done: its
    exit 0 is the notice's doing, so the run is resumable from checkpoint_10 (75)."""
    run = accelerate(url_env, tmp_path, "--on-notice", "break", "--sleep", "0.2")
    run.read_until(lambda line: line == "STEP 12")
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 75, run.stderr()[-3000:]
    assert "DONE" in run.lines  # the script itself thought it had finished
    assert "newest checkpoint: step 10 (checkpoint_10 as ckpt-000000000010-" in run.stderr()


def test_a_loop_without_the_helper_killed_in_its_teardown_ends_at_its_total_steps(
    url_env: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """No ``notice()``: SIGTERM ends the script in its teardown (exit 143), and nothing in
    an Accelerate folder says where the run ends; ``--total-steps 20`` does, and the
    store's newest checkpoint is step 20: done, 0, also for the relaunch that resumes
    there (without it such a run is 75 on every notice: costguard cannot tell)."""
    args = ("--on-notice", "none", "--teardown-s", "30")
    for ready in ("READY 0", "READY 20"):
        run = accelerate(url_env, tmp_path, *args, run_args=("--total-steps", "20"))
        assert run.read_until(lambda line: line.startswith("READY")) == ready
        run.read_until(lambda line: line == "DONE")
        # Once checkpoint_20 is in the store (one killed within its last moments may lack
        # Accelerate's registered objects, and is not kept).
        wait_for(lambda: kept(url_env[0])[-1:] == [(20, "checkpoint_20")], "checkpoint_20")
        run.proc.send_signal(signal.SIGTERM)
        assert run.finish() == 0, run.stderr()[-3000:]
        assert "checkpoint_20, is step 20 of --total-steps 20" in run.stderr()
        shutil.rmtree(tmp_path / "out")  # a new machine
