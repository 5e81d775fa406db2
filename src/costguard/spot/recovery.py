"""Where to run next, and when to stop: a pure function of the job's history.

The controller records each attempt (the offer it ran on, how it ended) and asks
:func:`decide` what to do. The rules, in order:

1. An attempt still running: wait, unless the money spent so far has reached
   ``max_total_usd`` (then stop; the controller terminates the instance).
2. The last attempt exited 0: the job is done. Stopped by someone else: stop too.
3. More non-preemption failures than ``max_failures`` allows, more failed launches than
   ``max_launch_failures``, or ``max_attempts`` reached: the job failed.
4. Otherwise launch: on spot until ``max_preemptions`` interruptions, then on-demand.
   Places (``provider/region[/zone]``) interrupted or out of capacity within
   ``backoff_s`` go to the back of the queue, the most recent last, so after a
   preemption the next attempt runs in another zone (or region) whenever one exists.
   A region hit ``region_backoff_hits`` times within ``backoff_s`` (in any of its zones)
   is backed off as a whole: its zones not hit yet come after those of other regions.
   Among the places hit, only when they were hit counts: a lost or preempted attempt's
   zone is never the next one while a place hit earlier is offered.
   Among the rest the cheapest wins (zones of one region share its price, so the move
   after a first preemption is usually to a sibling zone).
5. Never launch when the money spent plus one more hour at the chosen price would pass
   ``max_total_usd``.

No I/O, no clock: ``now_unix`` comes in as an argument, so every rule is unit-testable.

>>> spot = Offer("aws", "us-east-1", "g5.xlarge", Market.SPOT, Decimal("0.5"), "A10G", 1)
>>> other = Offer("aws", "us-west-2", "g5.xlarge", Market.SPOT, Decimal("0.6"), "A10G", 1)
>>> decide((), (spot, other), Limits(), now_unix=0.0).offer.region
'us-east-1'
>>> hit = Attempt(1, spot, 0.0, ended_unix=60.0, outcome=AttemptOutcome.PREEMPTED)
>>> decide((hit,), (spot, other), Limits(), now_unix=60.0).offer.region
'us-west-2'
>>> from dataclasses import replace
>>> a, b, c = (replace(spot, zone=f"us-east-1{z}") for z in "abc")
>>> west = replace(other, zone="us-west-2a")
>>> decide((replace(hit, offer=a),), (a, b, c, west), Limits(), 60.0).offer.zone
'us-east-1b'
>>> twice = (replace(hit, offer=a), replace(hit, number=2, offer=b, ended_unix=90.0))
>>> decide(twice, (a, b, c, west), Limits(), 90.0).offer.zone
'us-west-2a'
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from costguard import contract
from costguard.pricing.catalog import Market
from costguard.spot.launcher.base import Handle, Offer, State

SECONDS_PER_HOUR = Decimal(3600)
#: The wrapper's exit code after a notice-triggered save ("run me again").
EXIT_PREEMPTED = contract.EXIT_PREEMPTED


class AttemptOutcome(enum.Enum):
    """How an attempt ended."""

    SUCCEEDED = "succeeded"  # exit 0 recorded by ``costguard run``
    FAILED = "failed"  # a nonzero exit that no preemption explains
    PREEMPTED = "preempted"  # reclaimed by the provider (with or without a notice)
    LOST = "lost"  # gone without an exit record and without the provider saying why
    STOPPED = "stopped"  # stopped by someone else (the reaper, a person)
    LAUNCH_FAILED = "launch-failed"  # the provider refused (capacity, quota, price)


#: Outcomes that count as an interruption: the place is backed off from, and on spot
#: they count towards ``max_preemptions``.
INTERRUPTIONS = frozenset({AttemptOutcome.PREEMPTED, AttemptOutcome.LOST})


@dataclass(frozen=True)
class Attempt:
    """One launch of the job and what became of it (``outcome`` is ``None`` while it runs)."""

    number: int
    offer: Offer
    launched_unix: float
    handle: Handle | None = None
    ended_unix: float | None = None
    outcome: AttemptOutcome | None = None
    exit_code: int | None = None
    detail: str = ""
    #: The latest complete checkpoint step when the attempt started / ended.
    resumed_step: int | None = None
    last_step: int | None = None
    #: Seconds of work since the last checkpoint, lost when it was killed without a save.
    lost_s: float = 0.0
    #: Steps done after the last checkpoint and lost with the attempt: 0 when a notice was
    #: honoured (the emergency save holds them), estimated from the attempt's pace when it
    #: was killed without a save, ``None`` when unknown.
    lost_steps: int | None = None
    #: The idempotency token its launch request carried (written before the call, so a
    #: controller that died before it learnt the instance can find it by the token).
    token: str = ""
    #: A gang (``launch --nodes``): the instances it bills, and every node's handle in
    #: node-rank order once launched (``handle`` is node 0's); empty for one instance.
    node_count: int = 1
    nodes: tuple[Handle, ...] = ()

    @property
    def instances(self) -> tuple[Handle, ...]:
        """Every instance of the attempt known so far: the gang's nodes, or its one."""
        if self.nodes:
            return self.nodes
        return (self.handle,) if self.handle is not None else ()

    @property
    def usd_per_hour(self) -> Decimal:
        """What the attempt bills an hour: the offer's price times its nodes."""
        return self.offer.usd_per_hour * self.node_count

    @property
    def running(self) -> bool:
        """Whether it has not ended yet."""
        return self.outcome is None

    def hours(self, now_unix: float) -> Decimal:
        """Instance-hours billed so far (a failed launch bills nothing).

        >>> o = Offer("aws", "r", "t", Market.SPOT, Decimal("1"), "A10G", 1)
        >>> Attempt(1, o, 0.0, ended_unix=5400.0, outcome=AttemptOutcome.SUCCEEDED).hours(9e9)
        Decimal('1.5')
        """
        if self.outcome is AttemptOutcome.LAUNCH_FAILED:
            return Decimal(0)
        end = self.ended_unix if self.ended_unix is not None else now_unix
        seconds = max(0.0, end - self.launched_unix)
        return Decimal(repr(seconds)) / SECONDS_PER_HOUR

    def cost_usd(self, now_unix: float) -> Decimal:
        """Hours times the offer's hourly price, times the gang's nodes.

        >>> o = Offer("aws", "r", "t", Market.SPOT, Decimal("1"), "A10G", 1)
        >>> Attempt(1, o, 0.0, ended_unix=3600.0, node_count=2).cost_usd(9e9)
        Decimal('2.0')
        """
        return self.hours(now_unix) * self.usd_per_hour


@dataclass(frozen=True)
class Limits:
    """What the user allows (``costguard launch`` flags)."""

    spot: bool = True
    max_preemptions: int = 3
    max_total_usd: Decimal | None = None
    max_failures: int = 0
    max_launch_failures: int = 5
    max_attempts: int = 50
    backoff_s: float = 3600.0
    #: Interruptions (or refusals) in one region within ``backoff_s`` after which the
    #: whole region is backed off, not only the zones hit; 0: zones only.
    region_backoff_hits: int = 2
    #: ``--nodes``: an attempt bills this many instances of the offer.
    nodes: int = 1


@dataclass(frozen=True)
class Wait:
    """The current attempt runs: poll again later."""

    reason: str = "running"


@dataclass(frozen=True)
class Launch:
    """Start attempt ``number`` on ``offer``."""

    offer: Offer
    number: int
    reason: str


@dataclass(frozen=True)
class Finish:
    """The job is over: ``succeeded``, ``failed`` or ``stopped`` (a limit was reached)."""

    status: str
    reason: str
    notes: tuple[str, ...] = field(default=())


Decision = Wait | Launch | Finish


def classify(state: State, exit_code: int | None, market: Market) -> AttemptOutcome | None:
    """How an attempt ended, from the provider's state and the wrapper's exit record.

    The exit record wins when there is one: 0 is success whatever the instance does
    next, 75 is an honoured notice. A nonzero exit on an instance the provider reclaimed
    is a preemption (the kill caused it). ``None``: it still runs.

    >>> classify(State.RUNNING, None, Market.SPOT) is None
    True
    >>> classify(State.RUNNING, 0, Market.SPOT), classify(State.PREEMPTED, 137, Market.SPOT)
    (<AttemptOutcome.SUCCEEDED: 'succeeded'>, <AttemptOutcome.PREEMPTED: 'preempted'>)
    >>> classify(State.TERMINATED, None, Market.SPOT), classify(State.RUNNING, 1, Market.SPOT)
    (<AttemptOutcome.LOST: 'lost'>, <AttemptOutcome.FAILED: 'failed'>)
    """
    if exit_code == 0:
        return AttemptOutcome.SUCCEEDED
    if exit_code == EXIT_PREEMPTED or state is State.PREEMPTED:
        return AttemptOutcome.PREEMPTED
    if exit_code is not None:
        return AttemptOutcome.FAILED
    if state in (State.PENDING, State.RUNNING):
        return None
    if state is State.STOPPED:
        return AttemptOutcome.STOPPED
    return AttemptOutcome.LOST


#: What a node's own end says of the rest of its gang, most telling first: a node the
#: provider took back (or that vanished) explains the others' collective errors, so an
#: interruption wins over a failure, and the gang succeeded only when every node did.
GANG_PRECEDENCE = (
    AttemptOutcome.PREEMPTED,
    AttemptOutcome.LOST,
    AttemptOutcome.FAILED,
    AttemptOutcome.STOPPED,
    AttemptOutcome.SUCCEEDED,
)


def gang_outcome(
    nodes: Sequence[tuple[AttemptOutcome | None, int | None]], *, settled: bool
) -> int | None:
    """Which node's end is the gang's (its index in ``nodes``), or ``None`` while the gang
    runs. ``nodes``: each node's outcome (:func:`classify`; ``None``: it runs) and exit code.

    Any node's end ends the attempt (one node cannot go on alone: its collectives wait for
    the others), except that nodes which exited 0 or 75 by themselves (a finished run, a
    save on a notice every node honours) give the others time to do the same, until
    ``settled``. The node whose outcome comes first in :data:`GANG_PRECEDENCE` speaks for
    the gang.

    >>> P, S = AttemptOutcome.PREEMPTED, AttemptOutcome.SUCCEEDED
    >>> gang_outcome([(None, None), (None, None)], settled=False) is None
    True
    >>> gang_outcome([(None, None), (P, 75)], settled=False) is None  # node 0 saves too
    True
    >>> gang_outcome([(None, None), (P, None)], settled=False)  # node 1 killed: all end
    1
    >>> gang_outcome([(AttemptOutcome.FAILED, 1), (P, None)], settled=False)
    1
    >>> gang_outcome([(S, 0), (None, None)], settled=True)
    0
    """
    ended = [(i, outcome, code) for i, (outcome, code) in enumerate(nodes) if outcome is not None]
    if not ended:
        return None
    clean = all(code in (0, EXIT_PREEMPTED) for _, _, code in ended)
    if len(ended) < len(nodes) and clean and not settled:
        return None
    return min(ended, key=lambda e: GANG_PRECEDENCE.index(e[1]))[0]


def spent_usd(attempts: Iterable[Attempt], now_unix: float) -> Decimal:
    """What the job has cost so far: every attempt's instance-hours times its price."""
    return sum((a.cost_usd(now_unix) for a in attempts), Decimal(0))


def interruptions(attempts: Iterable[Attempt], market: Market = Market.SPOT) -> int:
    """How many attempts in ``market`` were preempted or lost."""
    return sum(1 for a in attempts if a.offer.market is market and a.outcome in INTERRUPTIONS)


def market_for(attempts: Sequence[Attempt], offers: Sequence[Offer], limits: Limits) -> Market:
    """Spot until ``max_preemptions`` interruptions, then on-demand (when any is offered).

    >>> o = Offer("aws", "r", "t", Market.SPOT, Decimal("1"), "A10G", 1)
    >>> market_for((), (o,), Limits(spot=False)), market_for((), (o,), Limits())
    (<Market.ON_DEMAND: 'on-demand'>, <Market.SPOT: 'spot'>)
    """
    on_demand = any(o.market is Market.ON_DEMAND for o in offers)
    if not limits.spot:
        return Market.ON_DEMAND
    if interruptions(attempts) >= limits.max_preemptions and on_demand:
        return Market.ON_DEMAND
    return Market.SPOT


def choose_offer(
    attempts: Sequence[Attempt], offers: Sequence[Offer], limits: Limits, now_unix: float
) -> Offer | None:
    """The offer for the next attempt, or ``None`` when none is in the market wanted.

    Places hit (interrupted or refused) within ``backoff_s`` go last, ordered by when
    they were hit, the most recent last of all: spot capacity is reclaimed per pool (an
    instance type in one zone), so the place that took an instance back a moment ago is
    the one known to be short now, whatever its region's record. Before them, the places
    not hit of regions backed off as a whole (:func:`hot_regions`); before those, the
    rest, verified prices first (an unverified price may be a placeholder), then
    cheapest first (ties by place, for stability).
    """
    market = market_for(attempts, offers, limits)
    pool = [o for o in offers if o.market is market]
    if not pool:
        return None
    hit: dict[str, float] = {}
    for attempt in recent_hits(attempts, limits, now_unix):
        when = _hit_time(attempt)
        hit[attempt.offer.place] = max(hit.get(attempt.offer.place, when), when)
    hot = hot_regions(attempts, limits, now_unix)

    def key(offer: Offer) -> tuple[bool, float, bool, bool, Decimal, str, str]:
        return (
            offer.place in hit,
            hit.get(offer.place, 0.0),  # among places hit, the least recent first
            offer.region_place in hot,  # among the others, backed-off regions last
            not offer.verified,  # a verified price before a cheaper unverified one
            offer.usd_per_hour,
            offer.place,
            offer.instance_type,
        )

    return min(pool, key=key)


def _hit_time(attempt: Attempt) -> float:
    return attempt.ended_unix if attempt.ended_unix is not None else attempt.launched_unix


def recent_hits(attempts: Iterable[Attempt], limits: Limits, now_unix: float) -> list[Attempt]:
    """Attempts interrupted or refused within ``backoff_s`` of ``now_unix``."""
    return [
        a
        for a in attempts
        if (a.outcome in INTERRUPTIONS or a.outcome is AttemptOutcome.LAUNCH_FAILED)
        and now_unix - _hit_time(a) < limits.backoff_s
    ]


def hot_regions(attempts: Iterable[Attempt], limits: Limits, now_unix: float) -> set[str]:
    """``provider/region`` places hit at least ``region_backoff_hits`` times recently.

    >>> from dataclasses import replace
    >>> o = Offer("aws", "us-east-1", "g5.xlarge", Market.SPOT, Decimal("1"), "A10G", 1)
    >>> hit = AttemptOutcome.PREEMPTED
    >>> hits = [Attempt(n, replace(o, zone=z), 0.0, ended_unix=10.0, outcome=hit)
    ...         for n, z in ((1, "us-east-1a"), (2, "us-east-1b"))]
    >>> hot_regions(hits[:1], Limits(), 20.0), hot_regions(hits, Limits(), 20.0)
    (set(), {'aws/us-east-1'})
    >>> hot_regions(hits, Limits(region_backoff_hits=0), 20.0)
    set()
    """
    if limits.region_backoff_hits <= 0:
        return set()
    counts: dict[str, int] = {}
    for attempt in recent_hits(attempts, limits, now_unix):
        region = attempt.offer.region_place
        counts[region] = counts.get(region, 0) + 1
    return {region for region, n in counts.items() if n >= limits.region_backoff_hits}


def decide(
    attempts: Sequence[Attempt], offers: Sequence[Offer], limits: Limits, now_unix: float
) -> Decision:
    """What the controller does next; see the module docstring for the rules."""
    spent = spent_usd(attempts, now_unix)
    last = attempts[-1] if attempts else None
    if last is not None and last.running:
        if limits.max_total_usd is not None and spent >= limits.max_total_usd:
            return Finish(
                "stopped", f"max-total reached: spent ${spent:.2f} of ${limits.max_total_usd}"
            )
        return Wait()
    if last is not None and last.outcome is AttemptOutcome.SUCCEEDED:
        return Finish("succeeded", f"attempt {last.number} exited 0")
    if last is not None and last.outcome is AttemptOutcome.STOPPED:
        return Finish("stopped", f"attempt {last.number} was stopped outside costguard")
    failures = sum(1 for a in attempts if a.outcome is AttemptOutcome.FAILED)
    if failures > limits.max_failures:
        code = last.exit_code if last is not None else None
        return Finish(
            "failed",
            f"the job exited with code {code} ({failures} failure(s), "
            f"--max-failures {limits.max_failures})",
        )
    refused = sum(1 for a in attempts if a.outcome is AttemptOutcome.LAUNCH_FAILED)
    if refused > limits.max_launch_failures:
        return Finish("failed", f"{refused} launches were refused by the provider")
    if len(attempts) >= limits.max_attempts:
        return Finish("failed", f"{len(attempts)} attempts, the most allowed")
    offer = choose_offer(attempts, offers, limits, now_unix)
    if offer is None:
        return Finish("failed", "no offer fits the GPU, region, market and price cap")
    hourly = offer.usd_per_hour * limits.nodes
    if limits.max_total_usd is not None and spent + hourly > limits.max_total_usd:
        nodes = f" ({limits.nodes} nodes)" if limits.nodes > 1 else ""
        return Finish(
            "stopped",
            f"max-total: spent ${spent:.2f}, one more hour at ${hourly}/h{nodes} would "
            f"pass ${limits.max_total_usd}",
        )
    number = (last.number + 1) if last is not None else 1
    return Launch(offer, number, _launch_reason(last, offer, attempts, limits))


def _launch_reason(
    last: Attempt | None, offer: Offer, attempts: Sequence[Attempt], limits: Limits
) -> str:
    if last is None:
        return f"first attempt, cheapest fitting offer ({offer.market.value})"
    cause = last.outcome.value if last.outcome is not None else "ended"
    text = f"attempt {last.number} {cause} in {last.offer.place}"
    if offer.market is Market.ON_DEMAND and limits.spot:
        text += f"; {interruptions(attempts)} interruption(s): falling back to on-demand"
    if offer.place != last.offer.place:
        text += f"; moving to {offer.place}"
        if offer.region_place == last.offer.region_place and offer.zone:
            text += " (another zone of the region, at the region's price)"
    hot = hot_regions(attempts, limits, _hit_time(last))
    if last.offer.region_place in hot and offer.region_place != last.offer.region_place:
        text += (
            f"; {last.offer.region_place} backed off ({limits.region_backoff_hits}+ recent hits)"
        )
    return text
