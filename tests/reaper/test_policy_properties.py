"""Properties of the idle rule and the plan over random fleets and metrics (hypothesis).

The rule is restated here independently of the implementation: whatever the fleet and
the metrics, an instance is only ever stopped, terminated or marked when every condition
of the issue holds.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from costguard.reaper.policy import (
    DESTRUCTIVE,
    FALSE_VALUES,
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
    parse_timestamp,
    plan_reap,
)
from costguard.tags import EXPIRES_TAG, KEEP_TAG, MARK_TAG

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def minutes_ago(m: float) -> datetime:
    return NOW - timedelta(minutes=m)


#: Protect-tag values: the spellings people use, the careless ones the audit found
#: (issue 14: "", "keep", "y", a fullwidth "true"), near misses of "false", and any text.
tag_values = st.one_of(
    st.sampled_from(
        ["true", "TRUE", "yes", "false", "FALSE", "no", "Off", "0", "", "maybe", "keep", "y",
         "protect", "\uff54\uff52\uff55\uff45", "\uff46\uff41\uff4c\uff53\uff45", " false",
         "false\n", "0.0", "nope"]
    ),
    st.text(max_size=12),
)  # fmt: skip


def unix(m: float, scale: int = 1) -> str:
    return str(int(minutes_ago(m).timestamp()) * scale)


#: Times as users and other tools write them: ISO 8601, Unix seconds (what GCP labels
#: hold), milliseconds (JavaScript, many CLIs), and numbers no datetime can hold.
when_tags = st.one_of(
    st.sampled_from(
        [format_timestamp(minutes_ago(m)) for m in (-600, -1, 1, 30, 90, 600)]
        + [unix(m) for m in (-600, 1, 90)]
        + [unix(m, 1000) for m in (-600, 90)]
        + ["garbage", "0", "9" * 20, "9" * 400]
    ),
    st.integers(min_value=0, max_value=10**30).map(str),
)


def usually(draw: st.DrawFn) -> bool:
    """True three times in four: keeps enough generated instances eligible for action."""
    return draw(st.sampled_from([True, True, True, False]))


@st.composite
def instances(draw: st.DrawFn) -> Instance:
    if draw(st.booleans()):  # half the fleet: eligible but for the metrics (and the mark)
        tags = {MARK_TAG: draw(when_tags)} if draw(st.booleans()) else {}
        return Instance("aws", "us-east-1", "i-1", "g5.xlarge", running=True, gpu_count=1,
                        launched_at=minutes_ago(600), protected=False, tags=tags)  # fmt: skip
    tags = {}
    if not usually(draw):
        tags[KEEP_TAG] = draw(tag_values)
    if not usually(draw):
        tags[EXPIRES_TAG] = draw(when_tags)
    if draw(st.booleans()):
        tags[MARK_TAG] = draw(when_tags)
    if not usually(draw):
        tags["team"] = draw(st.sampled_from(["vision", "nlp"]))
    launched = draw(st.integers(min_value=-5, max_value=600)) if usually(draw) else None
    return Instance(
        "aws",
        "us-east-1",
        "i-" + draw(st.text("0123456789abcdef", min_size=4, max_size=8)),
        "g5.xlarge",
        running=usually(draw),
        gpu_count=draw(st.sampled_from([0, 1, 1, 2, 8])),
        launched_at=None if launched is None else minutes_ago(launched),
        protected=False if usually(draw) else draw(st.sampled_from([None, True])),
        tags=tags,
    )


@st.composite
def metric_series(draw: st.DrawFn) -> tuple[Sample, ...]:
    """Regular series, mostly long and quiet; sometimes short, late, holed or bursty."""
    step = draw(st.sampled_from([1, 5, 7]))
    if draw(st.booleans()):  # half the series: quiet and complete
        return tuple(Sample(minutes_ago(m), 0.5) for m in range(0, 130, step))
    length = 130 if usually(draw) else draw(st.integers(min_value=0, max_value=150))
    start = 0 if usually(draw) else draw(st.integers(min_value=0, max_value=20))
    quiet = draw(st.sampled_from([0.0, 0.5, 0.99, 3.0]))
    holes, bursts, broken = not usually(draw), not usually(draw), not usually(draw)
    samples = []
    for m in range(start, start + length, step):
        if holes and draw(st.integers(min_value=0, max_value=30)) == 0:
            continue  # a missing datapoint
        busy = bursts and draw(st.integers(min_value=0, max_value=40)) == 0
        value = draw(st.floats(min_value=0, max_value=100)) if busy else quiet
        if broken and draw(st.integers(min_value=0, max_value=20)) == 0:
            # A broken datapoint: NaN, a negative rate, an infinity (issue 14).
            value = draw(st.sampled_from([math.nan, -1.0, -0.001, -math.inf, math.inf]))
        samples.append(Sample(minutes_ago(m), value))
    return tuple(samples)


thresholds = st.one_of(st.sampled_from([1.0, 5.0, 50.0]), st.floats(min_value=0, max_value=100))

policies = st.builds(
    IdlePolicy,
    idle_minutes=st.integers(min_value=1, max_value=120),
    gpu_threshold_percent=thresholds,
    cpu_threshold_percent=thresholds,
    network_threshold_mbps=thresholds,
    grace_minutes=st.integers(min_value=0, max_value=120),
    action=st.sampled_from([Action.STOP, Action.TERMINATE]),
    gpu_missing_ok=st.booleans(),
    protect_tags=st.sampled_from([(), (("team", "vision"),), (("team", None),)]),
    two_phase=st.booleans(),
    sample_period_seconds=st.sampled_from([60, 300]),
    max_lag_seconds=st.sampled_from([0, 300, 900]),
    gpu_max_lag_seconds=st.sampled_from([0, 180, 600]),
)


@st.composite
def observed(draw: st.DrawFn) -> InstanceSamples:
    gpu_missing = None if usually(draw) else "agent missing"
    return InstanceSamples(
        draw(instances()),
        gpu=() if gpu_missing else draw(metric_series()),
        cpu=draw(metric_series()),
        network=draw(metric_series()),
        gpu_missing=gpu_missing,
    )


def allowed_to_act(samples: InstanceSamples, policy: IdlePolicy) -> bool:
    """The issue's rule, restated: every condition for touching an instance."""
    instance = samples.instance
    tags = {k.lower(): v for k, v in instance.tags.items()}
    if not instance.running or instance.gpu_count <= 0 or instance.protected is not False:
        return False
    if KEEP_TAG in tags and tags[KEEP_TAG].lower() not in FALSE_VALUES:
        return False  # a present protect tag protects unless it is clearly false
    for key, value in policy.protect_tags:
        if key in tags and (value is None or tags[key].lower() == value.lower()):
            return False
    if EXPIRES_TAG in tags:
        until = parse_timestamp(tags[EXPIRES_TAG])
        if until is None or until > NOW:
            return False
    if instance.launched_at is None or NOW - instance.launched_at < timedelta(
        minutes=policy.grace_minutes
    ):
        return False
    signals = [Signal.CPU, Signal.NETWORK]
    if samples.gpu_missing is None:
        signals.append(Signal.GPU)
    elif not policy.gpu_missing_ok:
        return False
    start = NOW - policy.window
    period = timedelta(seconds=policy.sample_period_seconds)
    for signal in signals:
        lag = policy.gpu_max_lag_seconds if signal is Signal.GPU else policy.max_lag_seconds
        # A sample stands for [at, at + period): every one reaching into the window counts.
        touching = sorted(
            (s for s in samples.series(signal) if s.at + period > start), key=lambda s: s.at
        )
        if not touching or touching[0].at > start:
            return False  # the first minutes of the window were not observed
        if NOW - (touching[-1].at + period) > timedelta(seconds=lag):
            return False
        if any(not 0 <= s.value < policy.threshold(signal) for s in touching):
            return False  # busy, or a broken reading (NaN, negative): never idle
    return True


@settings(max_examples=200, deadline=None)
@given(samples=observed(), policy=policies)
def test_never_an_action_outside_the_rule(samples: InstanceSamples, policy: IdlePolicy) -> None:
    verdict = judge_idle(samples, policy, NOW)
    if verdict.action in (*DESTRUCTIVE, Action.MARK):
        assert allowed_to_act(samples, policy), verdict
    if verdict.action in DESTRUCTIVE:
        assert verdict.action is policy.action
        if policy.two_phase:
            marked = parse_timestamp(samples.instance.tags[MARK_TAG])
            assert marked is not None
            assert marked <= NOW - policy.window
            # ...and marked by a run that saw this instance running (issue 14: a
            # costguard:idle-since=0 must not skip the wait).
            launched = samples.instance.launched_at
            assert launched is not None
            assert marked >= launched
    if verdict.action is Action.UNMARK:
        assert policy.two_phase
        assert MARK_TAG in samples.instance.tags
    if not policy.two_phase:
        assert verdict.action not in (Action.MARK, Action.UNMARK)


@settings(max_examples=200, deadline=None)
@given(
    instance=instances(),
    policy=policies,
    shorter=st.integers(min_value=0, max_value=200),
    extra=st.integers(min_value=1, max_value=200),
    value=st.floats(min_value=0, max_value=100),
)
def test_idle_verdict_is_monotone_in_idle_time(
    instance: Instance, policy: IdlePolicy, shorter: int, extra: int, value: float
) -> None:
    """Idle for longer never turns an action into a keep; a shorter window never either."""
    instance = replace(
        instance, running=True, gpu_count=1, protected=False, tags={}, launched_at=minutes_ago(600)
    )
    policy = replace(policy, two_phase=False)
    step = policy.sample_period_seconds // 60

    def idle_for(minutes: int) -> InstanceSamples:
        quiet = tuple(Sample(minutes_ago(m), value) for m in range(0, minutes + 1, step))
        return InstanceSamples(instance, gpu=quiet, cpu=quiet, network=quiet)

    def acts(samples: InstanceSamples, rule: IdlePolicy) -> bool:
        return judge_idle(samples, rule, NOW).action in DESTRUCTIVE

    if acts(idle_for(shorter), policy):
        assert acts(idle_for(shorter + extra), policy)
    if acts(idle_for(shorter), policy) and policy.idle_minutes > 1:
        smaller = replace(policy, idle_minutes=max(1, policy.idle_minutes - extra))
        assert acts(idle_for(shorter), smaller)


@st.composite
def verdict_lists(draw: st.DrawFn) -> list[IdleVerdict]:
    verdicts = []
    for n in range(draw(st.integers(min_value=0, max_value=60))):
        instance = Instance(
            "aws", "us-east-1", f"i-{n}", "g5.xlarge", running=draw(st.booleans()),
            gpu_count=draw(st.integers(min_value=0, max_value=2)), launched_at=NOW,
        )  # fmt: skip
        action = draw(st.sampled_from(list(Action)))
        verdicts.append(IdleVerdict(action, "r", Reason.IDLE, instance))
    return verdicts


@settings(max_examples=200, deadline=None)
@given(
    verdicts=verdict_lists(),
    max_actions=st.integers(min_value=0, max_value=40),
    max_percent=st.floats(min_value=0, max_value=100),
)
def test_a_plan_never_exceeds_its_limits(
    verdicts: list[IdleVerdict], max_actions: int, max_percent: float
) -> None:
    plan = plan_reap(verdicts, ReapLimits(max_actions, max_percent))
    acting = [v for v in plan.actions if v.action in DESTRUCTIVE]
    assert len(acting) <= max_actions
    assert len(acting) * 100 <= max_percent * plan.population
    assert all(v in verdicts for v in plan.actions)
    if plan.breach:
        assert plan.actions == ()
    else:
        assert list(plan.actions) == [v for v in verdicts if v.action is not Action.KEEP]


#: Broken on-instance values: what a failing sensor or a bug may report.
broken_values = st.sampled_from([math.nan, -1.0, -0.001, -math.inf, math.inf, None])


@st.composite
def agent_readings(draw: st.DrawFn) -> list[list[float | None]]:
    """Quiet readings (gpu, cpu, network) every minute, some of them corrupted."""
    count = draw(st.integers(min_value=1, max_value=30))
    quiet = draw(st.sampled_from([0.0, 0.5, 0.9]))
    readings: list[list[float | None]] = [[quiet, quiet, quiet] for _ in range(count)]
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        row = draw(st.integers(min_value=0, max_value=count - 1))
        readings[row][draw(st.integers(min_value=0, max_value=2))] = draw(broken_values)
    return readings


@settings(max_examples=300, deadline=None)
@given(readings=agent_readings(), gpu_missing_ok=st.booleans())
def test_the_agent_never_shuts_down_on_a_broken_or_missing_reading(
    readings: list[list[float | None]], gpu_missing_ok: bool
) -> None:
    """Any sequence of readings with NaN, negative or missing values: the agent shuts the
    machine down only if every reading of the window is a real, idle one (issue 14)."""
    from costguard.reaper.autostop import AgentPolicy, Reading, decide_shutdown

    policy = AgentPolicy(idle_minutes=10, interval_seconds=60, gpu_missing_ok=gpu_missing_ok)
    start = NOW - timedelta(minutes=len(readings) - 1)
    taken = [
        Reading(start + timedelta(minutes=n), gpu, cpu, net)
        for n, (gpu, cpu, net) in enumerate(readings)
    ]
    if not decide_shutdown(taken, policy, NOW).shutdown:
        return
    for reading in taken:
        if reading.at < NOW - timedelta(minutes=10):
            continue
        gpu, cpu, net = reading.gpu_util_percent, reading.cpu_percent, reading.network_mbps
        assert (gpu is None and gpu_missing_ok) or (gpu is not None and 0 <= gpu < 5)
        assert cpu is not None
        assert 0 <= cpu < 5
        assert net is not None
        assert 0 <= net < 1
