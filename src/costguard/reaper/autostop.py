"""The autostop rule, pure: when the readings of a machine say it has been idle long enough.

:func:`decide_shutdown` is the rule ``costguard agent`` applies on the instance
(:mod:`costguard.reaper.agent` takes the readings and acts): shut down when every reading
of the last ``idle_minutes`` is idle, with the reaper's window rule (no gap longer than
one and a half intervals, the newest recent). No clock, no I/O: the readings and the time
are arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise

from costguard.errors import InputError
from costguard.reaper.policy import IdlePolicy, Signal, format_timestamp


@dataclass(frozen=True, slots=True)
class Reading:
    """One look at the machine. ``None`` means the signal could not be read."""

    at: datetime
    gpu_util_percent: float | None
    cpu_percent: float | None
    network_mbps: float | None
    jobs: int = 0
    ssh_sessions: int = 0

    def __str__(self) -> str:
        def shown(value: float | None, unit: str) -> str:
            return "none" if value is None else f"{value:.1f}{unit}"

        return (
            f"{format_timestamp(self.at)} gpu={shown(self.gpu_util_percent, '%')} "
            f"cpu={shown(self.cpu_percent, '%')} net={shown(self.network_mbps, 'Mbit/s')} "
            f"jobs={self.jobs} ssh={self.ssh_sessions}"
        )


@dataclass(frozen=True)
class AgentPolicy:
    """When the agent shuts the machine down.

    >>> AgentPolicy(interval_seconds=0)
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: the interval must be between 1 and 3600 seconds, not 0
    """

    idle_minutes: int = 60
    gpu_threshold_percent: float = 5.0
    cpu_threshold_percent: float = 5.0
    network_threshold_mbps: float = 1.0
    interval_seconds: int = 60
    jobs_keep_awake: bool = True
    ssh_keeps_awake: bool = True
    gpu_missing_ok: bool = False
    window_rule: IdlePolicy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.interval_seconds <= 3600:
            msg = f"the interval must be between 1 and 3600 seconds, not {self.interval_seconds}"
            raise InputError(msg, hint="e.g. --interval-seconds 60")
        # The reaper's rule does the validation and the window arithmetic: a reading may be
        # late by half an interval (a slow nvidia-smi), and the newest must be recent.
        rule = IdlePolicy(
            idle_minutes=self.idle_minutes,
            gpu_threshold_percent=self.gpu_threshold_percent,
            cpu_threshold_percent=self.cpu_threshold_percent,
            network_threshold_mbps=self.network_threshold_mbps,
            grace_minutes=0,
            sample_period_seconds=self.interval_seconds,
            max_lag_seconds=2 * self.interval_seconds,
            gpu_max_lag_seconds=2 * self.interval_seconds,
        )
        object.__setattr__(self, "window_rule", rule)


@dataclass(frozen=True)
class AgentDecision:
    """Whether to shut down now, and why (a sentence for the log)."""

    shutdown: bool
    reason: str


def busy_reason(reading: Reading, policy: AgentPolicy) -> str | None:
    """Why this reading is busy, or ``None`` when it is idle.

    >>> from datetime import UTC
    >>> now = datetime(2026, 12, 1, tzinfo=UTC)
    >>> busy_reason(Reading(now, 0.0, 1.0, 0.1, jobs=1), AgentPolicy())
    'a costguard run job is running'
    >>> busy_reason(Reading(now, 0.0, 1.0, 0.1, jobs=1), AgentPolicy(jobs_keep_awake=False))
    """
    if reading.jobs and policy.jobs_keep_awake:
        return "a costguard run job is running"
    if reading.ssh_sessions and policy.ssh_keeps_awake:
        return f"{reading.ssh_sessions} SSH session(s) open"
    if reading.gpu_util_percent is None:
        if not policy.gpu_missing_ok:
            return "no GPU reading (is nvidia-smi installed?); --gpu-missing-ok ignores the GPU"
    elif not 0 <= reading.gpu_util_percent < policy.gpu_threshold_percent:
        return f"GPU {reading.gpu_util_percent:.1f}%"
    # Idle is from 0 up to the threshold; NaN or a negative rate is a broken reading.
    if reading.cpu_percent is None or not 0 <= reading.cpu_percent < policy.cpu_threshold_percent:
        return "CPU " + (
            "unreadable" if reading.cpu_percent is None else f"{reading.cpu_percent:.1f}%"
        )
    if reading.network_mbps is None or not (
        0 <= reading.network_mbps < policy.network_threshold_mbps
    ):
        shown = (
            "unreadable" if reading.network_mbps is None else f"{reading.network_mbps:.2f} Mbit/s"
        )
        return f"network {shown}"
    return None


def decide_shutdown(
    readings: Sequence[Reading], policy: AgentPolicy, now: datetime
) -> AgentDecision:
    """Shut down when every reading of the window is idle and the readings cover it.

    The agent must itself have watched the whole window: right after a (re)start it waits
    a full window, whatever happened before.

    >>> from datetime import UTC
    >>> t = datetime(2026, 12, 1, tzinfo=UTC)
    >>> quiet = [Reading(t + timedelta(minutes=m), 0.0, 1.0, 0.0) for m in range(61)]
    >>> decide_shutdown(quiet, AgentPolicy(), t + timedelta(minutes=60)).shutdown
    True
    >>> decide_shutdown(quiet[-30:], AgentPolicy(), t + timedelta(minutes=60)).reason
    'idle for 29 of 60 min'
    """
    start = now - policy.window_rule.window
    # A reading is stamped when it was taken and measures CPU and network since the one
    # before, so every reading taken at or after ``start`` describes part of the window.
    inside = [r for r in readings if r.at >= start]
    for reading in reversed(inside):
        why = busy_reason(reading, policy)
        if why:
            return AgentDecision(False, f"busy at {format_timestamp(reading.at)}: {why}")
    # The agent must have been watching since the window began, so it never stops early.
    watching = min((r.at for r in readings), default=now) <= start
    if not watching or not _watched([r.at for r in inside], start, now, policy.window_rule):
        watched = (now - min(r.at for r in inside)) if inside else timedelta(0)
        minutes = int(watched.total_seconds() // 60)
        return AgentDecision(False, f"idle for {minutes} of {policy.idle_minutes} min")
    return AgentDecision(True, f"idle for {policy.idle_minutes} min")


def _watched(times: Sequence[datetime], start: datetime, end: datetime, rule: IdlePolicy) -> bool:
    """Whether readings taken at ``times`` leave no gap in ``[start, end]``.

    Readings are taken every interval but may run late (a slow nvidia-smi), so the
    spacing may reach one and a half intervals; the newest must be recent.
    """
    ordered = sorted(times)
    if not ordered:
        return False
    if any(later - earlier > rule.max_gap for earlier, later in pairwise([start, *ordered])):
        return False
    return end - ordered[-1] <= rule.max_lag(Signal.CPU)
