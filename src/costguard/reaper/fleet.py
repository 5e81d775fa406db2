"""The reaper's thin loop: list, sample, judge, confirm, plan, and (with ``execute``) act.

Each cloud adapter is a :class:`Fleet` (one per region, project or subscription). The loop
asks metrics only for instances the metric-free rules leave open, asks the (per-instance,
on AWS) protection check only for instances that would be acted on, applies the limits to
the whole run at once, and acts in batches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol, TypeVar

from costguard.pricing.catalog import Catalog, InstancePrice, Market
from costguard.reaper.policy import (
    Action,
    IdlePolicy,
    IdleVerdict,
    Instance,
    InstanceSamples,
    ReapLimits,
    ReapPlan,
    Reason,
    gang_verdicts,
    judge_idle,
    plan_reap,
    static_verdict,
)
from costguard.settings import Settings

#: Fleets (regions) asked at once: each waits on its cloud's API, not on this machine.
MAX_CONCURRENT_FLEETS = 8

_F = TypeVar("_F")
_T = TypeVar("_T")


@dataclass(frozen=True)
class ActionOutcome:
    """What happened when an action was carried out on one instance."""

    instance: Instance
    action: Action
    ok: bool
    message: str = ""


class Fleet(Protocol):
    """One cloud scope (AWS region, GCP project, Azure subscription) as the loop sees it."""

    provider: str
    #: How its metrics API samples (the idle window is judged on it).
    sampling: Sampling

    def instances(self) -> list[Instance]:
        """Every pending or running instance in scope (one paginated listing)."""
        ...

    def samples(
        self, instances: Sequence[Instance], start: datetime, end: datetime
    ) -> list[InstanceSamples]:
        """GPU, CPU and network samples for ``instances``, batched: every sample whose
        period overlaps ``[start, end]``, stamped with the start of its period (so the
        adapter asks its API from one period before ``start``)."""
        ...

    def confirm_protection(self, instances: Sequence[Instance]) -> list[Instance]:
        """The same instances with ``protected`` filled in."""
        ...

    def apply(
        self, action: Action, instances: Sequence[Instance], now: datetime
    ) -> list[ActionOutcome]:
        """Stop, terminate, mark or unmark ``instances`` in batches; one outcome each."""
        ...


class PriceBook:
    """GPU facts and hourly list prices by instance type, from the bundled price tables.

    >>> from costguard.pricing.tables import load_catalog
    >>> book = PriceBook(load_catalog())
    >>> book.gpus("aws", "g5.xlarge"), book.gpus("aws", "m5.large"), book.gpus("aws", "x9.huge")
    (('A10G', 1), (None, 0), None)
    >>> book.usd_per_hour("aws", "us-east-1", "g5.xlarge", spot=False)
    Decimal('1.006')
    >>> "westeurope" in book.regions("azure")
    True
    """

    def __init__(self, catalog: Catalog) -> None:
        self._rows: dict[tuple[str, str, str], list[InstancePrice]] = {}
        self._types: dict[tuple[str, str], tuple[str | None, int]] = {}
        self._regions: dict[str, set[str]] = {}
        for region in catalog.regions:
            self._regions.setdefault(region.provider, set()).add(region.name)
        for row in catalog.instances:
            self._rows.setdefault((row.provider, row.region, row.instance_type), []).append(row)
            known = (row.accelerator, row.accelerator_count) if row.accelerator else (None, 0)
            self._types.setdefault((row.provider, row.instance_type), known)

    def regions(self, provider: str) -> tuple[str, ...]:
        """The provider's region names in the tables (what ``--region`` is checked against)."""
        return tuple(sorted(self._regions.get(provider, ())))

    def gpus(self, provider: str, instance_type: str) -> tuple[str | None, int] | None:
        """``(accelerator, count)`` for a type in the tables (any region); ``None`` if unknown."""
        return self._types.get((provider, instance_type))

    def usd_per_hour(
        self,
        provider: str,
        region: str,
        instance_type: str,
        *,
        spot: bool,
        accelerator: str | None = None,
        accelerator_count: int | None = None,
    ) -> Decimal | None:
        """The list price in ``region``; ``None`` when the tables do not have it.

        GCP N1 rows differ by attached GPU, so ``accelerator``/``accelerator_count`` pick
        the row when given.
        """
        rows = self._rows.get((provider, region, instance_type), [])
        if accelerator is not None:
            rows = [r for r in rows if r.accelerator == accelerator]
        if accelerator_count is not None:
            rows = [r for r in rows if r.accelerator_count == accelerator_count]
        if len(rows) != 1:
            return None
        return rows[0].usd_per_hour(Market.SPOT if spot else Market.ON_DEMAND)


@dataclass(frozen=True)
class Sampling:
    """How a provider's metrics API samples: the period one datapoint stands for, and how
    late the newest may be (CPU and network; the GPU agent's own) before the window counts
    as not covered. Each fleet class carries its provider's as ``sampling``."""

    period_seconds: int
    max_lag_seconds: int
    gpu_max_lag_seconds: int

    def policy(self, **rules: Any) -> IdlePolicy:
        """An :class:`IdlePolicy` with ``rules`` (thresholds, window, action...) on this
        sampling.

        >>> Sampling(60, 300, 180).policy(idle_minutes=30).sample_period_seconds
        60
        """
        return IdlePolicy(
            sample_period_seconds=self.period_seconds,
            max_lag_seconds=self.max_lag_seconds,
            gpu_max_lag_seconds=self.gpu_max_lag_seconds,
            **rules,
        )


@dataclass(frozen=True)
class FleetRequest:
    """Which instances a command looks at: its location flags (``options``: ``regions``,
    ``all_regions``, ``zones``, ``project``, ``subscription``, ``resource_group``), the
    prices, the settings, and the AWS regions to look at when none is asked for.

    Each adapter's ``for_options(request)`` turns it into its fleets, names checked offline.
    """

    options: Mapping[str, Any]
    prices: PriceBook
    settings: Settings
    default_regions: Sequence[str] = ()


@dataclass(frozen=True)
class ReapReport:
    """One run: the plan, what was done (empty in a dry run), and the rule it applied."""

    plan: ReapPlan
    outcomes: tuple[ActionOutcome, ...]
    executed: bool
    now: datetime
    policy: IdlePolicy
    limits: ReapLimits

    @property
    def failures(self) -> tuple[ActionOutcome, ...]:
        """Actions that were tried and failed."""
        return tuple(o for o in self.outcomes if not o.ok)

    @property
    def usd_per_hour_saved(self) -> Decimal:
        """List price per hour of the instances actually stopped or terminated."""
        return sum(
            (
                o.instance.usd_per_hour
                for o in self.outcomes
                if o.ok and o.action in (Action.STOP, Action.TERMINATE) and o.instance.usd_per_hour
            ),
            Decimal(0),
        )


def across(
    fleets: Sequence[_F],
    work: Callable[[_F], _T],
    on_done: Callable[[_F], None] | None = None,
) -> list[_T]:
    """``work(fleet)`` for every fleet, :data:`MAX_CONCURRENT_FLEETS` at a time; the results
    in the fleets' order. ``on_done`` runs on the calling thread as each fleet finishes (a
    progress bar). After a failure no more fleets start, and the error of the first failed
    fleet, in the fleets' order, is raised once the running ones end.
    """
    from concurrent.futures import ThreadPoolExecutor, wait

    results: dict[int, _T] = {}
    failed: dict[int, BaseException] = {}
    workers = max(1, min(MAX_CONCURRENT_FLEETS, len(fleets)))
    pool = ThreadPoolExecutor(workers, thread_name_prefix="costguard-fleet")
    try:
        pending = {pool.submit(work, fleet): n for n, fleet in enumerate(fleets)}
        while pending and not failed:
            done, _ = wait(pending, return_when="FIRST_COMPLETED")
            for future in done:
                n = pending.pop(future)
                if future.exception() is not None:
                    failed[n] = future.exception()  # type: ignore[assignment]
                    continue
                results[n] = future.result()
                if on_done is not None:
                    on_done(fleets[n])
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    for future, n in pending.items():
        if not future.cancelled() and future.exception() is not None:
            failed[n] = future.exception()  # type: ignore[assignment]
    if failed:
        raise failed[min(failed)]
    return [results[n] for n in range(len(fleets))]


def _key(instance: Instance) -> tuple[str, str, str]:
    return (instance.provider, instance.region, instance.instance_id)


def judge_fleet(fleet: Fleet, policy: IdlePolicy, now: datetime) -> list[IdleVerdict]:
    """Verdicts for every instance of one fleet, with as few cloud calls as the rules allow.

    Example: ``judge_fleet(AwsFleet("us-east-1", prices), IdlePolicy(), now)``.
    """
    seen = fleet.instances()
    open_ = [i for i in seen if static_verdict(i, policy, now) is None]
    sampled = {_key(s.instance): s for s in fleet.samples(open_, now - policy.window, now)}

    def judged(instance: Instance) -> IdleVerdict:
        samples = sampled.get(_key(instance), InstanceSamples(instance))
        return judge_idle(replace(samples, instance=instance), policy, now)

    verdicts = [judged(i) for i in seen]
    unchecked = [v.instance for v in verdicts if v.code is Reason.PROTECTION_UNCHECKED]
    if unchecked:
        confirmed = {_key(i): i for i in fleet.confirm_protection(unchecked)}
        verdicts = [judged(confirmed.get(_key(v.instance), v.instance)) for v in verdicts]
    return verdicts


def reap(
    fleets: Sequence[Fleet],
    policy: IdlePolicy,
    limits: ReapLimits,
    now: datetime,
    *,
    execute: bool,
    on_judged: Callable[[Fleet], None] | None = None,
) -> ReapReport:
    """Judge every fleet (several at once, :func:`across`; ``on_judged`` as each is
    judged), plan within the limits, and act only when ``execute`` is true.

    A breach of the limits, or a dry run, changes nothing in any cloud. ``now`` is passed
    in so that tests (and what-if runs) control the clock. Example::

        prices = PriceBook(load_catalog())
        fleets = [AwsFleet(region, prices) for region in ("us-east-1", "us-west-2")]
        report = reap(fleets, IdlePolicy(idle_minutes=90), ReapLimits(), datetime.now(UTC),
                      execute=False)
        for verdict in report.plan.verdicts:
            print(verdict.instance.instance_id, verdict.action, verdict.reason)
    """
    owners: dict[tuple[str, str, str], Fleet] = {}
    verdicts: list[IdleVerdict] = []
    judged = across(fleets, lambda fleet: judge_fleet(fleet, policy, now), on_judged)
    for fleet, fleet_verdicts in zip(fleets, judged, strict=True):
        for verdict in fleet_verdicts:
            owners[_key(verdict.instance)] = fleet
            verdicts.append(verdict)
    plan = plan_reap(gang_verdicts(verdicts), limits)
    outcomes: list[ActionOutcome] = []
    if execute and plan.breach is None:
        for fleet in fleets:
            for action in (Action.STOP, Action.TERMINATE, Action.MARK, Action.UNMARK):
                chosen = [
                    v.instance
                    for v in plan.actions
                    if v.action is action and owners[_key(v.instance)] is fleet
                ]
                if chosen:
                    outcomes.extend(fleet.apply(action, chosen, now))
    return ReapReport(plan, tuple(outcomes), execute, now, policy, limits)
