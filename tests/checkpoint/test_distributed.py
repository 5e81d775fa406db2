"""torch.distributed: the coordinated decision, the notice relay to every rank, and a real
2-process DDP run (torchrun, gloo, CPU) preempted three times through `costguard run` and
resumed to weights bitwise identical to an uninterrupted 2-process run (its ranks forked
from one interpreter by tests/helpers/ranks.py, as are the other runs outside `costguard
run`)."""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from costguard.checkpoint.agreement import Decision, decide, earliest, propose_sync
from costguard.checkpoint.distributed import (
    NoticeFileListener,
    append_notice,
    mark_preempted,
    pipe_is_ours,
    read_notices,
)
from costguard.checkpoint.notices import Notice, NoticeBoard
from costguard.checkpoint.state import for_rank
from costguard.checkpoint.supervisor import is_launcher
from tests.helpers.metadata import MetadataState
from tests.helpers.training import (
    RANKS,
    SCRIPTS,
    TORCHRUN,
    RankedJob,
    SharedRuns,
    assert_bitwise_equal,
    costguard_command,
    newest_manifest,
    ranks_reference,
    reached,
)
from tests.helpers.waiting import wait_for

DDP_SCRIPT = SCRIPTS / "ddp_train.py"
DECISION_SCRIPT = SCRIPTS / "ddp_decision.py"
STEPS = 30
TIMEOUT_S = 240

# -- the decision, without processes ----------------------------------------------------

flags = st.builds(
    Decision,
    emergency=st.booleans(),
    advisory=st.booleans(),
    scheduled=st.booleans(),
    next_sync=st.integers(1, 100),
)


@given(st.lists(flags, min_size=1, max_size=8))
def test_the_decision_is_what_any_rank_saw(ranks: list[Decision]) -> None:
    decision = decide([d.flags() for d in ranks])
    assert decision.emergency == any(d.emergency for d in ranks)
    assert decision.advisory == any(d.advisory for d in ranks)
    assert decision.scheduled == any(d.scheduled for d in ranks)
    assert decision.next_sync == min(d.next_sync for d in ranks)
    # The order of the ranks does not matter: every rank computes the same decision.
    assert decide([d.flags() for d in reversed(ranks)]) == decision


def test_one_rank_with_a_notice_stops_all() -> None:
    quiet = Decision(scheduled=False, next_sync=10)
    noticed = Decision(emergency=True, next_sync=10)
    assert decide([quiet.flags(), quiet.flags(), noticed.flags()]).action == "emergency"
    assert decide([quiet.flags(), quiet.flags()]).action == "none"
    assert decide([quiet.flags(), Decision(scheduled=True).flags()]).action == "save"
    with pytest.raises(ValueError, match="no ranks"):
        decide([])


def test_the_earliest_deadline_rules_and_sync_proposals() -> None:
    late, soon = Notice("aws", "terminate", 200.0), Notice("gcp", "preempt", 100.0)
    assert earliest([None, late, soon, Notice("signal", "signal", None)]) == soon
    assert earliest([None, None]) is None
    assert propose_sync(1.0, None) == 1  # slow steps: agree at every boundary
    assert propose_sync(0.001, None) == 100  # fast ones: about every 0.1 s, at most 100
    assert propose_sync(0.001, 3) == 3


def test_per_rank_state_goes_to_its_own_rank() -> None:
    saved = {
        "model": "replicated",
        "rng": "rng0",
        "loader": "pos0",
        "ranks": [{"rng": "rng0", "loader": "pos0"}, {"rng": "rng1", "loader": "pos1"}],
    }
    assert for_rank(saved, 1)["rng"] == "rng1"
    assert for_rank(saved, 1)["loader"] == "pos1"
    assert for_rank(saved, 1)["model"] == "replicated"
    assert for_rank({"rng": "r"}, 5) == {"rng": "r"}  # one process saved it
    with pytest.raises(KeyError, match="2 ranks"):
        for_rank(saved, 2)


# -- the relay to processes that do not inherit the pipe ----------------------------------


def test_the_notice_file_reaches_a_listener_whole_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "notices.jsonl"
    first = Notice("gcp", "preempt", 123.0, "x")
    append_notice(path, first)
    with path.open("a") as stream:
        stream.write('{"source": "aws", "kind": "term')  # a line still being written
    notices, offset = read_notices(path, 0)
    assert notices == [first]
    with path.open("a") as stream:
        stream.write('inate", "deadline_unix": null}\nnot json\n')
    notices, _ = read_notices(path, offset)
    assert notices == [Notice("aws", "terminate", None)]
    assert read_notices(tmp_path / "missing", 0) == ([], 0)

    board = NoticeBoard()
    listener = NoticeFileListener(tmp_path / "later.jsonl", board, interval_s=0.02)
    listener.start()
    try:
        wait_for(lambda: listener.polls >= 2, "two polls of the missing file", timeout_s=10)
        assert board.urgent() is None
        append_notice(tmp_path / "later.jsonl", Notice("signal", "signal", None, "SIGTERM"))
        notice = wait_for(board.urgent, "the appended notice", timeout_s=10, poll_s=0.02)
        assert notice == Notice("signal", "signal", None, "SIGTERM")
    finally:
        listener.stop()
        listener.join(5)


def test_only_the_direct_child_reads_the_pipe_and_launchers_are_recognised(
    tmp_path: Path,
) -> None:
    assert pipe_is_ours({"COSTGUARD_RUN_PID": str(os.getppid())})
    assert not pipe_is_ours({"COSTGUARD_RUN_PID": str(os.getpid())})
    assert is_launcher(["/venv/bin/torchrun", "--nproc-per-node", "2", "t.py"])
    assert is_launcher(["python3", "-X", "dev", "-m", "torch.distributed.run", "t.py"])
    assert not is_launcher(["python", "-m", "torch.distributed.other"])
    assert not is_launcher(["python", "train.py", "-m", "torchrun"])
    assert not is_launcher(["python", "-c", "import torchrun"])
    mark_preempted(tmp_path / "p.json", {"rank": 1, "ok": True})
    assert json.loads((tmp_path / "p.json").read_text()) == {"ok": True, "rank": 1}


# -- real process groups ------------------------------------------------------------------


def _results(folder: Path) -> dict[tuple[str, int], dict[str, object]]:
    found = {}
    for path in sorted(folder.glob("results-*.jsonl")):
        for line in path.read_text().splitlines():
            result = json.loads(line)
            found[(result["scenario"], result["rank"])] = result
    return found


@pytest.mark.slow
def test_two_ranks_save_together_when_one_gets_a_notice(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    done = subprocess.run(
        [*RANKS, "2", str(DECISION_SCRIPT), str(tmp_path)],
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = _results(tmp_path)
    assert len(results) == 4, results
    for scenario, stop in (("every", 5), ("sparse", 8)):
        ranks = [results[(scenario, r)] for r in (0, 1)]
        # The notice was on rank 1 only; both ranks stopped at the same step.
        assert [r["stopped_at"] for r in ranks] == [stop, stop], scenario
        assert all(r["start"] == stop + 1 for r in ranks)
        # Only rank 0 wrote.
        assert ranks[1]["results_on_this_rank"] == 0
        # Each rank got its own loader position and RNG stream back (and they differ).
        assert [r["restored_position"] for r in ranks] == [
            {"rank": 0, "taken": stop + 1},
            {"rank": 1, "taken": stop + 1},
        ]
        assert all(r["next_draw"] == r["expected_draw"] for r in ranks)
        assert ranks[0]["expected_draw"] != ranks[1]["expected_draw"]
    assert results[("every", 0)]["saved"] == [6]
    # Between agreements the step-count schedule still saved, on both ranks alike.
    assert results[("sparse", 0)]["saved"] == [3, 6, 9]
    assert results[("sparse", 0)]["results_on_this_rank"] == 3


def ddp_job(url: str, out: Path, env: dict[str, str]) -> RankedJob:
    """`costguard run -- torchrun --nproc-per-node 2 ddp_train.py`, its stdout followed."""
    return RankedJob(DDP_SCRIPT, 2, STEPS, url, out, env, timeout_s=TIMEOUT_S)


def _final(out: Path) -> dict[str, object]:
    return {
        "weights": torch.load(out, weights_only=True),
        "rank_states": [torch.load(f"{out}.rank{r}", weights_only=True) for r in (0, 1)],
    }


@pytest.mark.slow
def test_ddp_preempted_three_times_resumes_bitwise_identical(
    tmp_path: Path,
    shared_runs: SharedRuns,
    train_env: Callable[..., dict[str, str]],
    metadata_server: tuple[str, MetadataState],
    watched_env: Callable[[str], dict[str, str]],
) -> None:
    _, state = metadata_server
    env = watched_env("gcp")
    reference_out = ranks_reference(shared_runs, DDP_SCRIPT, 2, train_env(), "--steps", str(STEPS))

    seed = random.randrange(10**6)
    rng = random.Random(seed)
    url, out = str(tmp_path / "ckpt"), tmp_path / "resumed.pt"
    done = 0
    # 1: SIGTERM to `costguard run`, relayed to both ranks through the notice file.
    # 2: SIGUSR1 to rank 1's worker alone: a notice on one rank stops both.
    # 3: a GCP preemption notice seen by `costguard run`'s metadata watcher.
    for attempt, reason in (
        ("sigterm-to-costguard-run", "notice:signal-signal"),
        ("sigusr1-to-rank-1", "notice:signal-signal"),
        ("gcp-metadata", "notice:gcp-preempt"),
    ):
        job = ddp_job(url, out, env)
        target = done + rng.randint(2, 6)
        job.read_until(functools.partial(reached, step=target))
        ready = job.ready()
        assert {r: s for r, (_, s) in ready.items()} == {0: done, 1: done}, (seed, attempt)
        if attempt == "sigterm-to-costguard-run":
            job.proc.send_signal(signal.SIGTERM)
        elif attempt == "sigusr1-to-rank-1":
            os.kill(ready[1][0], signal.SIGUSR1)
        else:
            state.gcp_preempted = True
        code, err = job.finish(), job.stderr()
        state.gcp_preempted = False
        assert code == 75, (seed, attempt, job.lines[-4:], err[-3000:])
        newest = newest_manifest(url)
        # Zero lost steps: the emergency save holds every step any rank finished.
        assert newest["step"] >= job.last_step(), (seed, attempt)
        assert newest["reason"] == reason, (seed, attempt, newest)
        done = newest["step"]
    final = ddp_job(url, out, {**env, "COSTGUARD_CLOUD": "none"})
    code, err = final.finish(), final.stderr()
    assert code == 0, err[-3000:]
    assert {r: s for r, (_, s) in final.ready().items()} == {0: done, 1: done}
    assert_bitwise_equal(_final(out), _final(reference_out))


@pytest.mark.slow
@pytest.mark.parametrize("skip_restore", [False, True])
def test_a_sharded_state_costguard_cannot_save_is_refused_and_nothing_is_stored(
    tmp_path: Path, train_env: Callable[..., dict[str, str]], skip_restore: bool
) -> None:
    url = tmp_path / "ckpt"
    done = subprocess.run(
        [
            *RANKS, "2", str(SCRIPTS / "fsdp_refusal.py"), "--url", str(url),
            *(["--skip-restore"] if skip_restore else []),
        ],
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    refused = sorted(line for line in done.stdout.splitlines() if line.startswith("REFUSED"))
    assert [line.split()[1] for line in refused] == ["0", "1"], done.stdout + done.stderr[-2000:]
    assert "the extra state holds sharded tensors (FSDP2 / DTensor" in refused[0]
    assert "SAVED" not in done.stdout
    assert not list(url.glob("ckpt-*/*"))  # nothing stored: not half a checkpoint


@pytest.mark.slow
def test_a_rank_that_aborts_after_the_final_checkpoint_still_means_done(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    url = tmp_path / "ckpt"
    done = subprocess.run(
        [
            *costguard_command(), "run", "--checkpoint", str(url), "--every-steps", "4", "--",
            *TORCHRUN, "2", str(DDP_SCRIPT), "--steps", "6", "--out", str(tmp_path / "out.pt"),
            "--abort-after-close", "1",
        ],
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "after every rank had closed with its final checkpoint committed" in done.stderr
    assert "exit 0: the script finished; final checkpoint: step 6" in done.stderr
    # Without the final checkpoint, a crash is a failure: a rank that aborts mid-run.
    failing = subprocess.run(
        [
            *costguard_command(), "run", "--checkpoint", str(tmp_path / "other"), "--",
            sys.executable, "-c", "import os; os.abort()",
        ],
        env=train_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    assert failing.returncode == 134
    assert "the script failed" in failing.stderr
