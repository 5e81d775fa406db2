"""The Checkpointer's measured pace (``job/pace.json``): what it counts, what it leaves out,
when it is written, and how a pilot stops the script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from costguard.checkpoint import Checkpointer
from costguard.checkpoint.checkpointer import PilotDone
from costguard.checkpoint.pace import (
    PACE_FILE,
    WARMUP_STEPS,
    Pace,
    PaceError,
    PaceMeter,
    parse_pace,
    read_pace,
    write_pace,
)
from costguard.checkpoint.store import Store
from costguard.errors import InputError


class FakeClock:
    """The Checkpointer's clock, moved by the test (time inside step() stands still)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def train(
    ckpt: Checkpointer, clock: FakeClock, steps: int, *, slow: frozenset[int] = frozenset()
) -> None:
    model = torch.nn.Linear(2, 2)
    for step in range(steps):
        clock.now += 5.0 if step in slow else 0.5  # an evaluation on the slow steps
        ckpt.step(step, model=model)


def test_meter_leaves_out_warmup_slow_steps_and_time_inside_step() -> None:
    meter = PaceMeter(warmup=2)
    now = 0.0
    for step in range(20):
        meter.lap(now, step + 1)
        now += 30.0 if step == 5 else 7.0  # inside step(): a save's stall; step 6's the first
        meter.resume(now, setup=step == 5)
        now += 20.0 if step == 10 else 1.0  # step 11 is an evaluation
    assert meter.laps == 20
    assert meter.warmup_steps == 2
    assert meter.outlier_steps == 1
    assert meter.steps == 20 - 1 - 2 - 1
    assert meter.seconds == pytest.approx(meter.steps * 1.0)
    # Counted from the step that ended the warm-up; the first save's set-up apart.
    assert meter.setup_s == 30.0
    assert meter.overhead_s == pytest.approx(7.0 * (20 - 2 - 1))


def test_checkpointer_records_the_pace_with_total_steps(tmp_path: Path) -> None:
    clock = FakeClock()
    ckpt = Checkpointer(tmp_path, every_steps=10, total_steps=500, clock=clock)
    train(ckpt, clock, 40, slow=frozenset({20}))
    ckpt.close()
    pace = read_pace(Store.open(str(tmp_path)))
    assert pace is not None
    assert pace.steps_done == 40
    assert pace.total_steps == 500
    assert pace.warmup_steps == WARMUP_STEPS
    assert pace.outlier_steps == 1
    assert pace.steps_measured == 40 - 1 - WARMUP_STEPS - 1
    assert pace.seconds_per_step == pytest.approx(0.5)
    assert pace.saves == 4  # steps 10, 20, 30, 40 (the last the schedule's, not a final)
    assert pace.device == "cpu"
    assert not pace.pilot


def test_pace_is_written_after_a_save_while_training(tmp_path: Path) -> None:
    clock = FakeClock()
    ckpt = Checkpointer(tmp_path, every_steps=10, clock=clock)
    train(ckpt, clock, 12)
    ckpt.flush()
    ckpt._saver.background(lambda: None)  # queued behind the pace write
    ckpt._saver.shutdown(wait=True)
    pace = read_pace(Store.open(str(tmp_path)))
    assert pace is not None
    assert pace.steps_done in (10, 11, 12)
    assert pace.total_steps is None


def test_pilot_stops_the_script_after_its_steps_with_the_pace_recorded(tmp_path: Path) -> None:
    clock = FakeClock()
    ckpt = Checkpointer.from_env(
        env={
            "COSTGUARD_CHECKPOINT_URL": str(tmp_path),
            "COSTGUARD_PILOT_STEPS": "30",
            "COSTGUARD_TOTAL_STEPS": "9000",
        },
        watch=False,
        clock=clock,
    )
    with pytest.raises(PilotDone) as stopped:
        train(ckpt, clock, 1000)
    assert stopped.value.code == 0
    pace = read_pace(Store.open(str(tmp_path)))
    assert pace is not None
    assert pace.pilot
    assert pace.steps_done == 30
    assert pace.steps_measured == 30 - 1 - WARMUP_STEPS
    assert pace.total_steps == 9000


@pytest.mark.parametrize("name", ["COSTGUARD_PILOT_STEPS", "COSTGUARD_TOTAL_STEPS"])
@pytest.mark.parametrize("value", ["x", "0", "-3"])
def test_bad_step_counts_are_refused(tmp_path: Path, name: str, value: str) -> None:
    with pytest.raises(InputError):
        Checkpointer.from_env(
            env={"COSTGUARD_CHECKPOINT_URL": str(tmp_path), name: value}, watch=False
        )


def test_records_not_ours_are_refused_missing_is_none(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path))
    assert read_pace(store) is None
    good = json.loads(Pace(20, 10.0, 25, 2.0, 1.0).to_json())
    for bad in (
        {**good, "steps_measured": -1},
        {**good, "seconds_measured": "10"},
        {**good, "updated_unix": float("inf")},
        {**good, "total_steps": 1.5},
        {**good, "pilot": "yes"},
        {**good, "version": 2},
    ):
        assert parse_pace(json.dumps(bad).encode()) is None
        store.put(PACE_FILE, json.dumps(bad).encode())
        with pytest.raises(PaceError):
            read_pace(store)
    store.put(PACE_FILE, b"x" * (65 * 1024))
    with pytest.raises(PaceError):
        read_pace(store)
    write_pace(store, Pace(20, 10.0, 25, 2.0, 1.0, device="d" * 500))
    pace = read_pace(store)
    assert pace is not None
    assert len(pace.device) == 200


def test_costguard_run_says_the_finish_time_when_the_total_is_known(tmp_path: Path) -> None:
    from costguard.checkpoint.supervisor import Events

    said: list[str] = []
    events = Events(tmp_path / "events.jsonl", quiet=False, say=said.append)
    pace = json.loads(Pace(100, 50.0, 120, 2.0, 1.0, overhead_s=5.0, total_steps=1000).to_json())
    events._show({"event": "pace", **pace})
    events._show({"event": "pace", **pace, "total_steps": None})  # no total: nothing to say
    assert said == ["step 120 of 1000 (12%) at 0.5 s/step: finish in 8 min 4 s"]
