"""The idle rule and the reap plan, rule by rule (pure functions, no mocks)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from costguard.errors import InputError
from costguard.reaper.policy import (
    Action,
    IdlePolicy,
    IdleVerdict,
    Instance,
    InstanceSamples,
    ReapLimits,
    Reason,
    Sample,
    Signal,
    format_timestamp,
    judge_idle,
    parse_protect_tag,
    parse_timestamp,
    plan_reap,
)
from costguard.tags import EXPIRES_TAG, KEEP_TAG, MARK_TAG

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
#: 60 min window, 5-minute samples stamped at the start of their period, 30 min grace,
#: stop; the newest CPU/network period may end 10 min before now, the newest GPU one 3 min.
POLICY = IdlePolicy()


def box(**changes: Any) -> Instance:
    base = Instance(
        "aws",
        "us-east-1",
        "i-1",
        "g5.xlarge",
        running=True,
        gpu_count=1,
        launched_at=NOW - timedelta(hours=4),
        protected=False,
        usd_per_hour=Decimal("1.006"),
    )
    return replace(base, **changes)


def series(value: float = 1.0, *, minutes: int = 60, step: int = 5) -> tuple[Sample, ...]:
    return tuple(Sample(NOW - timedelta(minutes=m), value) for m in range(0, minutes + 1, step))


def quiet(instance: Instance | None = None, **changes: Any) -> InstanceSamples:
    samples = InstanceSamples(instance or box(), gpu=series(), cpu=series(), network=series(0.1))
    return replace(samples, **changes)


def judge(samples: InstanceSamples, **policy: Any) -> IdleVerdict:
    return judge_idle(samples, replace(POLICY, **policy), NOW)


def test_an_idle_instance_is_stopped_with_its_peaks_in_the_reason() -> None:
    verdict = judge(quiet())
    assert (verdict.action, verdict.code) == (Action.STOP, Reason.IDLE)
    assert verdict.reason.startswith("idle for 60 min (gpu max 1%, cpu max 1%, network max 0.1")
    assert judge(quiet(), action=Action.TERMINATE).action is Action.TERMINATE


@pytest.mark.parametrize(
    ("instance", "code"),
    [
        (box(running=False, state="stopped"), Reason.NOT_RUNNING),
        (box(gpu_count=0), Reason.NO_GPU),
        (box(tags={KEEP_TAG: "true"}), Reason.PROTECT_TAG),
        (box(tags={"CostGuard:Keep": "YES"}), Reason.PROTECT_TAG),
        (box(protected=True), Reason.PROTECTED),
        (box(tags={EXPIRES_TAG: "2026-12-02T00:00:00Z"}), Reason.EXPIRES_LATER),
        (box(tags={EXPIRES_TAG: "soon"}), Reason.BAD_TAG),
        (box(launched_at=None), Reason.LAUNCH_UNKNOWN),
        (box(launched_at=NOW - timedelta(minutes=29)), Reason.YOUNG),
        (box(protected=None), Reason.PROTECTION_UNCHECKED),
    ],
)
def test_never_acts_on_protected_young_or_unknown(instance: Instance, code: Reason) -> None:
    verdict = judge(quiet(instance))
    assert (verdict.action, verdict.code) == (Action.KEEP, code)


def test_what_does_not_protect() -> None:
    assert judge(quiet(box(tags={KEEP_TAG: "false"}))).action is Action.STOP
    assert judge(quiet(box(tags={EXPIRES_TAG: "2026-12-01T11:00:00Z"}))).action is Action.STOP
    assert judge(quiet(box(launched_at=NOW - timedelta(minutes=30)))).action is Action.STOP


@pytest.mark.parametrize(
    "value",
    [
        "",
        "keep",
        "y",
        "protect",
        "\uff54\uff52\uff55\uff45",
        "true",
        "YES",
        " false",
        "false\n",
        "nein",
    ],
)
def test_a_present_protect_tag_keeps_it_unless_clearly_false(value: str) -> None:
    verdict = judge(quiet(box(tags={KEEP_TAG: value})))
    assert (verdict.action, verdict.code) == (Action.KEEP, Reason.PROTECT_TAG)


@pytest.mark.parametrize("value", ["false", "FALSE", "No", "0", "off"])
def test_a_clearly_false_protect_tag_does_not_protect(value: str) -> None:
    assert judge(quiet(box(tags={KEEP_TAG: value}))).action is Action.STOP


@pytest.mark.parametrize("broken", [float("nan"), -1.0, -0.001, float("-inf"), float("inf")])
@pytest.mark.parametrize("signal", ["gpu", "cpu", "network"])
def test_a_broken_reading_is_never_idle(signal: str, broken: float) -> None:
    readings = list(series(0.1 if signal == "network" else 1.0))
    readings[3] = replace(readings[3], value=broken)
    changes: dict[str, Any] = {signal: tuple(readings)}
    verdict = judge(quiet(**changes))
    assert (verdict.action, verdict.code) == (Action.KEEP, Reason.BUSY)


@pytest.mark.parametrize(
    "mark",
    ["0", "1970-01-01T00:00:00Z", format_timestamp(NOW - timedelta(hours=5)),
     format_timestamp(NOW + timedelta(hours=2))],
)  # fmt: skip
def test_a_mark_this_reaper_cannot_have_written_is_renewed_not_acted_on(mark: str) -> None:
    # Before the instance (re)started (launched 4 h ago), or in the future: no evidence.
    verdict = judge(quiet(box(tags={MARK_TAG: mark})), two_phase=True)
    assert (verdict.action, verdict.code) == (Action.MARK, Reason.IDLE)


def test_the_reason_rounds_readings_for_people_and_keeps_them_exact() -> None:
    verdict = judge(quiet(network=series(0.000106667)))
    assert "network max <0.01 Mbit/s" in verdict.reason
    assert "0.000106667" not in verdict.reason
    assert verdict.peaks[Signal.NETWORK] == 0.000106667


def test_configurable_protect_tags() -> None:
    team = box(tags={"team": "Vision"})
    assert judge(quiet(team), protect_tags=(("team", "vision"),)).code is Reason.PROTECT_TAG
    assert judge(quiet(team), protect_tags=(("team", "nlp"),)).action is Action.STOP
    assert judge(quiet(team), protect_tags=(("team", None),)).code is Reason.PROTECT_TAG
    assert parse_protect_tag("owner = ana ") == ("owner", "ana")
    with pytest.raises(InputError):
        parse_protect_tag("=x")


@pytest.mark.parametrize("signal", ["gpu", "cpu", "network"])
def test_one_busy_sample_keeps_it(signal: str) -> None:
    threshold = {"gpu": 5.0, "cpu": 5.0, "network": 1.0}[signal]
    samples = quiet()
    values = list(getattr(samples, signal))
    values[6] = Sample(values[6].at, threshold)  # at the threshold is busy
    changed: dict[str, Any] = {signal: tuple(values)}
    verdict = judge(replace(samples, **changed))
    assert (verdict.action, verdict.code) == (Action.KEEP, Reason.BUSY)
    assert f"busy: {signal}" in verdict.reason


def test_a_broken_datapoint_counts_as_busy() -> None:
    gpu = (*series()[:-1], Sample(NOW - timedelta(minutes=60), float("nan")))
    assert judge(quiet(gpu=gpu)).code is Reason.BUSY


def test_busy_samples_outside_the_window_do_not_count() -> None:
    # Its 5-minute period ends exactly where the window begins.
    old_burst = (Sample(NOW - timedelta(minutes=65), 99.0), *series())
    assert judge(quiet(gpu=old_burst)).action is Action.STOP


@pytest.mark.parametrize("signal", ["gpu", "cpu", "network"])
def test_a_busy_sample_stamped_before_the_window_but_reaching_into_it_keeps_it(
    signal: str,
) -> None:
    # CloudWatch stamps a 5-minute period with its start and rounds the query start down
    # to the minute: the period holding the window's first minutes is stamped before it.
    window_start = NOW - timedelta(minutes=60)
    first = Sample(window_start - timedelta(seconds=30), 99.0)
    later = tuple(Sample(first.at + timedelta(minutes=5 * k), 0.1) for k in range(1, 13))
    changed: dict[str, Any] = {signal: (first, *later)}
    verdict = judge(quiet(**changed))
    assert (verdict.action, verdict.code) == (Action.KEEP, Reason.BUSY)
    assert format_timestamp(first.at) in verdict.reason
    quiet_first = (replace(first, value=0.1), *later)
    changed = {signal: quiet_first}
    assert judge(quiet(**changed)).action is Action.STOP


def test_the_first_minutes_of_the_window_must_be_observed() -> None:
    # Samples from the window start on are not enough: the one stamped before it, whose
    # period holds the first minutes, is missing.
    late_start = tuple(s for s in series() if s.at > NOW - timedelta(minutes=60))
    verdict = judge(quiet(gpu=late_start))
    assert verdict.code is Reason.TOO_FEW_SAMPLES
    assert "after the window does" in verdict.reason


def test_missing_gpu_metrics_keep_it_unless_opted_in() -> None:
    samples = quiet(gpu=(), gpu_missing="no GPU metrics: agent missing")
    verdict = judge(samples)
    assert (verdict.action, verdict.code) == (Action.KEEP, Reason.NO_GPU_METRICS)
    assert verdict.reason.startswith("no GPU metrics: agent missing")
    assert "--gpu-missing-ok" in verdict.reason
    opted = judge(samples, gpu_missing_ok=True)
    assert opted.action is Action.STOP
    assert "judged by CPU and network" in opted.reason


def test_a_missing_sample_is_a_gap_but_a_late_newest_sample_is_lag() -> None:
    gappy = series()[:5] + series()[7:]  # 15 minutes without a sample
    assert judge(quiet(gpu=gappy)).code is Reason.TOO_FEW_SAMPLES
    # CPU and network stamped 10 min ago end 5 min ago: provider metrics are that late.
    late = series()[2:]
    assert judge(quiet(cpu=late, network=series(0.1)[2:])).action is Action.STOP


@pytest.mark.parametrize("stopped_minutes_ago", [4, 10, 15])
def test_a_gpu_series_that_stopped_minutes_ago_is_not_idle(stopped_minutes_ago: int) -> None:
    # The agent publishes every minute: a GPU series silent for minutes means the agent
    # stopped (a saturated machine, a crash), not an idle GPU - even though CPU and
    # network metrics as late are still accepted.
    every_minute = series(step=1, minutes=70)
    quiet_net = series(0.1, step=1, minutes=70)

    def ending(samples: tuple[Sample, ...], minutes_ago: int) -> tuple[Sample, ...]:
        end = NOW - timedelta(minutes=minutes_ago)
        return tuple(s for s in samples if s.at + timedelta(minutes=1) <= end)

    def verdict(gpu: int, cpu: int) -> IdleVerdict:
        samples = InstanceSamples(
            box(),
            gpu=ending(every_minute, gpu),
            cpu=ending(every_minute, cpu),
            network=ending(quiet_net, cpu),
        )
        return judge(samples, sample_period_seconds=60)

    stale = verdict(gpu=stopped_minutes_ago, cpu=0)
    assert (stale.action, stale.code) == (Action.KEEP, Reason.TOO_FEW_SAMPLES)
    assert f"the newest gpu sample ends {stopped_minutes_ago} min before now" in stale.reason
    assert "agent" in stale.reason
    assert verdict(gpu=2, cpu=min(stopped_minutes_ago, 10)).action is Action.STOP


def test_too_few_samples_to_cover_the_window() -> None:
    assert judge(quiet(gpu=series(minutes=40))).code is Reason.TOO_FEW_SAMPLES  # starts late
    stale = tuple(s for s in series() if s.at <= NOW - timedelta(minutes=20))
    assert judge(quiet(gpu=stale)).code is Reason.TOO_FEW_SAMPLES  # ends early
    assert judge(quiet(cpu=())).code is Reason.NO_METRICS


def test_two_phase_marks_waits_acts_and_unmarks() -> None:
    first = judge(quiet(), two_phase=True)
    assert (first.action, first.code) == (Action.MARK, Reason.IDLE)
    just_marked = box(tags={MARK_TAG: format_timestamp(NOW - timedelta(minutes=10))})
    waiting = judge(quiet(just_marked), two_phase=True)
    assert (waiting.action, waiting.code) == (Action.KEEP, Reason.MARKED)
    long_ago = box(tags={MARK_TAG: format_timestamp(NOW - timedelta(minutes=60))})
    assert judge(quiet(long_ago), two_phase=True).action is Action.STOP
    busy = quiet(long_ago, gpu=series(50.0))
    unmark = judge(busy, two_phase=True)
    assert (unmark.action, unmark.code) == (Action.UNMARK, Reason.NO_LONGER_IDLE)
    assert judge(busy).action is Action.KEEP  # marks only matter in two-phase mode
    garbled = box(tags={MARK_TAG: "yesterday"})
    assert judge(quiet(garbled), two_phase=True).action is Action.MARK


@pytest.mark.parametrize(
    "kwargs",
    [
        {"idle_minutes": 0},
        {"idle_minutes": -5},
        {"grace_minutes": -1},
        {"gpu_threshold_percent": 101},
        {"cpu_threshold_percent": -1},
        {"network_threshold_mbps": -0.5},
        {"action": Action.MARK},
    ],
)
def test_bad_policies_are_input_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InputError) as info:
        IdlePolicy(**kwargs)
    assert info.value.exit_code == 2


def test_timestamps() -> None:
    assert parse_timestamp("2026-12-01T12:00:00") == NOW  # no offset: UTC
    assert parse_timestamp("2026-12-01T13:00:00+01:00") == NOW
    assert parse_timestamp(str(int(NOW.timestamp()))) == NOW
    assert parse_timestamp("") is None


@pytest.mark.parametrize(
    "text",
    [
        "1796126400000",  # milliseconds: past the year 9999 (ValueError)
        "1796126400000000",  # microseconds
        "9" * 30,  # OverflowError
        "²",  # isdigit() but not a number int() reads
        "0000-01-01T00:00:00",
    ],
)
def test_a_timestamp_no_datetime_can_hold_is_a_bad_tag_not_a_crash(text: str) -> None:
    assert parse_timestamp(text) is None
    expires = judge(quiet(box(tags={EXPIRES_TAG: text})))
    assert (expires.action, expires.code) == (Action.KEEP, Reason.BAD_TAG)
    marked = judge(quiet(box(tags={MARK_TAG: text})), two_phase=True)
    assert marked.action is Action.MARK  # an unreadable mark is written afresh, never acted on


def verdict(n: int, action: Action, price: str | None = "1.5") -> IdleVerdict:
    instance = box(instance_id=f"i-{n}", usd_per_hour=Decimal(price) if price else None)
    return IdleVerdict(action, "x", Reason.IDLE, instance)


def test_plan_within_limits_acts_and_adds_up_prices() -> None:
    verdicts = [verdict(1, Action.STOP), verdict(2, Action.STOP, None), verdict(3, Action.KEEP),
                verdict(4, Action.MARK), verdict(5, Action.UNMARK)]  # fmt: skip
    plan = plan_reap(verdicts, ReapLimits(max_actions=2))
    assert plan.breach is None
    assert [v.instance.instance_id for v in plan.actions] == ["i-1", "i-2", "i-4", "i-5"]
    assert plan.usd_per_hour == Decimal("1.5")
    assert [v.instance.instance_id for v in plan.unpriced] == ["i-2"]
    assert plan.population == 5


def test_plan_over_a_limit_does_nothing_at_all() -> None:
    verdicts = [verdict(n, Action.STOP) for n in range(3)] + [verdict(9, Action.MARK)]
    plan = plan_reap(verdicts, ReapLimits(max_actions=2))
    assert plan.actions == ()
    assert plan.breach is not None
    error = plan.breach.error()
    assert (error.limit_type, error.limit, error.selection_count, error.population_count) == (
        "max-actions", 2, 3, 4,
    )  # fmt: skip
    assert error.exit_code == 1
    by_share = plan_reap(verdicts, ReapLimits(max_actions=10, max_percent=50))
    assert by_share.breach is not None
    assert by_share.breach.limit_type == "max-percent"
    assert plan_reap(verdicts, ReapLimits(max_actions=10, max_percent=75)).breach is None


def test_bad_limits_are_input_errors() -> None:
    with pytest.raises(InputError):
        ReapLimits(max_actions=-1)
    with pytest.raises(InputError):
        ReapLimits(max_percent=120)
