"""`costguard launch --provider local --total-steps N`: the projected total, read at a
quarter of the steps, against the job's final cost; and `--stop-at-projection` stopping a
job whose projection passes `--max-total` with a committed checkpoint and exit 75. A real
training loop (tests/checkpoint/steady_script.py) under `costguard run`, on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest

from costguard.checkpoint.inventory import inventory
from costguard.checkpoint.pace import read_pace
from costguard.checkpoint.store import Store
from costguard.errors import CostguardError
from costguard.spot.job import load_job
from costguard.spot.projection import of_job
from tests.helpers.waiting import wait_for

STEADY = Path(__file__).parents[1] / "checkpoint" / "steady_script.py"
TIMEOUT_S = 600


def launch(ckpt: Path, total: int, sleep: float, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "costguard", "launch", "--provider", "local", "--gpu", "a10g",
        "--on-demand", "--checkpoint", str(ckpt), "--every-steps", "20", "--total-steps",
        str(total), "--poll-seconds", "0.2", "--yes", "--format", "json", *extra, "--",
        sys.executable, str(STEADY), "--steps", str(total), "--sleep", str(sleep),
    ]  # fmt: skip


def finished(
    ckpt: Path, total: int, sleep: float, env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    """The launch run to its end."""
    command = launch(ckpt, total, sleep, *extra)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


@pytest.mark.slow
def test_projection_at_a_quarter_is_within_15_percent_of_the_final_cost(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    # 25 s of training: on a busy 2-core machine the start-up (before the quarter, so in
    # the money spent) took 24 s and the wind-down after the last step (final save, exit:
    # not projected) 4 s.
    ckpt, total = tmp_path / "ckpt", 1000
    proc = subprocess.Popen(
        launch(ckpt, total, 0.025), env=spot_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        store = Store.open(str(ckpt))

        def projected_at_a_quarter() -> tuple[Decimal] | None:
            try:
                pace = read_pace(store)
                job = load_job(store)
            except CostguardError:
                return None
            if pace is None or pace.steps_done < total // 4:
                return None
            assert pace.steps_done <= total // 2, "the quarter was read too late"
            projection = of_job(job, pace, time.time())
            assert projection is not None
            assert projection.projected_total_usd is not None
            return (projection.projected_total_usd,)

        def launching() -> None:
            if proc.poll() is not None:
                _, err = proc.communicate()
                raise AssertionError(f"the launch ended first: {err[-3000:]!r}")

        (projected,) = wait_for(
            projected_at_a_quarter, "a quarter of the steps", timeout_s=TIMEOUT_S, poll_s=0.1,
            alive=launching,
        )  # fmt: skip
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    final = Decimal(json.loads(out)["summary"]["cost_usd"])
    print(f"projected at 25%: {projected}, final: {final}")
    assert abs(projected - final) / final <= Decimal("0.15")
    assert json.loads(out)["projection"]["steps_done"] == total


@pytest.mark.slow
def test_stop_at_projection_saves_and_exits_75_before_the_limit_is_spent(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    # 10**6 steps of 10 ms are 2.8 h at $1.006/h: past $1.10 long before the end.
    ckpt = tmp_path / "ckpt"
    stop = ("--max-total", "1.10", "--stop-at-projection")
    result = finished(ckpt, 10**6, 0.01, spot_env(), *stop)
    assert result.returncode == 75, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    assert doc["status"] == "stopped"
    assert doc["reason"].startswith("stopped at the projection: projected total $")
    assert Decimal(doc["summary"]["cost_usd"]) < Decimal("0.05")  # far from $1.10
    assert [a["exit_code"] for a in doc["attempts"]] == [75]
    latest = next(e for e in inventory(Store.open(str(ckpt)), verify_latest=True) if e.latest)
    assert latest.reason == "notice:costguard-stop"
    assert 0 < latest.step < 10**6
    assert "passes --max-total $1.10" in result.stderr


@pytest.mark.slow
def test_a_pilot_under_launch_prints_the_estimate_of_the_whole_run(
    tmp_path: Path, spot_env: Callable[..., dict[str, str]]
) -> None:
    ckpt = tmp_path / "ckpt"
    result = finished(ckpt, 1000, 0.01, spot_env(), "--pilot-steps", "30")
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)  # costguard pilot's answer, for the launched GPU
    assert doc["query"]["gpus"] == ["A10G"]
    source = doc["query"]["hours_from"]
    assert (source["pilot"], source["steps"], source["measured_on"]) == (True, 1000, "A10G")
    store = Store.open(str(ckpt))
    pace = read_pace(store)
    assert pace is not None
    assert pace.steps_done == 30  # the script was stopped after its pilot steps
    assert load_job(store).status == "succeeded"
    assert f"pilot job {load_job(store).spec.job_id} succeeded after 30 steps" in result.stderr
