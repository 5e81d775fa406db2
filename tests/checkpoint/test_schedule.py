"""Schedules and the Young/Daly interval helper."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costguard.checkpoint.schedule import Schedule, suggest_interval_s, young_daly_interval_s
from costguard.errors import InputError


def test_every_steps_saves_at_multiples_even_after_a_resume() -> None:
    s = Schedule(every_steps=5)
    saved, last = [], 7  # resumed from a save at step 7 (e.g. an emergency save)
    for n in range(8, 21):
        if s.due(steps_done=n, now_s=0, last_steps_done=last, last_save_s=0):
            saved.append(n)
            last = n
    assert saved == [10, 15, 20]


def test_every_minutes_uses_the_clock() -> None:
    s = Schedule(every_minutes=2)
    assert not s.due(steps_done=3, now_s=119, last_steps_done=0, last_save_s=0)
    assert s.due(steps_done=3, now_s=120, last_steps_done=0, last_save_s=0)
    assert not s.due(steps_done=0, now_s=999, last_steps_done=0, last_save_s=0)


def test_no_schedule_means_on_demand_only() -> None:
    assert not Schedule().due(steps_done=10**6, now_s=10**9, last_steps_done=0, last_save_s=0)


@pytest.mark.parametrize(
    "kwargs", [{"every_steps": 0}, {"every_minutes": -1.0}, {"every_minutes": math.nan}]
)
def test_bad_schedules_are_input_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(InputError):
        Schedule(**kwargs)  # type: ignore[arg-type]


@given(st.floats(0.01, 1000), st.floats(60, 10**6))
def test_young_daly_is_near_young_for_cheap_saves_and_capped(c: float, m: float) -> None:
    t = young_daly_interval_s(c, m)
    assert 0 < t <= m
    if c < m / 100:
        assert abs(t - math.sqrt(2 * c * m)) / math.sqrt(2 * c * m) < 0.1


def test_suggest_interval_never_faster_than_a_save() -> None:
    assert suggest_interval_s(stall_s=0.1, save_s=500, interruptions_per_hour=1) == 500
    with pytest.raises(InputError):
        suggest_interval_s(stall_s=0.1, save_s=1, interruptions_per_hour=0)
    with pytest.raises(InputError):
        young_daly_interval_s(0, 10)
