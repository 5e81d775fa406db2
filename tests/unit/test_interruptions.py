"""The spot preemption model (costguard.pricing.interruptions): its properties, and a
simulation of preemptions that it must predict."""

from __future__ import annotations

import math
import random
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costguard.errors import InputError
from costguard.pricing.interruptions import (
    Checkpointing,
    expected,
    poisson_quantile,
    young_daly_hours,
)

RUNS = 200
#: A bound on the preemptions of one simulated run (the loop never runs away).
MAX_ATTEMPTS = 100_000

hours = st.decimals(min_value="0.1", max_value="5000", places=2)
every_minutes = st.decimals(min_value="1", max_value="240", places=1)
save_seconds = st.decimals(min_value="0", max_value="1800", places=0)
restart_minutes = st.decimals(min_value="0", max_value="60", places=1)
per_day = st.decimals(min_value="0", max_value="10", places=2)


def simulate_overhead(
    work: float, every: float, save_h: float, restart_h: float, per_hour: float, rng: random.Random
) -> float:
    """One run under preemptions that arrive as a Poisson process of ``per_hour``.

    The job works ``every`` hours, then saves for ``save_h`` (the checkpoint is committed
    at the end of the save), until ``work`` hours of work are done. A preemption throws
    away what was done since the last committed checkpoint, then ``restart_h`` passes
    before it resumes from that checkpoint. Returns the hours beyond ``work``.
    """
    done = 0.0
    wall = 0.0
    cycle = every + save_h
    for _ in range(MAX_ATTEMPTS):
        remaining = work - done
        saves = math.ceil(remaining / every - 1e-9)
        needed = remaining + saves * save_h
        gap = rng.expovariate(per_hour)
        if gap >= needed:
            return wall + needed - work
        done += min(math.floor(gap / cycle) * every, remaining)
        wall += gap + restart_h
    raise AssertionError("the simulated run did not finish")


def mean_overhead(
    work: float, every: float, save_h: float, restart_h: float, per_hour: float
) -> float:
    """Mean overhead over RUNS runs; the same seed for every interval (common random
    numbers), so that a sweep compares intervals rather than luck."""
    rng = random.Random(30)
    runs = [simulate_overhead(work, every, save_h, restart_h, per_hour, rng) for _ in range(RUNS)]
    return sum(runs) / RUNS


@given(hours, every_minutes, save_seconds, restart_minutes, per_day)
def test_overhead_lies_within_its_range_and_the_run_only_gets_longer(
    work: Decimal, every_min: Decimal, save_s: Decimal, restart_min: Decimal, daily: Decimal
) -> None:
    c = Checkpointing(every_min, save_s, restart_min, daily)
    every, save_h, per_hour = c.interval_hours, c.save_hours, c.preemptions_per_hour
    try:
        e = expected(work, c)
    except InputError:
        assert per_hour * (every + save_h) / 2 >= 1  # refused only when it never finishes
        return
    assert e.effective_hours >= work
    assert e.overhead_low_hours <= e.overhead_high_hours
    assert e.overhead_low_hours >= work * save_h / every
    if e.expected_preemptions >= Decimal("0.06"):  # below, the 95th percentile is 0
        assert e.overhead_low_hours <= e.overhead_hours <= e.overhead_high_hours
    more = expected(work, Checkpointing(every_min, save_s, restart_min + 1, daily))
    assert more.effective_hours >= e.effective_hours
    if per_hour == 0:
        assert e.expected_preemptions == 0
        assert e.suggested_interval_hours is None
        assert e.effective_hours == work * (1 + save_h / every)


@given(
    st.decimals(min_value="0", max_value="0.5", places=3),
    st.decimals(min_value="0.001", max_value="0.4", places=3),
)
def test_young_daly_minimises_the_first_order_overhead(save_h: Decimal, per_hour: Decimal) -> None:
    best = young_daly_hours(save_h, per_hour)
    assert best is not None

    def first_order(every: Decimal) -> Decimal:
        return save_h / every + per_hour * every / 2

    for factor in (Decimal("0.5"), Decimal("0.9"), Decimal("1.1"), Decimal(2)):
        if best > 0:
            assert first_order(best) <= first_order(best * factor) + Decimal("1e-20")
    assert best * best == pytest.approx(2 * save_h / per_hour)


@given(st.decimals(min_value="0", max_value="500", places=2), st.sampled_from([0.05, 0.5, 0.95]))
def test_poisson_quantile_is_the_smallest_count_reaching_the_probability(
    mean: Decimal, probability: float
) -> None:
    k = poisson_quantile(mean, probability)
    lam = float(mean)

    def cdf(n: int) -> float:
        if lam == 0:
            return 1.0
        return sum(math.exp(i * math.log(lam) - lam - math.lgamma(i + 1)) for i in range(n + 1))

    assert cdf(k) >= probability - 1e-9
    assert k == 0 or cdf(k - 1) < probability + 1e-9


def test_simulated_mean_overhead_lies_within_the_stated_range() -> None:
    work, every, save_h, restart_h, per_hour = 100, 1.0, 5 / 60, 5 / 60, 0.1
    e = expected(
        Decimal(work),
        Checkpointing(Decimal(60), Decimal(300), Decimal(5), Decimal("2.4")),
    )
    measured = mean_overhead(work, every, save_h, restart_h, per_hour)
    assert float(e.overhead_low_hours) <= measured <= float(e.overhead_high_hours)
    # and far closer than the range: the expectation itself, within 5%
    assert measured == pytest.approx(float(e.overhead_hours), rel=0.05)


def test_suggested_interval_is_within_20_percent_of_the_best_swept() -> None:
    work, save_h, restart_h, per_hour = 1000, 5 / 60, 5 / 60, 0.1
    suggested = young_daly_hours(Decimal(5) / 60, Decimal("0.1"))
    assert suggested is not None
    sweep = [round(0.4 + 0.1 * i, 2) for i in range(27)]  # 0.4 h to 3 h
    overheads = {t: mean_overhead(work, t, save_h, restart_h, per_hour) for t in sweep}
    best = min(overheads, key=overheads.__getitem__)
    assert sweep[0] < best < sweep[-1]  # a real minimum, inside the sweep
    assert float(suggested) == pytest.approx(best, rel=0.20)
