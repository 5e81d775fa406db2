"""A trainer's pace (:mod:`costguard.integrations.pace`): what the callbacks report becomes
the same ``job/pace.json`` record the Checkpointer writes, its evaluations and saves
counted apart, written by ``costguard run`` from its events file. In-process: the
callbacks' own runs are in test_trainers.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from costguard.checkpoint.pace import WARMUP_STEPS, parse_pace, read_pace
from costguard.checkpoint.store import Store
from costguard.checkpoint.supervisor import Events
from costguard.integrations.pace import TrainerPace


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def trained(events: Path, clock: Clock, *, rank0: bool = True) -> TrainerPace:
    """30 steps of 0.5 s (loading its batch included); after steps 10 and 20 a 3 s
    evaluation and a 2 s save."""
    env = {"COSTGUARD_EVENTS_FILE": str(events)}
    pace = TrainerPace(env, clock=clock)
    pace.begin(rank0=rank0, total_steps=100, steps_per_epoch=25)
    clock.now += 40.0  # set-up before the first step: never a step's time
    for step in range(1, 31):
        clock.now += 0.5
        pace.step_end(step)
        if step in (10, 20):
            clock.now += 3.0
            pace.stalled("evaluation")
            clock.now += 2.0
            pace.stalled("save")
    pace.publish()
    return pace


def records(events: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in events.read_text().splitlines()]


def test_steps_evaluations_and_saves_are_counted_apart(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    trained(events, Clock())
    written = records(events)
    assert len(written) == 3  # after each save and at the end
    assert all(e["event"] == "pace" and e["record"] is True for e in written)
    pace = parse_pace(json.dumps(written[-1]).encode())
    assert pace is not None
    # The first step (from the process's start) and the warm-up are not measured.
    assert pace.warmup_steps == WARMUP_STEPS
    assert pace.steps_measured == 30 - 1 - WARMUP_STEPS
    assert pace.seconds_per_step == pytest.approx(0.5)
    assert (pace.outlier_steps, pace.outlier_s) == (0, 0.0)  # the stalls were said
    assert pace.evaluations == pace.saves == 2
    assert (pace.evaluation_s, pace.overhead_s) == pytest.approx((6.0, 4.0))
    assert (pace.steps_done, pace.total_steps, pace.steps_per_epoch) == (30, 100, 25)
    assert pace.wall_seconds_per_step == pytest.approx((24 * 0.5 + 6.0 + 4.0) / 24)


def test_a_stall_with_a_known_start_and_one_before_training(tmp_path: Path) -> None:
    clock = Clock()
    pace = TrainerPace({"COSTGUARD_EVENTS_FILE": str(tmp_path / "e")}, clock=clock)
    pace.begin(rank0=True, total_steps=-1, steps_per_epoch=float("inf"))  # type: ignore[arg-type]
    assert (pace.total_steps, pace.steps_per_epoch) == (None, None)  # Lightning's unknowns
    clock.now += 9.0
    pace.stalled("evaluation")  # a sanity check before the first step: not counted
    for step in range(1, 10):
        clock.now += 1.0
        pace.step_end(step)
    clock.now += 0.25  # the next batch loads: the step's time
    started = pace.now()
    clock.now += 4.0
    pace.stalled("evaluation", since=started)
    clock.now += 0.75
    pace.step_end(10)
    assert pace.evaluations == 1
    assert pace.evaluation_s == pytest.approx(4.0)
    assert pace.meter.seconds == pytest.approx(pace.meter.steps * 1.0)


def test_only_rank_0_under_costguard_run_tells(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    trained(events, Clock(), rank0=False)
    assert not events.exists()
    outside = TrainerPace({}, clock=Clock())
    outside.begin(rank0=True, total_steps=10, steps_per_epoch=None)
    outside.publish()
    assert not outside.active


def test_costguard_run_records_the_trainers_pace_in_the_store(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    trained(events, Clock())
    store = Store.open(tmp_path / "ckpt")
    said: list[str] = []
    followed = Events(events, quiet=False, say=said.append, store=store)
    followed.start()
    followed.stop()  # reads the whole file
    recorded = read_pace(store)
    assert recorded == parse_pace(json.dumps(records(events)[-1]).encode())
    # 70 steps of 0.5 s, and the evaluations' and saves' 10 s per 12 s of steps with them.
    assert said[-1] == "step 30 of 100 (30%) at 0.5 s/step: finish in 1 min 4 s"
    # The Checkpointer writes its own record: its events are not written again.
    own = {k: v for k, v in records(events)[-1].items() if k != "record"}
    other = Store.open(tmp_path / "other")
    Events(tmp_path / "none", quiet=True, say=said.append, store=other)._show(own)
    assert read_pace(other) is None


def test_a_pilot_stops_the_trainer_once_its_pace_is_recorded(tmp_path: Path) -> None:
    from costguard.checkpoint.checkpointer import PilotDone

    events, clock = tmp_path / "events.jsonl", Clock()
    env = {"COSTGUARD_EVENTS_FILE": str(events), "COSTGUARD_PILOT_STEPS": "12"}
    pace = TrainerPace(env, clock=clock)
    pace.begin(rank0=True, total_steps=1000, steps_per_epoch=100)
    for step in range(1, 12):
        clock.now += 0.5
        pace.step_end(step)
    clock.now += 0.5
    with pytest.raises(PilotDone) as stopped:
        pace.step_end(12)
    assert stopped.value.code == 0  # the script was only measured
    recorded = parse_pace(json.dumps(records(events)[-1]).encode())
    assert recorded is not None
    assert (recorded.pilot, recorded.steps_done, recorded.steps_per_epoch) == (True, 12, 100)
