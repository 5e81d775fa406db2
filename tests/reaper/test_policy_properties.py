"""Properties of the idle rule and the plan over random fleets and metrics (hypothesis).

The rule is restated here independently of the implementation: whatever the fleet and
the metrics, an instance is only ever stopped, terminated or marked when every condition
of the issue holds.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
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


# ---------------------------------------------------------------- issue 28: evidence rules

#: An instance every rule but the tags and the GPU series would stop.
ELIGIBLE = Instance("aws", "us-east-1", "i-0e1", "p4d.24xlarge", running=True, gpu_count=8,
                    launched_at=minutes_ago(600), protected=False)  # fmt: skip
QUIET = tuple(Sample(minutes_ago(m), 0.0) for m in range(0, 70, 5))


@st.composite
def keep_like_keys(draw: st.DrawFn) -> str:
    """``costguard:keep`` as people and tools spell it: any case, ``:``/``-``/``_``/blank."""

    def cased(word: str) -> str:
        return "".join(c.upper() if draw(st.booleans()) else c for c in word)

    sep = draw(st.sampled_from([":", "-", "_", " ", ": "]))
    pad = draw(st.sampled_from(["", "", " "]))
    return f"{pad}{cased('costguard')}{sep}{cased('keep')}{pad}"


#: Keys that only look like the keep tag: they protect nothing.
near_keys = st.sampled_from(["keep", "costguard:keeper", "costguard:kept", "costguardkeep",
                             "team", "Name", "costguard:keep:until"])  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    entries=st.lists(
        st.tuples(st.one_of(keep_like_keys(), near_keys), tag_values), min_size=1, max_size=6
    ),
    order=st.randoms(use_true_random=False),
)
def test_any_keep_like_tag_that_says_keep_or_is_unclear_keeps(
    entries: list[tuple[str, str]], order: Any
) -> None:
    """Whatever the tags' case, duplicates and order: one keep-like tag whose value is not
    clearly false keeps the instance; with none, the idle instance is stopped (issue 28:
    ``costguard:keep=false`` listed before ``COSTGUARD:KEEP=true`` stopped it)."""
    order.shuffle(entries)
    tags = dict(entries)  # a cloud holds one value per exact key
    samples = InstanceSamples(replace(ELIGIBLE, gpu_count=1, tags=tags), gpu=QUIET, cpu=QUIET,
                              network=QUIET, per_gpu=(("0", QUIET),))  # fmt: skip
    verdict = judge_idle(samples, IdlePolicy(), NOW)

    def keep_like(key: str) -> bool:
        words = key.strip().lower().replace("-", ":").replace("_", ":").replace(" ", ":")
        return words.replace("::", ":") == KEEP_TAG

    if any(keep_like(k) and v.lower() not in FALSE_VALUES for k, v in tags.items()):
        assert (verdict.action, verdict.code) == (Action.KEEP, Reason.PROTECT_TAG), tags
    else:
        assert verdict.action is Action.STOP, (tags, verdict)


#: What one GPU's own series shows: idle and complete, busy once, silent for the last
#: minutes, or absent.
GPU_KINDS = ["idle", "idle", "idle", "busy", "silent", "missing"]


@st.composite
def gpu_evidence(draw: st.DrawFn) -> tuple[InstanceSamples, bool]:
    """An 1-8 GPU instance's GPU series as the agent and a forger may have published them,
    and whether the instance must be kept (some GPU busy or not seen in the window, that
    the adapter could know of: the size's count, which may be short for a size the tables
    lack, or a GPU numbered above it)."""
    count = draw(st.integers(min_value=1, max_value=8))
    counted = draw(st.one_of(st.just(count), st.integers(min_value=1, max_value=count)))
    per_gpu: list[tuple[str, tuple[Sample, ...]]] = []
    kinds: list[str] = []
    honest: list[tuple[Sample, ...]] = []
    for gpu in range(count):
        kind = draw(st.sampled_from(GPU_KINDS))
        kinds.append(kind)
        if kind == "missing":
            continue
        series = QUIET
        if kind == "busy":
            at = draw(st.sampled_from(range(1, 12)))
            value = draw(st.floats(min_value=5, max_value=100))
            series = (*QUIET[:at], Sample(QUIET[at].at, value), *QUIET[at + 1 :])
        if kind == "silent":
            since = draw(st.integers(min_value=6, max_value=70))
            value = draw(st.sampled_from([0.0, 98.0]))
            series = tuple(Sample(s.at, value) for s in QUIET if s.at <= minutes_ago(since))
        honest.append(series)
        per_gpu.append((str(gpu), series))
    # Forged zeros: duplicates for GPUs that have a series, at any place in the order.
    for gpu in draw(st.lists(st.integers(min_value=0, max_value=count - 1), max_size=3)):
        if any(name == str(gpu) for name, _ in per_gpu):
            per_gpu.insert(draw(st.integers(min_value=0, max_value=len(per_gpu))),
                           (str(gpu), QUIET))  # fmt: skip
    # The instance series: the agent's aggregate (the busiest GPU per period), forged
    # zeros, or none.
    aggregate = draw(st.sampled_from(["agent", "forged", "none"]))
    gpu_series: tuple[Sample, ...] = ()
    if aggregate == "agent" and honest:
        at_times = sorted({s.at for series in honest for s in series})
        gpu_series = tuple(
            Sample(t, max(s.value for series in honest for s in series if s.at == t))
            for t in at_times
        )
    elif aggregate == "forged":
        gpu_series = QUIET
    missing = None if gpu_series or per_gpu else "no GPU metrics"
    # GPUs above the highest one named, past the size's count, no adapter can know of.
    named = [gpu for gpu, kind in enumerate(kinds) if kind != "missing"]
    known = max(counted, max(named, default=-1) + 1)
    must_keep = any(kind != "idle" for kind in kinds[:known])
    samples = InstanceSamples(
        replace(ELIGIBLE, gpu_count=counted), gpu=gpu_series, cpu=QUIET, network=QUIET,
        gpu_missing=missing, per_gpu=tuple(per_gpu),
    )  # fmt: skip
    return samples, must_keep


@settings(max_examples=400, deadline=None)
@given(evidence=gpu_evidence(), gpu_missing_ok=st.booleans())
def test_missing_forged_or_disagreeing_gpu_series_never_stop_a_gpu_that_was_busy_or_unseen(
    evidence: tuple[InstanceSamples, bool], gpu_missing_ok: bool
) -> None:
    """Issue 28: forged zeros next to a busy GPU, forged zeros with no agent, a GPU whose
    series went silent, a GPU with no series: kept. Every GPU idle and seen: stopped."""
    samples, must_keep = evidence
    verdict = judge_idle(samples, IdlePolicy(gpu_missing_ok=gpu_missing_ok), NOW)
    if must_keep:
        no_gpu_data = not samples.gpu and not samples.per_gpu
        assert verdict.action is Action.KEEP or (gpu_missing_ok and no_gpu_data), verdict
    else:
        assert verdict.action is Action.STOP, verdict


def test_a_gpu_named_with_no_sample_at_all_keeps_the_instance() -> None:
    """Hypothesis found it: the adapter named GPU 0 but its series held no sample (silent
    for longer than the lookback) and there was no instance series. The GPU signal then had
    no witness, and the verdict stopped the VM as if --gpu-missing-ok had been given."""
    samples = InstanceSamples(
        ELIGIBLE, gpu=(), cpu=QUIET, network=QUIET, gpu_missing=None, per_gpu=(("0", ()),)
    )
    verdict = judge_idle(samples, IdlePolicy(), NOW)
    assert verdict.action is Action.KEEP, verdict
    assert verdict.code is Reason.NO_METRICS


@pytest.mark.parametrize("instance_series", ["none", "forged"])
def test_a_gpu_whose_own_series_went_silent_is_not_vouched_for_by_a_second_series(
    instance_series: str,
) -> None:
    """Hypothesis found it: GPU 0's agent series held no sample in the lookback (the agent
    died while the GPU worked), and a second series naming GPU 0, with other dimensions,
    showed zeros. GPU 0 was counted as seen, so the zeros stopped the VM. Every series
    that names a GPU must be seen in the window: one that went silent is a doubt."""
    for per_gpu in ((("0", QUIET), ("0", ())), (("0", ()), ("0", QUIET))):
        samples = InstanceSamples(
            replace(ELIGIBLE, gpu_count=1),
            gpu=QUIET if instance_series == "forged" else (),
            cpu=QUIET,
            network=QUIET,
            gpu_missing=None,
            per_gpu=per_gpu,
        )
        verdict = judge_idle(samples, IdlePolicy(), NOW)
        assert (verdict.action, verdict.code) == (Action.KEEP, Reason.DOUBT), verdict
        assert "0 of 1 GPUs" in verdict.reason, verdict.reason
