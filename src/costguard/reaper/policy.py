"""Which GPU instances are idle, and what one reaper run may do about them. Pure: no I/O.

The idle rule and the run's limits are kept together, so every fail-safe choice (when
in doubt, keep) can be read in one place.

An idle GPU bills exactly like a busy one, but a wrong "idle" stops somebody's training
run, so every rule here fails safe: when in doubt, keep the instance.

* :func:`judge_idle` gives one instance's :class:`IdleVerdict` from what the adapters saw
  (:class:`InstanceSamples`), an :class:`IdlePolicy` and the time ``now``.
* :func:`plan_reap` turns all verdicts into a :class:`ReapPlan` that respects
  :class:`ReapLimits`: more selected instances than the limit allow means nothing at all
  is done (cloud-custodian's ``ResourceLimitExceeded`` rail).

Idle means *every* sample whose period overlaps the window ``[now - idle_minutes, now]``
is below *every* threshold (GPU utilisation, CPU utilisation, network), and the samples
cover the whole window without gaps. Tools that compare one datapoint (cloud-custodian#8715)
or use no GPU signal at all (SkyPilot autostop) stop busy machines; this one does not.

Evidence rules (docs/reaper.md says why each exists):

* Tags: every tag whose key is a spelling of the keep tag (:func:`~costguard.tags.tag_key`:
  any case or width, any punctuation between the words, a billing export's ``user:``) is
  asked, in any order; one whose value is not clearly false keeps (:func:`protects`).
  Duplicated time tags are unreadable, so they keep too.
* Series: each series is a witness of its own (:meth:`InstanceSamples.witnesses`): the
  instance-level GPU series, each per-GPU series, CPU, network. Any busy or broken sample
  of any witness keeps; any witness that does not cover the window keeps. None is
  preferred, none is merged, so a forged idle series cannot outvote a busy one.
* Doubt keeps (``Reason.DOUBT``): where an adapter reads per-GPU series, every GPU must
  have one in the window, and an instance-level series without per-GPU series beside it
  (the agent publishes both; anyone may publish the first) is not believed.

A sample stands for a *period*, not an instant: ``Sample.at`` is the start of the period
(CloudWatch and Azure Monitor stamp a datapoint so; adapters whose API stamps the end, like
Cloud Monitoring, shift it), and the period is ``IdlePolicy.sample_period_seconds`` long.
So the sample stamped just before ``now - idle_minutes`` still describes the first minutes
of the window, and a burst in it keeps the instance.

>>> from datetime import datetime, timedelta, timezone
>>> now = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
>>> box = Instance("aws", "us-east-1", "i-0abc", "g5.xlarge", running=True, gpu_count=1,
...                launched_at=now - timedelta(hours=5), protected=False)
>>> quiet = tuple(Sample(now - timedelta(minutes=m), 0.0) for m in range(0, 65, 5))
>>> judge_idle(InstanceSamples(box, gpu=quiet, cpu=quiet, network=quiet),
...            IdlePolicy(), now).action
<Action.STOP: 'stop'>
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from itertools import pairwise

from costguard.errors import CostguardError, InputError
from costguard.tags import ATTEMPT_TAG, EXPIRES_TAG, JOB_TAG, KEEP_TAG, MARK_TAG, OWNER_TAG, tag_key

#: The only values of a protect tag that do *not* protect (compared case-insensitively,
#: not stripped, exactly as the IAM conditions in ``infra/`` compare them). Any other value
#: of a present tag - ``""``, ``keep``, ``y``, a fullwidth ``true`` - protects: a person
#: who tagged an instance meant something, and guessing wrong stops their work.
FALSE_VALUES = ("false", "no", "0", "off")

MAX_IDLE_MINUTES = 7 * 24 * 60
#: How long before ``now`` the newest GPU sample's period may end. The GPU series comes
#: from an agent on the instance (CloudWatch agent, Ops Agent, Telegraf) that publishes
#: every minute and flushes within another, so a healthy series is at most about two
#: minutes behind. One that went quiet for longer means the agent stopped - often because
#: the machine is saturated or the agent crashed - not that the GPU is idle; provider
#: metrics (CPU, network) arrive later by design and have their own, longer limit.
GPU_MAX_LAG_SECONDS = 180


class Signal(StrEnum):
    """A kind of activity the reaper measures."""

    GPU = "gpu"  # utilisation, percent of the busiest GPU
    CPU = "cpu"  # utilisation, percent
    NETWORK = "network"  # in + out, megabits per second


class Action(StrEnum):
    """What a verdict asks for."""

    KEEP = "keep"
    MARK = "mark"  # two-phase mode: tag now, act on a later run if still idle
    UNMARK = "unmark"  # two-phase mode: the instance was marked but is no longer idle
    STOP = "stop"  # AWS stop, GCP stop, Azure deallocate
    TERMINATE = "terminate"  # AWS terminate, GCP/Azure delete


#: The actions that end billing for compute, and that the safety limits count.
DESTRUCTIVE = frozenset({Action.STOP, Action.TERMINATE})


class Reason(StrEnum):
    """Why a verdict is what it is (stable codes for scripts; the text says more)."""

    IDLE = "idle"
    NOT_RUNNING = "not-running"
    NO_GPU = "no-gpu"
    PROTECT_TAG = "protect-tag"
    OTHER_OWNER = "other-owner"
    PROTECTED = "termination-protected"
    PROTECTION_UNCHECKED = "protection-unchecked"
    EXPIRES_LATER = "expires-later"
    BAD_TAG = "bad-tag"
    LAUNCH_UNKNOWN = "launch-time-unknown"
    YOUNG = "young"
    NO_GPU_METRICS = "no-gpu-metrics"
    NO_METRICS = "no-metrics"
    BUSY = "busy"
    TOO_FEW_SAMPLES = "too-few-samples"
    MARKED = "marked"
    NO_LONGER_IDLE = "no-longer-idle"
    DOUBT = "metrics-doubt"
    GANG = "gang-not-idle"


@dataclass(frozen=True, slots=True)
class Sample:
    """One datapoint: when, and the value in the signal's unit (percent or Mbit/s)."""

    at: datetime
    value: float


@dataclass(frozen=True)
class Instance:
    """What a cloud told us about one instance. Adapters build these; nothing here calls out.

    ``protected`` is termination/deletion/stop protection: ``None`` until checked (AWS
    needs one call per instance for it, so the adapter checks only the candidates).
    ``tags`` use the policy's names (``costguard:keep``) whatever the cloud's spelling.
    """

    provider: str
    region: str
    instance_id: str
    instance_type: str
    running: bool
    gpu_count: int
    launched_at: datetime | None
    protected: bool | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    accelerator: str | None = None
    usd_per_hour: Decimal | None = None
    spot: bool = False
    name: str = ""
    zone: str = ""
    state: str = ""


@dataclass(frozen=True)
class InstanceSamples:
    """An instance and its samples per signal. ``gpu_missing`` explains absent GPU data.

    ``gpu`` is the instance-level GPU series (the busiest GPU per period). ``per_gpu`` holds
    the per-GPU series as (GPU, series) pairs, for adapters that read them (``None`` for
    one that reads only an instance-level series its cloud reduced); the GPU is the
    device's index as the agent names it, and two series of one GPU are two witnesses of
    that GPU. Every GPU series is judged on its own (see :func:`judge_idle`); none is
    merged into another.

    ``gpu_missing`` is the adapter's sentence for *why* there is no GPU series (agent not
    installed, metrics published without the ``InstanceId`` dimension...); ``None`` means
    the series was found (it may still have too few samples).
    """

    instance: Instance
    gpu: tuple[Sample, ...] = ()
    cpu: tuple[Sample, ...] = ()
    network: tuple[Sample, ...] = ()
    gpu_missing: str | None = None
    per_gpu: tuple[tuple[str, tuple[Sample, ...]], ...] | None = None

    def series(self, signal: Signal) -> tuple[Sample, ...]:
        """The samples of one signal (for the GPU, the instance-level series)."""
        return {Signal.GPU: self.gpu, Signal.CPU: self.cpu, Signal.NETWORK: self.network}[signal]

    def witnesses(self, signal: Signal) -> tuple[tuple[str, tuple[Sample, ...]], ...]:
        """Every series of ``signal``, with a note that tells it from the others (``""``
        when it is the only kind): for the GPU the instance-level one (when
        there is one, or when the adapter reads no per-GPU series) and each per-GPU one
        that has samples (how many GPUs have one is :func:`_gpu_doubt`'s question).

        >>> t = datetime(2026, 12, 1, tzinfo=UTC)
        >>> box = Instance("aws", "us-east-1", "i-1", "p4d.24xlarge", True, 8, t)
        >>> both = InstanceSamples(box, gpu=(Sample(t, 0.0),), per_gpu=(("3", (Sample(t, 97.0),)),))
        >>> [note for note, _ in both.witnesses(Signal.GPU)]
        ['instance series', 'GPU 3']
        """
        if signal is not Signal.GPU or self.per_gpu is None:
            return (("", self.series(signal)),)
        named = [("instance series", self.gpu)] if self.gpu else []
        named += [(f"GPU {gpu}", series) for gpu, series in self.per_gpu if series]
        return tuple(named) or (("", ()),)  # no GPU series at all: a witness with no samples


@dataclass(frozen=True)
class IdlePolicy:
    """The rule: thresholds, window, grace, action, and how the metrics are sampled.

    ``sample_period_seconds`` is the length of the period each sample stands for (a
    sample stamped ``at`` covers ``[at, at + period)``). ``max_lag_seconds`` is how long
    before ``now`` the newest CPU or network period may end (provider metrics arrive
    minutes late), ``gpu_max_lag_seconds`` the same for the agent-published GPU series
    (:data:`GPU_MAX_LAG_SECONDS`). They come from the adapter; the defaults suit
    CloudWatch's 5-minute EC2 data.

    >>> IdlePolicy(gpu_threshold_percent=120)
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: gpu threshold must be between 0 and 100, not 120
    """

    idle_minutes: int = 60
    gpu_threshold_percent: float = 5.0
    cpu_threshold_percent: float = 5.0
    network_threshold_mbps: float = 1.0
    grace_minutes: int = 30
    action: Action = Action.STOP
    gpu_missing_ok: bool = False
    #: Extra protecting tags: (key, value) pairs; value ``None`` protects whatever the value.
    protect_tags: tuple[tuple[str, str | None], ...] = ()
    two_phase: bool = False
    #: ``--owner``: only instances whose ``costguard:owner`` tag is this (every tag of that
    #: key, and exactly one) are judged; any other is another owner's and kept.
    owner: str | None = None
    sample_period_seconds: int = 300
    max_lag_seconds: int = 600
    gpu_max_lag_seconds: int = GPU_MAX_LAG_SECONDS

    def __post_init__(self) -> None:
        if not 1 <= self.idle_minutes <= MAX_IDLE_MINUTES:
            msg = f"idle minutes must be between 1 and {MAX_IDLE_MINUTES}, not {self.idle_minutes}"
            raise InputError(msg, hint="e.g. --idle-minutes 60")
        if not 0 <= self.grace_minutes <= MAX_IDLE_MINUTES:
            msg = (
                f"grace minutes must be between 0 and {MAX_IDLE_MINUTES}, not {self.grace_minutes}"
            )
            raise InputError(msg, hint="e.g. --grace-minutes 30")
        for name in ("gpu", "cpu"):
            value = getattr(self, f"{name}_threshold_percent")
            if not 0 <= value <= 100:
                msg = f"{name} threshold must be between 0 and 100, not {value:g}"
                raise InputError(msg, hint=f"a percentage, e.g. --{name}-threshold 5")
        if not 0 <= self.network_threshold_mbps <= 1_000_000:
            msg = (
                "network threshold must be between 0 and 1000000 Mbit/s, "
                f"not {self.network_threshold_mbps:g}"
            )
            raise InputError(msg, hint="e.g. --network-threshold-mbps 1")
        if self.action not in DESTRUCTIVE:
            msg = f"the reaper's action must be stop or terminate, not {self.action}"
            raise InputError(msg, hint="--action stop (the default) or --action terminate")
        if (
            self.sample_period_seconds < 1
            or self.max_lag_seconds < 0
            or self.gpu_max_lag_seconds < 0
        ):
            msg = "the sample period must be positive and the lags not negative"
            raise InputError(msg)

    @property
    def window(self) -> timedelta:
        """How long an instance must have been idle."""
        return timedelta(minutes=self.idle_minutes)

    @property
    def period(self) -> timedelta:
        """How long the period is that one sample stands for."""
        return timedelta(seconds=self.sample_period_seconds)

    @property
    def max_gap(self) -> timedelta:
        """The largest spacing between the starts of consecutive samples that still counts
        as covering the window.

        One and a half periods: jitter is tolerated, a missing sample is not, because a
        busy burst could hide in it.
        """
        return timedelta(seconds=self.sample_period_seconds * 1.5)

    def max_lag(self, signal: Signal) -> timedelta:
        """How long before ``now`` the newest period of ``signal`` may end."""
        seconds = self.gpu_max_lag_seconds if signal is Signal.GPU else self.max_lag_seconds
        return timedelta(seconds=seconds)

    def overlaps(self, sample: Sample, start: datetime) -> bool:
        """Whether the period of ``sample`` reaches into a window that begins at ``start``."""
        return sample.at + self.period > start

    def threshold(self, signal: Signal) -> float:
        """The value at or above which a sample of ``signal`` is busy."""
        return {
            Signal.GPU: self.gpu_threshold_percent,
            Signal.CPU: self.cpu_threshold_percent,
            Signal.NETWORK: self.network_threshold_mbps,
        }[signal]


@dataclass(frozen=True)
class IdleVerdict:
    """The decision for one instance: an action, a sentence saying why, and a stable code.

    ``peaks`` holds the highest sample per signal in the window, for the report.
    """

    action: Action
    reason: str
    code: Reason
    instance: Instance
    peaks: Mapping[Signal, float] = field(default_factory=dict)


def parse_protect_tag(text: str) -> tuple[str, str | None]:
    """Parse ``KEY`` or ``KEY=VALUE`` (a ``--protect-tag`` value).

    >>> parse_protect_tag("team=vision"), parse_protect_tag("do-not-reap")
    (('team', 'vision'), ('do-not-reap', None))
    """
    key, sep, value = text.partition("=")
    key = key.strip()
    if not key:
        msg = f"a protect tag needs a key: {text!r}"
        raise InputError(msg, hint="--protect-tag KEY or --protect-tag KEY=VALUE")
    return key, (value.strip() if sep else None)


def parse_timestamp(text: str) -> datetime | None:
    """Read a tag's time: ISO 8601 (UTC when no offset) or Unix seconds; ``None`` if neither.

    Unix seconds are accepted because GCP label values may not contain ``:``. A number
    that is no time Python can hold (milliseconds since 1970 land past the year 9999) is
    ``None`` too - a bad tag, which the rules treat as "keep" - never an exception that
    would end the whole run.

    >>> parse_timestamp("2026-12-01T12:00:00Z")
    datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.timezone.utc)
    >>> parse_timestamp("1796126400") == parse_timestamp("2026-12-01T12:00:00+00:00")
    True
    >>> parse_timestamp("next tuesday") is None
    True
    >>> parse_timestamp("1796126400000") is None  # milliseconds
    True
    """
    text = text.strip()
    try:
        if text.isdigit():
            return datetime.fromtimestamp(int(text), tz=UTC)
        parsed = datetime.fromisoformat(text)
    except (ValueError, OverflowError, OSError):
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def format_timestamp(moment: datetime) -> str:
    """A tag value for ``moment``: ISO 8601 in UTC, to the second.

    >>> format_timestamp(datetime(2026, 12, 1, 12, 0, 30, 999, tzinfo=UTC))
    '2026-12-01T12:00:30Z'
    """
    return moment.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def coverage_gap(
    times: Iterable[datetime],
    start: datetime,
    end: datetime,
    policy: IdlePolicy,
    signal: Signal = Signal.CPU,
) -> str | None:
    """Why the periods of samples stamped ``times`` do not cover ``[start, end]``; ``None``
    when they do.

    Only samples whose period overlaps the window count. The earliest of them must begin
    at or before ``start`` (the first minutes of the window are observed too), each next
    one within ``max_gap`` of the previous, and the newest period must end no more than
    the signal's ``max_lag`` before ``end``. A shorter window inside a covered one is
    covered too (the idle verdict is monotone).

    >>> t = datetime(2026, 12, 1, tzinfo=UTC)
    >>> every_5 = [t + timedelta(minutes=m) for m in range(-5, 61, 5)]
    >>> coverage_gap(every_5, t, t + timedelta(minutes=60), IdlePolicy()) is None
    True
    >>> coverage_gap(every_5[2:], t, t + timedelta(minutes=60), IdlePolicy())
    'the first cpu sample starts 2026-12-01T00:05:00Z, after the window does'
    >>> coverage_gap(every_5[:3] + every_5[5:], t, t + timedelta(minutes=60), IdlePolicy())
    '10 min without a cpu sample after 2026-12-01T00:05:00Z'
    """
    overlapping = sorted(moment for moment in times if moment + policy.period > start)
    if not overlapping:
        return f"no {signal} sample in the window"
    if overlapping[0] > start:
        return (
            f"the first {signal} sample starts {format_timestamp(overlapping[0])}, "
            "after the window does"
        )
    for earlier, later in pairwise(overlapping):
        if later - earlier > policy.max_gap:
            minutes = (later - earlier - policy.period).total_seconds() / 60
            return f"{minutes:g} min without a {signal} sample after {format_timestamp(earlier)}"
    lag = end - (overlapping[-1] + policy.period)
    if lag > policy.max_lag(signal):
        minutes = round(lag.total_seconds() / 60, 1)
        allowed = policy.max_lag(signal).total_seconds() / 60
        text = (
            f"the newest {signal} sample ends {minutes:g} min before now "
            f"(at most {allowed:g} min allowed)"
        )
        if signal is Signal.GPU:
            text += "; is the agent on the instance still publishing?"
        return text
    return None


def _busy(value: float, threshold: float) -> bool:
    # "Idle" is at least 0 and strictly below the threshold. NaN, a negative value or -inf
    # is a broken datapoint, not a quiet machine: it counts as busy.
    return not 0 <= value < threshold


def protects(value: str) -> bool:
    """Whether a present protect tag with ``value`` protects: unless clearly false.

    >>> [protects(v) for v in ("true", "", "keep", "\\uff54rue", "FALSE", "off", "0")]
    [True, True, True, True, False, False, False]
    """
    return value.lower() not in FALSE_VALUES


def tag_values(tags: Mapping[str, str], key: str) -> tuple[str, ...]:
    """The values of *every* tag whose key is ``key`` by :func:`tag_key`, in the order the
    cloud listed them. Keys that differ only in case or separators are separate tags to
    a cloud (``costguard:keep=false`` next to ``COSTGUARD:KEEP=true``), so a rule asks
    all of them, never the first one found.

    >>> tag_values({"costguard:keep": "false", "COSTGUARD:KEEP": "true"}, KEEP_TAG)
    ('false', 'true')
    """
    wanted = tag_key(key)
    return tuple(value for name, value in tags.items() if tag_key(name) == wanted)


def _tag(tags: Mapping[str, str], key: str) -> str | None:
    """The value of ``key`` when exactly one tag has that key; ``None`` when none does.

    Several values are joined with ``,``: for a time tag that is unreadable, so a rule
    that reads it keeps the instance (see :func:`static_verdict`)."""
    values = tag_values(tags, key)
    return ",".join(values) if values else None


def _protect_tag(instance: Instance, policy: IdlePolicy) -> str | None:
    for keep in tag_values(instance.tags, KEEP_TAG):
        if protects(keep):
            return f"{KEEP_TAG}={keep}"
    for key, wanted in policy.protect_tags:
        for value in tag_values(instance.tags, key):
            if wanted is None or value.strip().lower() == wanted.lower():
                return f"{key}={value}"
    return None


def _keep(code: Reason, reason: str, instance: Instance) -> IdleVerdict:
    return IdleVerdict(Action.KEEP, reason, code, instance)


def static_verdict(instance: Instance, policy: IdlePolicy, now: datetime) -> IdleVerdict | None:
    """The verdict that needs no metrics (not running, no GPU, protected, young), if any.

    Adapters ask metrics only for instances this returns ``None`` for.

    >>> t = datetime(2026, 12, 1, tzinfo=UTC)
    >>> box = Instance("aws", "us-east-1", "i-1", "g5.xlarge", True, 1, t,
    ...                tags={"costguard:keep": "true"})
    >>> static_verdict(box, IdlePolicy(), t).code
    <Reason.PROTECT_TAG: 'protect-tag'>
    """
    if not instance.running:
        state = f" ({instance.state})" if instance.state else ""
        return _keep(Reason.NOT_RUNNING, f"not running{state}", instance)
    if instance.gpu_count <= 0:
        return _keep(Reason.NO_GPU, f"no GPU ({instance.instance_type})", instance)
    if policy.owner is not None:
        owners = tag_values(instance.tags, OWNER_TAG)
        if owners != (policy.owner,):
            said = ", ".join(owners) or "no owner tag"
            return _keep(
                Reason.OTHER_OWNER, f"not {policy.owner}'s ({OWNER_TAG}: {said})", instance
            )
    tag = _protect_tag(instance, policy)
    if tag:
        return _keep(Reason.PROTECT_TAG, f"protected by tag {tag}", instance)
    if instance.protected:
        return _keep(Reason.PROTECTED, "termination/deletion/stop protection is on", instance)
    expires = _tag(instance.tags, EXPIRES_TAG)
    if expires is not None:
        until = parse_timestamp(expires)
        if until is None:
            return _keep(
                Reason.BAD_TAG,
                f"cannot read {EXPIRES_TAG}={expires!r} (use ISO 8601 or Unix seconds)",
                instance,
            )
        if until > now:
            return _keep(
                Reason.EXPIRES_LATER, f"{EXPIRES_TAG} is {format_timestamp(until)}", instance
            )
    if instance.launched_at is None:
        return _keep(Reason.LAUNCH_UNKNOWN, "launch time unknown", instance)
    age = now - instance.launched_at
    if age < timedelta(minutes=policy.grace_minutes):
        minutes = max(0, int(age.total_seconds() // 60))
        return _keep(
            Reason.YOUNG,
            f"started {minutes} min ago, within the {policy.grace_minutes} min grace period",
            instance,
        )
    return None


def _signals(
    samples: InstanceSamples, policy: IdlePolicy, start: datetime
) -> tuple[Signal, ...] | IdleVerdict:
    """The signals that must all be idle, or a keep verdict when the GPU signal is missing
    or in doubt (:func:`_gpu_doubt`)."""
    doubt = _gpu_doubt(samples, policy, start)
    if doubt is not None:
        return _keep(Reason.DOUBT, doubt, samples.instance)
    if samples.gpu_missing is None:
        return (Signal.GPU, Signal.CPU, Signal.NETWORK)
    if policy.gpu_missing_ok:
        return (Signal.CPU, Signal.NETWORK)
    return _keep(
        Reason.NO_GPU_METRICS,
        f"{samples.gpu_missing}; not judged idle without a GPU signal "
        "(--gpu-missing-ok judges by CPU and network alone)",
        samples.instance,
    )


def _gpu_doubt(samples: InstanceSamples, policy: IdlePolicy, start: datetime) -> str | None:
    """Why the GPU series of an adapter that reads per-GPU series cannot be believed.

    Where there is any GPU data, every GPU of the instance must have a per-GPU series with
    a sample in the window, and so must every other series that names it (GPUs are counted
    by name, so a second series for one GPU stands in neither for another GPU nor for the
    same GPU's series that went silent). A GPU without one went silent (its last busy minutes would
    hide), and an instance-level series with no per-GPU series beside it is not what the
    agent publishes: anyone allowed to publish metrics can write it for any instance.
    This holds with ``gpu_missing_ok`` too: that flag is for an instance *without* GPU
    data, not for one whose GPU data disagree.
    """
    per_gpu = samples.per_gpu
    if per_gpu is None or not (samples.gpu or any(series for _, series in per_gpu)):
        return None
    # A GPU is seen when every series that names it has a sample in the window: a second
    # series for a GPU whose own went silent (other dimensions: anyone may publish one)
    # does not vouch for it.
    silent = {gpu for gpu, series in per_gpu if not any(policy.overlaps(s, start) for s in series)}
    live = len({gpu for gpu, _ in per_gpu} - silent)
    gpus = _gpus_known(samples.instance.gpu_count, [gpu for gpu, _ in per_gpu])
    if live >= gpus:
        return None
    if not any(series for _, series in per_gpu):
        return (
            f"an instance-level GPU series but no per-GPU series for its {gpus} GPU(s): "
            "the agent publishes both, anyone allowed to publish metrics can forge the "
            "first; in doubt, kept"
        )
    return (
        f"{live} of {gpus} GPUs are seen in the {policy.idle_minutes} min window by every "
        "per-GPU series that names them: a silent GPU is no evidence of an idle one; in "
        "doubt, kept"
    )


def _gpus_known(count: int, names: Sequence[str]) -> int:
    """How many GPUs an instance has at least: its size's count (``1`` for a size the
    tables lack), each GPU the agent ever named, and, GPUs being numbered from 0 (an
    ``index``, a ``gpu_number``), one more than the highest number named: a GPU the agent
    stopped naming is unknown, never absent.

    >>> _gpus_known(1, ["3"]), _gpus_known(8, ["0", "1"]), _gpus_known(1, ["GPU-ab", "GPU-cd"])
    (4, 8, 2)
    """
    numbers = [int(name) for name in names if name.isascii() and name.isdigit() and len(name) < 7]
    return max(count, len(set(names)), max(numbers, default=-1) + 1)


def _unit(signal: Signal) -> str:
    return " Mbit/s" if signal is Signal.NETWORK else "%"


def shown(value: float) -> str:
    """A reading rounded for people (the exact value stays in ``IdleVerdict.peaks``):
    two decimals, and ``<0.01`` for a trickle that would round to zero.

    >>> [shown(v) for v in (0.000106667, 0.0, 3.14159, 87.0, float("nan"), -2.0)]
    ['<0.01', '0', '3.14', '87', 'nan', '-2']
    """
    if 0 < value < 0.01:
        return "<0.01"
    return f"{round(value, 2):g}" if math.isfinite(value) else f"{value:g}"


def _mark_time(instance: Instance, now: datetime) -> datetime | None:
    """When this instance was marked idle, if its mark is one this reaper could have
    written: after the instance (re)started and not in the future. Any other mark
    (``costguard:idle-since=0``, a copy from an image, one from before a stop/start) is no
    evidence of idle time, so it is marked afresh rather than acted on."""
    text = _tag(instance.tags, MARK_TAG)
    marked = parse_timestamp(text) if text is not None else None
    if marked is None or instance.launched_at is None:
        return None
    return marked if instance.launched_at <= marked <= now else None


def _metrics_verdict(
    samples: InstanceSamples, policy: IdlePolicy, now: datetime
) -> IdleVerdict | dict[Signal, float]:
    """A keep verdict from the metrics, or the peaks of a window that is idle throughout."""
    start = now - policy.window
    signals = _signals(samples, policy, start)
    if isinstance(signals, IdleVerdict):
        return signals
    peaks: dict[Signal, float] = {}
    # (signal, which of its series, its samples in the window, all its samples)
    witnesses: list[tuple[Signal, str, list[Sample], tuple[Sample, ...]]] = []
    for signal in signals:
        for note, series in samples.witnesses(signal):
            # Every sample whose period reaches into the window counts, including the one
            # stamped just before ``start`` (its period began before the window did).
            inside = [s for s in series if policy.overlaps(s, start)]
            witnesses.append((signal, note, inside, series))
            values = [s.value for s in inside]
            if signal in peaks:
                values.append(peaks[signal])
            if values:
                peaks[signal] = max(values, key=lambda v: math.inf if math.isnan(v) else v)
    for signal, note, inside, _ in witnesses:
        threshold = policy.threshold(signal)
        busy = [s for s in inside if _busy(s.value, threshold)]
        if busy:
            first = busy[0]
            return IdleVerdict(
                Action.KEEP,
                f"busy: {signal} {shown(first.value)}{_unit(signal)} "
                f"at {format_timestamp(first.at)} ({note + '; ' if note else ''}"
                f"threshold {shown(threshold)}{_unit(signal)}; {len(busy)} busy sample(s) "
                "in the window)",
                Reason.BUSY,
                samples.instance,
                peaks,
            )
    for signal, _note, _, series in witnesses:
        if not series:
            return IdleVerdict(
                Action.KEEP, f"no {signal} samples", Reason.NO_METRICS, samples.instance, peaks
            )
    for signal, note, inside, _ in witnesses:
        gap = coverage_gap((s.at for s in inside), start, now, policy, signal)
        if gap is not None:
            return IdleVerdict(
                Action.KEEP,
                f"too few {signal} samples to cover the {policy.idle_minutes} min window: "
                f"{gap} ({len(inside)} sample(s){', ' + note if note else ''})",
                Reason.TOO_FEW_SAMPLES,
                samples.instance,
                peaks,
            )
    return peaks


def _idle_text(peaks: Mapping[Signal, float], policy: IdlePolicy) -> str:
    text = ", ".join(f"{s} max {shown(v)}{_unit(s)}" for s, v in peaks.items())
    text = f"idle for {policy.idle_minutes} min ({text})"
    if Signal.GPU not in peaks:
        text += "; no GPU metrics, judged by CPU and network (--gpu-missing-ok)"
    return text


def judge_idle(samples: InstanceSamples, policy: IdlePolicy, now: datetime) -> IdleVerdict:
    """Decide what to do with one instance. Rules in order; the first that applies wins.

    1. Keep what is not running, has no GPU, carries a protect tag, has termination
       protection, a future ``costguard:expires-at``, or started within the grace period.
    2. Keep it when the GPU series is missing (unless ``gpu_missing_ok``), when any sample
       whose period overlaps the window is at or above its threshold, or when the samples
       do not cover the window.
    3. Keep it while its protection is unchecked (``protected is None``).
    4. Otherwise act: the policy's action, or in two-phase mode mark it first and act only
       when it was marked at least one window ago and is still idle (a mark from before
       the instance started, or in the future, is replaced by a fresh one).

    >>> from datetime import datetime, timedelta, timezone
    >>> now = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    >>> box = Instance("aws", "us-east-1", "i-0abc", "g5.xlarge", running=True, gpu_count=1,
    ...                launched_at=now - timedelta(hours=5), protected=False)
    >>> quiet = tuple(Sample(now - timedelta(minutes=m), 1.0) for m in range(0, 65, 5))
    >>> burst = quiet[:4] + (Sample(quiet[4].at, 80.0),) + quiet[5:]
    >>> judge_idle(InstanceSamples(box, gpu=burst, cpu=quiet, network=quiet),
    ...            IdlePolicy(), now).code
    <Reason.BUSY: 'busy'>
    """
    instance = samples.instance
    marked_at = _mark_time(instance, now) if policy.two_phase else None
    verdict = static_verdict(instance, policy, now)
    if verdict is None:
        outcome = _metrics_verdict(samples, policy, now)
        if isinstance(outcome, IdleVerdict):
            verdict = outcome
        else:
            verdict = _idle_verdict(instance, outcome, policy, now, marked_at)
    if (
        verdict.action is Action.KEEP
        and policy.two_phase
        and instance.running
        and _tag(instance.tags, MARK_TAG) is not None
        and verdict.code not in (Reason.MARKED, Reason.PROTECTION_UNCHECKED)
    ):
        return IdleVerdict(
            Action.UNMARK,
            f"{verdict.reason}; removing the {MARK_TAG} mark",
            Reason.NO_LONGER_IDLE,
            instance,
            verdict.peaks,
        )
    return verdict


def _idle_verdict(
    instance: Instance,
    peaks: Mapping[Signal, float],
    policy: IdlePolicy,
    now: datetime,
    marked_at: datetime | None,
) -> IdleVerdict:
    text = _idle_text(peaks, policy)
    if instance.protected is None:
        return IdleVerdict(
            Action.KEEP,
            f"{text}, but termination protection is not checked yet",
            Reason.PROTECTION_UNCHECKED,
            instance,
            peaks,
        )
    if policy.two_phase:
        if marked_at is None:
            return IdleVerdict(Action.MARK, f"{text}; marking it", Reason.IDLE, instance, peaks)
        due = marked_at + policy.window
        if now < due:
            return IdleVerdict(
                Action.KEEP,
                f"{text}; marked {format_timestamp(marked_at)}, acts from "
                f"{format_timestamp(due)} if still idle",
                Reason.MARKED,
                instance,
                peaks,
            )
        text += f"; marked {format_timestamp(marked_at)}"
    return IdleVerdict(policy.action, text, Reason.IDLE, instance, peaks)


class ResourceLimitExceededError(CostguardError):
    """A run selected more instances than its safety limit allows, so it did nothing.

    Structured like cloud-custodian's ``ResourceLimitExceeded``: which limit, its value,
    how many were selected and out of how many.

    >>> err = ResourceLimitExceededError("max-actions", 10, 12, 40)
    >>> err.exit_code, err.message
    (1, '12 of 40 GPU instances were selected, over the max-actions limit of 10; nothing was done')
    """

    def __init__(
        self, limit_type: str, limit: float, selection_count: int, population_count: int
    ) -> None:
        flag = "--max-actions" if limit_type == "max-actions" else "--max-percent"
        super().__init__(
            f"{selection_count} of {population_count} GPU instances were selected, over the "
            f"{limit_type} limit of {limit:g}; nothing was done",
            hint=f"check the report; if it is right, raise {flag} or act in smaller steps "
            "(--region, --protect-tag)",
        )
        self.limit_type = limit_type
        self.limit = limit
        self.selection_count = selection_count
        self.population_count = population_count


@dataclass(frozen=True)
class ReapLimits:
    """How much one run may do: at most ``max_actions`` stops/terminations, and at most
    ``max_percent`` of the running GPU instances seen."""

    max_actions: int = 10
    max_percent: float = 100.0

    def __post_init__(self) -> None:
        if self.max_actions < 0:
            msg = f"max actions must not be negative, not {self.max_actions}"
            raise InputError(msg, hint="e.g. --max-actions 10")
        if not 0 <= self.max_percent <= 100:
            msg = f"max percent must be between 0 and 100, not {self.max_percent:g}"
            raise InputError(msg, hint="e.g. --max-percent 50")


@dataclass(frozen=True)
class LimitBreach:
    """Why a plan does nothing: the limit broken and the counts."""

    limit_type: str
    limit: float
    selection_count: int
    population_count: int

    def error(self) -> ResourceLimitExceededError:
        """The error the command exits with."""
        return ResourceLimitExceededError(
            self.limit_type, self.limit, self.selection_count, self.population_count
        )


@dataclass(frozen=True)
class ReapPlan:
    """All verdicts, and what will be done: every non-keep verdict, or nothing on a breach."""

    verdicts: tuple[IdleVerdict, ...]
    actions: tuple[IdleVerdict, ...]
    population: int
    breach: LimitBreach | None = None

    @property
    def selected(self) -> tuple[IdleVerdict, ...]:
        """Verdicts that ask to stop or terminate (whether or not the plan allows it)."""
        return tuple(v for v in self.verdicts if v.action in DESTRUCTIVE)

    @property
    def usd_per_hour(self) -> Decimal:
        """List price per hour of the selected instances (those the tables price)."""
        return sum(
            (v.instance.usd_per_hour for v in self.selected if v.instance.usd_per_hour),
            Decimal(0),
        )

    @property
    def unpriced(self) -> tuple[IdleVerdict, ...]:
        """Selected instances without a price in the tables (left out of the total)."""
        return tuple(v for v in self.selected if v.instance.usd_per_hour is None)


def gang_verdicts(verdicts: Sequence[IdleVerdict]) -> list[IdleVerdict]:
    """A gang (``costguard launch --nodes``: running instances tagged with one job and one
    attempt) is one job, idle only when all its nodes are: a node asked to be stopped or
    terminated is kept while another node of its gang runs and is kept (busy, young,
    protected...). Tags only ever keep an instance here, never select one.

    >>> from datetime import datetime, timezone
    >>> t = datetime(2026, 12, 1, tzinfo=timezone.utc)
    >>> tags = {JOB_TAG: "cg-a", ATTEMPT_TAG: "2"}
    >>> a, b = (Instance("aws", "r", i, "g5.xlarge", True, 1, t, tags=tags) for i in "ab")
    >>> out = gang_verdicts([IdleVerdict(Action.STOP, "idle", Reason.IDLE, a),
    ...                      IdleVerdict(Action.KEEP, "busy", Reason.BUSY, b)])
    >>> [(v.action.value, v.code.value) for v in out]
    [('keep', 'gang-not-idle'), ('keep', 'busy')]
    """

    def gang(verdict: IdleVerdict) -> tuple[str, str, str] | None:
        job = _tag(verdict.instance.tags, JOB_TAG)
        attempt = _tag(verdict.instance.tags, ATTEMPT_TAG)
        return (verdict.instance.provider, job, attempt or "") if job else None

    busy: dict[tuple[str, str, str], str] = {}
    for verdict in verdicts:
        key = gang(verdict)
        if key and verdict.action is Action.KEEP and verdict.instance.running:
            busy.setdefault(key, verdict.instance.instance_id)
    out = []
    for verdict in verdicts:
        key = gang(verdict)
        other = busy.get(key) if key else None
        if key and other and verdict.action in DESTRUCTIVE:
            reason = f"a node of its gang (job {key[1]}), {other}, is not idle"
            verdict = _keep(Reason.GANG, reason, verdict.instance)
        out.append(verdict)
    return out


def plan_reap(verdicts: Sequence[IdleVerdict], limits: ReapLimits) -> ReapPlan:
    """Apply the safety limits: all selected instances are acted on, or none at all.

    Marks and unmarks only write a tag and are not counted; on a breach they are not done
    either, because a breach means the run's view of the fleet is suspect.

    >>> from datetime import datetime, timezone
    >>> t = datetime(2026, 12, 1, tzinfo=timezone.utc)
    >>> boxes = [Instance("aws", "us-east-1", f"i-{n}", "g5.xlarge", True, 1, t) for n in range(3)]
    >>> stops = [IdleVerdict(Action.STOP, "idle", Reason.IDLE, b) for b in boxes]
    >>> plan = plan_reap(stops, ReapLimits(max_actions=2))
    >>> (len(plan.actions), plan.breach.limit_type, plan.breach.selection_count)
    (0, 'max-actions', 3)
    """
    population = sum(1 for v in verdicts if v.instance.running and v.instance.gpu_count > 0)
    selected = [v for v in verdicts if v.action in DESTRUCTIVE]
    breach = None
    if len(selected) > limits.max_actions:
        breach = LimitBreach("max-actions", limits.max_actions, len(selected), population)
    elif len(selected) * 100 > limits.max_percent * population:
        breach = LimitBreach("max-percent", limits.max_percent, len(selected), population)
    actions = () if breach else tuple(v for v in verdicts if v.action is not Action.KEEP)
    return ReapPlan(tuple(verdicts), actions, population, breach)
