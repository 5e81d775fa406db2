"""What ``costguard launch`` and ``costguard jobs status`` say about a job, as values.

The estimate before a launch (:func:`estimate_lines`), and the report after it: the JSON
document (:func:`job_document`), the attempts table (:func:`attempt_rows`) and the summary
lines (:func:`summary_lines`); for ``costguard burn``, a job's spend still to come
(:func:`job_burn`). The command renders them; only :func:`latest_checkpoint`,
:func:`projection_of` and :func:`job_burn` read the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from costguard.checkpoint.pace import Pace
from costguard.errors import CostguardError
from costguard.money import duration, format_usd
from costguard.pricing.catalog import Market
from costguard.retry import RetryPolicy
from costguard.shell import command
from costguard.spot.controller import Summary, instances_label, summarise
from costguard.spot.job import RUNNING, Job, JobSpec, attempt_doc, spec_doc
from costguard.spot.launcher.base import Offer
from costguard.spot.projection import Projection
from costguard.spot.projection import document as projection_doc
from costguard.text import visible

#: What ``--max-price`` does on each provider, besides filtering the offers.
MAX_PRICE_REACH = {
    "aws": "filters the offers and is sent as the spot MaxPrice",
    "azure": "filters the offers and is sent as billingProfile.maxPrice",
    "gcp": "filters the offers only: GCP Spot VMs take no price cap",
    "local": "filters the offers (simulated: nothing is billed)",
}

#: The attempts table's columns, in order.
ATTEMPT_COLUMNS = ("#", "where", "market", "$/h", "instance", "outcome", "exit", "steps", "cost")


def usd(amount: Decimal) -> str:
    """Dollars for the report: cents, or four decimals below a dollar (a short local run).

    >>> usd(Decimal("0.00123")), usd(Decimal("12.5"))
    ('$0.0012', '$12.50')
    """
    return format_usd(amount, rate=amount < 1)


def estimate_lines(
    spec: JobSpec,
    offer: Offer,
    fallback: Offer | None,
    as_of: str,
    offers: Sequence[Offer] = (),
    pace: Pace | None = None,
) -> list[str]:
    """The estimate shown before the confirmation; a line indented by two spaces belongs to
    the line before it. An unverified price is said to be one, and so is a cheaper
    unverified offer in ``offers`` that the pick passed over. With ``--total-steps`` and a
    pace recorded in the store (a pilot's, an earlier run's), the projection and whether
    it passes ``--max-total``."""
    simulated = " (simulated on this machine; priced as" if spec.provider == "local" else ""
    where = f"{offer.instance_type} {offer.market.value} in {offer.region}"
    nodes = spec.nodes
    gang = f"{nodes} nodes of " if nodes > 1 else ""
    hourly = offer.usd_per_hour * nodes
    price = format_usd(offer.usd_per_hour, rate=True)
    if nodes > 1:
        price = f"{nodes} x {price}/h = {format_usd(hourly, rate=True)}"
    lines = [
        f"job {spec.job_id}: {gang}{spec.gpu_count} x {spec.gpu} on {spec.provider}{simulated}"
        + (f" {where})" if simulated else f": {where}"),
        f"  price: {price}/h (list price, prices as of {as_of}; excludes disk, egress and taxes)",
    ]
    if not offer.verified:
        lines.append(
            "  unverified price: no verified offer fits, and this one is suspect or not read "
            "from a source (`costguard pricing show gpu_instances --unverified` says why)"
        )
    cheaper = [
        o
        for o in offers
        if not o.verified and o.market is offer.market and o.usd_per_hour < offer.usd_per_hour
    ]
    if offer.verified and cheaper:
        other = min(cheaper, key=lambda o: o.usd_per_hour)
        lines.append(
            f"  a cheaper unverified price exists: {other.instance_type} {other.market.value} "
            f"in {other.region} at {format_usd(other.usd_per_hour, rate=True)}/h"
        )
    if spec.hours:
        lines.append(
            f"  estimate: {format_usd(hourly * spec.hours)} for {spec.hours} h "
            "if nothing is preempted"
        )
    lines += gang_plan(spec, offer)
    cap = spec.max_total_usd
    lines += launch_projection(spec, offer, pace)
    if cap is not None:
        lines.append(
            f"  cap: --max-total {format_usd(cap)} (about {cap / hourly:.1f} h "
            "at this price); the job stops before passing it"
        )
    else:
        lines.append("  cap: none (--max-total sets one)")
    lines.append(
        f"  zones: picked at launch among {offer.region}'s zones, each priced at the region's "
        "list price (the price tables are per region); a preempted zone is backed off first, "
        "then the region after repeated preemptions"
    )
    if spec.max_usd_per_hour is not None:
        lines.append(
            f"  --max-price {format_usd(spec.max_usd_per_hour, rate=True)}/h (spot): "
            + MAX_PRICE_REACH.get(spec.provider, "filters the offers")
        )
    if spec.spot and fallback is not None:
        each = f"{nodes} x " if nodes > 1 else ""
        lines.append(
            f"  after {spec.max_preemptions} preemption(s): on-demand {each}"
            f"{fallback.instance_type} in {fallback.region} at "
            f"{format_usd(fallback.usd_per_hour, rate=True)}/h"
        )
    if spec.sync_dir is not None:
        where = "this machine" if spec.provider == "local" else "the instance (under its workdir"
        lines.append(
            f"  --sync-dir {spec.sync_dir} on {where}"
            + ("" if spec.provider == "local" else " when relative)")
            + f": each checkpoint the trainer finishes there is kept in {spec.checkpoint_url}, "
            "and the newest is put back there before each attempt starts"
        )
    sim = spec.simulation
    if sim is not None:
        if sim.at_s:
            when = "notices at " + ", ".join(f"{t:g}" for t in sim.at_s) + " s"
        else:
            kind = f"random (seed {sim.seed}), mean " if sim.seed is not None else ""
            every = (sim.every_s or 0.0) / spec.nodes
            when = f"a notice {kind}{every:g} s into each spot attempt"
            if spec.nodes > 1:
                when += f" (to one node: each node's {sim.every_s:g} s, the first of {spec.nodes})"
        grace = f"{sim.notice_s:g} s" if sim.notice_s else "the cloud's notice time"
        lines.append(
            f"  simulator: {when}, in {offer.region.split(':')[0]}'s metadata format; "
            f"killed {grace} after the notice if still running"
        )
    return lines


#: A node's preemptions a day that the plan of a cloud gang assumes (the price tables
#: hold no rate; ``costguard estimate --interruptions-per-day`` prices another).
NODE_PREEMPTIONS_PER_DAY = Decimal(1)


def gang_plan(spec: JobSpec, offer: Offer) -> list[str]:
    """What a gang (``--nodes``) adds to the plan: how it starts, saves and relaunches,
    and its preemptions, about ``nodes`` times a node's (any node's stops them all;
    :func:`costguard.pricing.interruptions.gang_per_day`); with ``--hours``, the number
    expected in that time. A node's rate is the simulator's (``--preempt-every``, each
    node's) or :data:`NODE_PREEMPTIONS_PER_DAY`, said as an assumption."""
    from costguard.pricing.interruptions import Checkpointing, expected, gang_per_day

    nodes = spec.nodes
    if nodes <= 1:
        return []
    procs = spec.procs_per_node or max(1, offer.gpu_count)
    lines = [
        f"  gang: {nodes} instances started together, all or none, in one zone; each runs "
        f"torchrun --nnodes {nodes} --nproc-per-node {procs} (c10d rendezvous at node 0) "
        "under costguard run; a notice to any node saves every node at the same step, and "
        "the whole gang is relaunched"
    ]
    if offer.market is not Market.SPOT:
        return lines
    sim = spec.simulation
    if sim is not None and sim.every_s:
        node_rate = Decimal(86400) / Decimal(repr(sim.every_s))
        basis = f"--preempt-every {sim.every_s:g} s per node"
    else:
        node_rate = NODE_PREEMPTIONS_PER_DAY
        basis = f"assumed {node_rate} a day per node; costguard estimate --interruptions-per-day"
        basis += " prices another rate"
    rate = gang_per_day(node_rate, nodes)
    lines.append(
        f"  gang preemptions: any node's stops all {nodes}, so about {nodes} x a node's "
        f"rate: {rate.normalize():f} a day ({basis})"
    )
    if spec.hours:
        every = Decimal(repr(spec.every_minutes)) if spec.every_minutes else Decimal(30)
        try:
            figures = expected(spec.hours, Checkpointing(every, Decimal(60), Decimal(5), rate))
        except CostguardError as exc:
            lines.append(f"    over {spec.hours} h: {exc.message}")
        else:
            lines.append(
                f"    over {spec.hours} h: about {figures.expected_preemptions:.1f} expected "
                f"(a checkpoint every {every:g} min, 60 s saves, 5 min restarts), "
                f"{figures.effective_hours:.2f} h with reruns = "
                f"{format_usd(figures.effective_hours * offer.usd_per_hour * nodes)}"
            )
    return lines


def launch_projection(spec: JobSpec, offer: Offer, pace: Pace | None) -> list[str]:
    """What ``--total-steps`` cost at a pace the store holds, before the launch."""
    total = spec.total_steps
    if pace is None or total is None or not pace.steps_measured:
        return []
    seconds = total * pace.wall_seconds_per_step
    usd_total = offer.usd_per_hour * Decimal(str(seconds)) / 3600
    lines = [
        f"  projection: {total} steps x {pace.wall_seconds_per_step:.3g} s/step (measured on "
        f"{pace.device}{', a pilot' if pace.pilot else ''}) = {duration(seconds)}, "
        f"{usd(usd_total)} if nothing is preempted"
    ]
    cap = spec.max_total_usd
    if cap is not None and usd_total > cap:
        then = (
            "--stop-at-projection saves and stops the job once its projection passes it"
            if spec.stop_at_projection
            else "the job stops when the money is spent, unfinished"
        )
        lines.append(f"  Warning: the projection passes --max-total {format_usd(cap)}: {then}")
    return lines


def latest_checkpoint(url: str) -> dict[str, Any] | None:
    """The newest committed checkpoint of the job (the final one once it succeeded)."""
    from costguard.checkpoint.inventory import inventory
    from costguard.spot.prepare import open_store

    try:
        entries = inventory(open_store(url), verify_latest=False)
    except CostguardError:
        return None
    latest = next((e for e in entries if e.latest), None)
    if latest is None:
        return None
    return {"name": latest.name, "step": latest.step, "reason": latest.reason}


def projection_of(job: Job, url: str, now_unix: float) -> Projection | None:
    """The job's projection from the pace its script recorded in the store at ``url``
    (the one asked about, not the URL job.json names): ``None`` without one, when the
    store cannot be read now (the report goes on without it), or when the record is not
    costguard's (named in a warning)."""
    from costguard.checkpoint.pace import read_pace_or_warn
    from costguard.spot.prepare import open_store
    from costguard.spot.projection import of_job

    try:
        pace = read_pace_or_warn(open_store(url))
    except CostguardError:
        return None
    return of_job(job, pace, now_unix)


@dataclass(frozen=True)
class JobBurn:
    """A job for ``costguard burn``: what it has spent and what its projection still
    spends; ``error``: why its job record could not be read (``job`` is then ``None``),
    ``note``: why it has no projection."""

    url: str
    job: Job | None = None
    #: Its attempts' instance-hours at their prices so far (``None``: unread).
    spent_usd: Decimal | None = None
    projection: Projection | None = None
    error: str = ""
    note: str = ""

    @property
    def remaining_usd(self) -> Decimal | None:
        """The spend still to come: nothing once the job has ended, the projected total
        less the spend so far while it runs; ``None`` when unknown."""
        if self.job is None:
            return None
        if self.job.status != RUNNING:
            return Decimal(0)
        p = self.projection
        if p is None or p.projected_total_usd is None:
            return None
        return p.projected_total_usd - p.spent_usd


#: ``burn --job``: a store that does not answer is named soon, not after a save's patience.
BURN_RETRY = RetryPolicy(attempts=2, base_delay_s=0.2, max_delay_s=1.0)


def job_burn(url: str, now_unix: float) -> JobBurn:
    """The job at checkpoint ``url`` and its projection; a store or record that cannot be
    read is said in the result, never raised (``burn`` goes on with the other jobs). Read
    only: a missing local folder is not made, and a store is retried once."""
    from costguard.checkpoint.pace import read_pace
    from costguard.checkpoint.store import Store, storage_options_from_env
    from costguard.spot.job import load_job
    from costguard.spot.prepare import normal_url
    from costguard.spot.projection import of_job
    from costguard.spot.recovery import spent_usd

    try:
        options = storage_options_from_env()
        store = Store.open(normal_url(url), options, retry=BURN_RETRY, create=False)
        job = load_job(store)
    except CostguardError as exc:
        return JobBurn(url, error=str(exc))
    spent = spent_usd(job.attempts, now_unix)
    if job.status != RUNNING:
        return JobBurn(url, job, spent, note=f"{job.status}: nothing more to spend")
    try:
        pace = read_pace(store)
    except CostguardError as exc:
        return JobBurn(url, job, spent, note=str(exc))
    projection = of_job(job, pace, now_unix)
    if pace is None:
        note = "no pace recorded yet (the script's Checkpointer writes job/pace.json)"
    elif projection is None:
        note = "its total steps are unknown (launch --total-steps, Checkpointer(total_steps=N))"
    elif projection.projected_total_usd is None:
        note = "no attempt runs now: the rest is unpriced until one does"
    else:
        note = ""
    return JobBurn(url, job, spent, projection, note=note)


def job_burn_document(item: JobBurn) -> dict[str, Any]:
    """A job in ``burn --format json``."""
    job, p = item.job, item.projection
    current = job.current if job is not None else None
    return {
        "url": item.url,
        "job_id": job.spec.job_id if job is not None else None,
        "status": job.status if job is not None else None,
        "instance_id": current.handle.instance_id if current and current.handle else None,
        "usd_per_hour": current.usd_per_hour if current is not None else None,
        "spent_usd": item.spent_usd,
        "projected_total_usd": p.projected_total_usd if p is not None else None,
        "remaining_usd": item.remaining_usd,
        "projection": projection_doc(p) if p is not None else None,
        "note": item.note or None,
        "error": item.error or None,
    }


def job_status(url: str) -> dict[str, Any]:
    """The job at checkpoint ``url`` as ``costguard jobs status --format json`` reports it:
    attempts, cost so far, and with a recorded pace its ``projection`` (finish time,
    projected total). The notebook API (``costguard.job_status(url)``).
    """
    import time

    from costguard.errors import InputError
    from costguard.settings import Settings
    from costguard.spot.job import load_job
    from costguard.spot.prepare import normal_url, offers_for, open_store

    url = normal_url(url)
    job = load_job(open_store(url))
    try:
        offers = offers_for(Settings.load({}), job.spec)
    except InputError:
        offers = []
    now = time.time()
    return job_document(job, offers, now, latest_checkpoint(url), projection_of(job, url, now))


def job_document(
    job: Job,
    offers: Sequence[Offer],
    now_unix: float,
    checkpoint: dict[str, Any] | None,
    projection: Projection | None = None,
) -> dict[str, Any]:
    """The report for scripts (``--format json``)."""
    summary = summarise(job, offers, now_unix)
    return {
        "elapsed_s": round(now_unix - job.spec.created_unix, 1),
        "projection": None if projection is None else projection_doc(projection),
        "job_id": job.spec.job_id,
        "status": job.status,
        "reason": job.reason,
        "checkpoint_url": job.spec.checkpoint_url,
        "latest_checkpoint": checkpoint,
        "controller": job.controller,
        "heartbeat_age_s": round(now_unix - job.heartbeat_unix, 1),
        "summary": {
            "attempts": summary.attempts,
            "preemptions": summary.preemptions,
            "failures": summary.failures,
            "nodes": summary.nodes,
            "relaunches": summary.relaunches,
            "last_step": summary.last_step,
            "lost_steps": summary.lost_steps,
            "lost_s": round(summary.lost_s, 2),
            "wall_s": round(summary.wall_s, 2),
            "running_s": round(summary.running_s, 2),
            "overhead_s": round(summary.overhead_s, 2),
            "cost_usd": summary.spent_usd,
            "estimate_usd": summary.estimate_usd,
            "on_demand_usd": summary.on_demand_usd,
            "cost_basis": "instance-hours x list price of each attempt's offer (a zone at "
            "its region's price: the price tables are per region)"
            + (" (simulated: nothing was billed)" if job.spec.provider == "local" else ""),
        },
        "kept_stopped": list(job.kept_stopped),
        "spec": spec_doc(job.spec),
        "attempts": [attempt_doc(a) for a in job.attempts],
    }


def attempt_rows(job: Job, now_unix: float) -> list[list[str]]:
    """One row per attempt, in :data:`ATTEMPT_COLUMNS` order."""
    rows = []
    for a in job.attempts:
        steps = f"{a.resumed_step if a.resumed_step is not None else 0}"
        steps += f"->{a.last_step}" if a.last_step is not None else "->?"
        row = [
            str(a.number),
            a.offer.place,
            a.offer.market.value,
            format_usd(a.usd_per_hour, rate=True),
            instances_label(a),
            a.outcome.value if a.outcome else "running",
            "" if a.exit_code is None else str(a.exit_code),
            steps,
            usd(a.cost_usd(now_unix)),
        ]
        rows.append([visible(cell) for cell in row])  # read from job.json
    return rows


def summary_lines(
    job: Job,
    offers: Sequence[Offer],
    now_unix: float,
    checkpoint: dict[str, Any] | None,
    projection: Projection | None = None,
) -> list[str]:
    """What the table's figures add up to; a line indented by two spaces continues the
    line before it."""
    summary = summarise(job, offers, now_unix)
    lost = "unknown" if summary.lost_steps is None else str(summary.lost_steps)
    simulated = job.spec.provider == "local"
    lines = [
        f"{job.status}: {job.reason}" if job.reason else job.status,
        f"attempts {summary.attempts}, preemptions {summary.preemptions}, "
        f"failures {summary.failures}, lost steps {lost} ({summary.lost_s:.1f} s of work)",
        *gang_lines(summary),
        f"time: {summary.wall_s:.1f} s wall, {summary.running_s:.1f} s running, "
        f"overhead {summary.overhead_s:.1f} s (relaunch gaps + lost work)",
        ("what it would have cost: " if simulated else "real cost: ")
        + f"{usd(summary.spent_usd)} (instance-hours x list price, zones at their region's"
        + (", spot as simulated)" if simulated else ")"),
    ]
    if summary.on_demand_usd is not None:
        lines.append(f"the same hours on-demand: {usd(summary.on_demand_usd)}")
    if summary.estimate_usd is not None:
        lines.append(f"estimate before launch: {usd(summary.estimate_usd)}")
    for kept in job.kept_stopped:
        lines.append(f"stopped by the provider and kept: {kept}")
    if projection is not None:
        lines += projection_lines(job, projection, now_unix)
    if checkpoint is not None:
        final = "final checkpoint" if job.status == "succeeded" else "newest checkpoint"
        lines.append(f"{final}: step {checkpoint['step']} ({checkpoint['name']})")
        export = ("costguard", "checkpoint", "export", job.spec.checkpoint_url)
        lines.append(f"  the weights: {command(*export, '--to', 'model.safetensors')}")
    return lines


def gang_lines(summary: Summary) -> list[str]:
    """What a gang's report adds: its nodes, and that each preemption of one node ended
    and relaunched all of them (none for one instance)."""
    if summary.nodes <= 1:
        return []
    return [
        f"gang of {summary.nodes} nodes (instances in node-rank order, $/h for all of them): "
        f"{summary.preemptions} preemption(s) of a node, {summary.relaunches} relaunch(es) "
        "of the whole gang"
    ]


def interrupted_line(url: str, *, released: bool) -> str:
    """What a launch stopped by Ctrl-C says: the job runs on, and what takes over."""
    return (
        "interrupted: the job keeps running unsupervised; "
        f"{command('costguard', 'launch', '--attach', url)} takes over"
        + ("" if released else " (with --force: this controller could not release it)")
    )


def projection_lines(job: Job, p: Projection, now_unix: float) -> list[str]:
    """The finish time and the projected total of a job with a measured pace."""
    from datetime import UTC, datetime

    elapsed = duration(now_unix - job.spec.created_unix)
    if p.steps_done >= p.total_steps:
        finish = "all steps done"
    else:
        at = datetime.fromtimestamp(p.finish_unix, UTC).strftime("%Y-%m-%d %H:%M UTC")
        finish = f"finish in {duration(p.left_s)} (about {at})"
    lines = [
        f"elapsed {elapsed}; step {p.steps_done} of {p.total_steps} "
        f"({p.fraction_done:.0%}) at {p.seconds_per_step:.3g} s/step measured; {finish}"
    ]
    if p.projected_total_usd is None:
        lines.append("projected total: unknown while no attempt runs (its price decides it)")
        return lines
    price = "" if p.usd_per_hour is None else f" at {format_usd(p.usd_per_hour, rate=True)}/h"
    lines.append(
        f"projected total: {usd(p.projected_total_usd)} (spent {usd(p.spent_usd)} + the "
        f"rest{price}; relaunches after preemptions not included)"
    )
    cap = job.spec.max_total_usd
    if cap is not None and p.projected_total_usd > cap:
        lines.append(f"  over --max-total {format_usd(cap)}: the job would stop before it ends")
    return lines
