"""Notices that arrive while a step runs: saved at the next boundary, within the deadline;
a step that would overrun the deadline can be abandoned; `save_now` between steps; the
record `costguard run` reads after a launcher turned the ranks' 75 into its own failure."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from costguard.checkpoint import Checkpointer, Preempted
from costguard.checkpoint.notices import Notice, NoticeBoard
from tests.helpers.training import costguard_command, run_python

MICRO_BATCHES = 5


def tiny() -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def micro_batch(model: torch.nn.Module) -> None:
    model(torch.randn(3, 4)).pow(2).sum().backward()


def long_steps(
    ckpt: Checkpointer,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    during: Callable[[int, int], None],
    *,
    micro_batch_s: float = 0.0,
) -> list[int]:
    """Train steps of several micro-batches; ``during(step, i)`` runs before each one."""
    started = []
    for step in range(10):
        started.append(step)
        for i in range(MICRO_BATCHES):
            during(step, i)
            time.sleep(micro_batch_s)
            micro_batch(model)
        opt.step()
        opt.zero_grad()
        ckpt.step(step, model=model, optimizer=opt)
    return started


def test_a_notice_during_a_long_step_saves_at_the_next_boundary(tmp_path: Path) -> None:
    board = NoticeBoard()
    model, opt = tiny()
    ckpt = Checkpointer(tmp_path, every_steps=100, notices=board)
    deadline = time.time() + 60
    notice = Notice("gcp", "preempt", deadline)
    seen: list[tuple[int, int]] = []

    def during(step: int, i: int) -> None:
        seen.append((step, i))
        if (step, i) == (2, 1):
            board.post(notice)  # mid-step: this step still finishes

    with pytest.raises(Preempted) as info:
        long_steps(ckpt, model, opt, during)
    assert seen[-1] == (2, MICRO_BATCHES - 1)  # step 2 ran to its end, step 3 never began
    result = info.value.result
    assert result is not None
    assert result.ok
    assert (result.step, result.reason) == (3, "notice:gcp-preempt")
    assert info.value.notice == notice
    assert ckpt.deadline == deadline
    left = ckpt.time_left()
    assert left is not None
    assert 0 < left <= 60
    assert Checkpointer(tmp_path).restore(model=tiny()[0]) == 3


def test_a_step_that_would_overrun_the_deadline_is_abandoned(tmp_path: Path) -> None:
    """The loop checks time_left between micro-batches and gives the step up: the resume
    starts from the last durable checkpoint and nothing half-written is left as latest."""
    board = NoticeBoard()
    model, opt = tiny()
    ckpt = Checkpointer(tmp_path, every_steps=2, notices=board, keep_last=5)
    micro_batch_s = 0.3

    def during(step: int, i: int) -> None:
        if (step, i) == (2, 1):
            # 2 s left, but the rest of this step needs 4 x 0.3 s plus a save.
            board.post(Notice("azure", "preempt", time.time() + 2))
        left = ckpt.time_left()
        if left is not None and left < (MICRO_BATCHES - i) * micro_batch_s + 1.0:
            ckpt.abandon_step()

    with pytest.raises(Preempted) as info:
        long_steps(ckpt, model, opt, during, micro_batch_s=micro_batch_s)
    notice = info.value.notice
    assert notice.source == "azure"
    assert notice.deadline_unix is not None
    assert time.time() < notice.deadline_unix  # it stopped before the machine went away
    # The last durable save is the scheduled one after 2 steps; step 3 was never saved.
    result = info.value.result
    assert result is not None
    assert (result.step, result.ok) == (2, True)
    saved = [p.parent.name[5:17] for p in tmp_path.glob("ckpt-*/manifest.json")]
    assert saved == ["000000000002"]
    assert Checkpointer(tmp_path).restore(model=tiny()[0]) == 2


def test_past_the_deadline_the_boundary_save_is_still_tried_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    board = NoticeBoard()
    model, opt = tiny()
    ckpt = Checkpointer(tmp_path, notices=board, exit_on_notice=False)
    board.post(Notice("aws", "terminate", time.time() - 1))  # the step overran it
    with caplog.at_level(logging.WARNING):
        assert ckpt.step(6, model=model, optimizer=opt) is True
    ckpt.close()
    assert [(r.step, r.ok) for r in ckpt.results] == [(7, True)]
    assert "after the notice's deadline" in caplog.text
    left = ckpt.time_left()
    assert left is not None
    assert left < 0


def test_save_now_between_steps(tmp_path: Path) -> None:
    model, opt = tiny()
    ckpt = Checkpointer(tmp_path, notices=NoticeBoard())
    assert ckpt.preempting is None
    assert ckpt.time_left() is None
    assert ckpt.deadline is None
    ckpt.board.post(Notice("signal", "signal", None, "SIGTERM"))
    assert ckpt.time_left() == float("inf")
    with pytest.raises(Preempted) as info:
        ckpt.save_now(11, model=model, optimizer=opt)  # e.g. in the middle of evaluation
    assert info.value.result is not None
    assert (info.value.result.step, info.value.result.reason) == (12, "notice:signal-signal")
    # Without a notice it is a save-and-stop on demand.
    other = Checkpointer(tmp_path / "b", exit_on_notice=False)
    assert other.save_now(0, model=model) is True
    other.close()
    assert [(r.step, r.reason) for r in other.results] == [(1, "notice:demand-stop")]


def test_the_preempted_record_turns_a_launcher_failure_into_75(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    """torchrun exits 1 when its workers exit 75; the workers' record says why."""
    child = (
        "import sys\n"
        "from costguard.checkpoint import Checkpointer\n"
        "from costguard.checkpoint.notices import Notice\n"
        "ckpt = Checkpointer.from_env()\n"
        "ckpt.board.post(Notice('signal', 'signal', None, 'test'))\n"
        "try:\n"
        "    ckpt.step(0)\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 75\n"
        "sys.exit(1)  # what torchrun does with its workers' 75\n"
    )
    for script, expected in ((child, 75), ("import sys; sys.exit(1)", 1)):
        done = subprocess.run(
            run_python(tmp_path / "c", script),
            env=train_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == expected, done.stderr
        assert ("reporting 75" in done.stderr) == (expected == 75)


def test_relayed_signals_reach_a_process_that_only_polls_the_notice_file(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    """With --signals relay (auto for torchrun) SIGUSR1 becomes a notice in the file,
    and is not delivered to the command (which SIGUSR1 would kill)."""
    child = (
        "import os, sys, time\n"
        "from costguard.checkpoint.distributed import read_notices\n"
        "path = os.environ['COSTGUARD_NOTICE_FILE']\n"
        "print('up', flush=True)\n"
        "for _ in range(600):\n"
        "    notices, _ = read_notices(path, 0)\n"
        "    if notices:\n"
        "        print(notices[0].detail, flush=True)\n"
        "        sys.exit(3)\n"
        "    time.sleep(0.05)\n"
    )
    run = [*costguard_command(), "run", "--checkpoint", str(tmp_path / "c"), "--signals", "relay"]
    proc = subprocess.Popen(
        [*run, "--", sys.executable, "-c", child],
        env=train_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "up"
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=60) == 3  # SIGUSR1's default action would have given 138
    assert proc.stdout.read().strip() == "SIGUSR1"
    proc.stdout.close()
