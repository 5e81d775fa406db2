"""What every launcher adapter offers the controller.

An adapter turns an :class:`Offer` plus a :class:`LaunchSpec` into one running
instance (or local process), reports what became of it, and terminates it. It makes no
decisions: where to run, when to give up and when to fall back to on-demand belong to
:mod:`costguard.spot.recovery`.
"""

from __future__ import annotations

import abc
import enum
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import ClassVar

from costguard.errors import CostguardError, InputError

# The one Market (spot or on-demand): an offer is bought the way its price was listed.
from costguard.pricing.catalog import Market
from costguard.spot.launcher.options import Options
from costguard.tags import (
    ARRAY_TAG,
    ARRAY_TASK_TAG,
    ATTEMPT_TAG,
    EXPIRES_TAG,
    IDLE_MINUTES_TAG,
    JOB_TAG,
    OWNER_TAG,
)


@dataclass(frozen=True)
class Offer:
    """One place to run: a priced instance type in a region (and optionally a zone)."""

    provider: str
    region: str
    instance_type: str
    market: Market
    usd_per_hour: Decimal
    gpu: str
    gpu_count: int
    zone: str = ""
    #: ``False`` when the tables mark this price unverified (suspect, or not read from a
    #: source): launch prefers a verified offer and says when it picks one that is not.
    verified: bool = True

    @property
    def place(self) -> str:
        """``provider/region[/zone]``: what the recovery policy backs off from."""
        return f"{self.region_place}/{self.zone}" if self.zone else self.region_place

    @property
    def region_place(self) -> str:
        """``provider/region``: what repeated interruptions in several zones back off from."""
        return f"{self.provider}/{self.region}"


@dataclass(frozen=True)
class LaunchSpec:
    """Everything an adapter needs besides the offer; the same for every attempt."""

    job_id: str
    checkpoint_url: str
    command: tuple[str, ...]
    owner: str
    expires_at: datetime
    idle_minutes: int = 30
    every_steps: int | None = None
    every_minutes: float | None = None
    #: ``--total-steps``: the whole run's steps (``costguard run`` records the pace with it).
    total_steps: int | None = None
    #: ``--max-price``: the spot price cap, sent to the provider where it takes one (AWS
    #: ``SpotOptions.MaxPrice``, Azure ``billingProfile.maxPrice``; GCP Spot VMs have none).
    max_usd_per_hour: Decimal | None = None
    #: Provider-specific settings (image, subnet, key name, project, subscription,
    #: resource group, instance profile / service account / identity, disk size...).
    options: Mapping[str, str] = field(default_factory=dict)
    #: ``--sync-dir``: the folder the trainer writes its own checkpoints in, on the instance.
    sync_dir: str | None = None
    #: ``--pilot-steps``: the script is stopped after so many steps, their pace recorded.
    pilot_steps: int | None = None
    #: The job's environment as launch recorded it (no secrets; the local simulator's).
    environment: Mapping[str, str] = field(default_factory=dict)
    #: The job's key (hex), which makes its stop requests: a secret, kept by the
    #: controller; the attempts get only their :meth:`stop_check`.
    job_key: str = field(default="", repr=False)
    #: ``--nodes``: instances started together, all or none, one ``torchrun`` each, that
    #: the controller treats as one attempt (1: a single instance).
    nodes: int = 1
    #: ``--procs-per-node``: the processes each node's ``torchrun`` starts (``None``: one
    #: per GPU of the offer).
    procs_per_node: int | None = None
    #: ``--array``: the array's job id, this task's index (the ``costguard:array`` and
    #: ``costguard:array-task`` tags; ``COSTGUARD_ARRAY_TASK_ID`` on the instance) and the
    #: array's URL (where the costguard wheel its instances install is kept); empty and
    #: ``None`` for a single job.
    array_id: str = ""
    array_task: int | None = None
    array_url: str = ""

    def stop_check(self, attempt: int) -> str:
        """What attempt ``attempt`` checks its stop requests by (``COSTGUARD_STOP_CHECK``;
        no secret: :func:`costguard.proof.stop_check`); empty without a job key."""
        from costguard.proof import stop_check

        return stop_check(bytes.fromhex(self.job_key), self.job_id, attempt) if self.job_key else ""

    def told_public(self, attempt: int) -> str:
        """What attempt ``attempt``'s gang nodes check their told rank and rendezvous by
        (the public half of :func:`costguard.proof.told_public`; no secret); empty without
        a job key."""
        from costguard.proof import told_public

        if not self.job_key:
            return ""
        return told_public(bytes.fromhex(self.job_key), self.job_id, attempt)

    def run_options(self) -> list[str]:
        """The options of ``costguard run`` that every attempt of the job starts with.

        >>> from datetime import datetime, UTC
        >>> LaunchSpec("j", "s3://b/j", ("t",), "me", datetime.now(UTC), every_minutes=10,
        ...            sync_dir="out/").run_options()
        ['--every-minutes', '10.0', '--sync-dir', 'out/']
        """
        options: list[str] = []
        if self.every_steps is not None:
            options += ["--every-steps", str(self.every_steps)]
        if self.every_minutes is not None:
            options += ["--every-minutes", repr(float(self.every_minutes))]
        if self.total_steps is not None:
            options += ["--total-steps", str(self.total_steps)]
        if self.sync_dir is not None:
            options += ["--sync-dir", self.sync_dir]
        if self.pilot_steps is not None:
            options += ["--pilot-steps", str(self.pilot_steps)]
        return options

    def tags(self, attempt: int) -> dict[str, str]:
        """The tags every instance of this job carries (provider spelling applied later),
        with the array's id and the task's index for a task of an array."""
        tags = {
            JOB_TAG: self.job_id,
            OWNER_TAG: self.owner,
            ATTEMPT_TAG: str(attempt),
            EXPIRES_TAG: self.expires_at.isoformat(timespec="seconds"),
            IDLE_MINUTES_TAG: str(self.idle_minutes),
        }
        if self.array_task is not None:
            tags |= {ARRAY_TAG: self.array_id, ARRAY_TASK_TAG: str(self.array_task)}
        return tags


class State(enum.Enum):
    """What the provider says about an instance, reduced to what recovery needs."""

    PENDING = "pending"  # requested, not yet running
    RUNNING = "running"
    PREEMPTED = "preempted"  # reclaimed by the provider (spot interruption, eviction)
    STOPPED = "stopped"  # stopped/deallocated by someone (reaper, user)
    TERMINATED = "terminated"  # gone, reason unknown or ours
    MISSING = "missing"  # the provider no longer knows it


@dataclass(frozen=True)
class Handle:
    """A launched instance: enough to describe or terminate it later, from ``job.json``."""

    provider: str
    region: str
    instance_id: str
    zone: str = ""
    #: Anything else the adapter needs later (GCP project, Azure resource group, local pid).
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Status:
    handle: Handle
    state: State
    detail: str = ""  # the provider's own words (state reason, eviction message)
    launched_at: datetime | None = None


def launch_token(job_id: str, attempt: int) -> str:
    """The idempotency token of attempt ``attempt``'s launch (at most 64 printable ASCII
    characters, EC2's ``ClientToken`` limit): the controller writes it to ``job.json``
    before the launch call, so a controller that dies before it learns the instance can
    find it again (job ids carry a random part, so no two jobs share a token).

    >>> launch_token("run-1", 2)
    'costguard-run-1-2'
    >>> len(launch_token("x" * 80, 2))
    64
    """
    token = f"costguard-{job_id}-{attempt}"
    if len(token) <= 64 and token.isascii() and token.isprintable():
        return token
    digest = hashlib.sha256(token.encode()).hexdigest()
    return f"costguard-{digest}"[:64]


@dataclass(frozen=True)
class Stopped:
    """An attempt's instance that the provider stopped rather than deleted (GCP host
    maintenance; a Spot VM whose termination action is STOP), proven to be the job's: its
    persistent disks bill on while it exists."""

    handle: Handle
    disk_gb: int
    #: Why costguard must keep it whatever the checkpoints say ("" when it may go).
    kept_because: str = ""
    #: The command that deletes it, for the report.
    delete_command: str = ""


class Launcher(abc.ABC):
    """One provider: the base every adapter extends. Every method makes bounded calls and
    raises ``CostguardError``.

    Four methods each adapter must write (:meth:`launch`, :meth:`status`,
    :meth:`terminate`, :meth:`find`); the abilities only some providers have come with a
    default here, so the controller and the CLI call them on any launcher and never look
    for them: :meth:`zones` (none: the provider places the instance), :meth:`resume`
    (a lost launch found by its idempotency token: AWS), :meth:`statuses` (many
    instances described at once: one :meth:`status` each), :meth:`stopped` (an instance the
    provider stopped rather than deleted: GCP), :meth:`release` (what a gang's job holds
    besides its instances), :meth:`close` and :attr:`state_dir` (a
    local launcher's processes and logs). Options are declared in :attr:`OPTIONS` and
    checked by :meth:`check` through :meth:`Options.check
    <costguard.spot.launcher.options.Options.check>`.

    One attempt is one instance (one :class:`Handle`), or, for a gang of ``spec.nodes``
    nodes, the handles :meth:`launch_gang` returns, in node-rank order: the controller
    reads each one's :meth:`status` and ends the attempt on any node's end.
    """

    provider: ClassVar[str] = ""
    #: The ``--option`` keys this provider reads (those of the boot script besides).
    OPTIONS: ClassVar[Options] = Options()
    #: Where attempts keep their output on this machine (``--provider local``), for the
    #: CLI to follow; ``None``: on the provider's instances, nothing to follow here.
    state_dir: Path | None = None

    def option_defaults(self) -> Mapping[str, str]:
        """The launcher's own values of required options (a project, a subscription it
        was built with), used when the job's options leave them out."""
        return {}

    def check(self, spec: LaunchSpec) -> None:
        """Validate credentials/options before anything is created (``InputError`` if bad);
        by default every declared option of :attr:`OPTIONS`."""
        self.OPTIONS.check(spec.options, self.provider, self.option_defaults())

    @abc.abstractmethod
    def launch(self, offer: Offer, spec: LaunchSpec, attempt: int) -> Handle:
        """Create the instance (or process) running the job's attempt ``attempt``."""

    @abc.abstractmethod
    def status(self, handle: Handle) -> Status:
        """What became of it."""

    def statuses(self, handles: Sequence[Handle]) -> list[Status]:
        """What became of each of ``handles``, in their order: what a poll of many
        instances reads (every running task of an array, a gang's nodes).

        The default asks :meth:`status` of each; an adapter whose provider describes many
        instances in one call (EC2 ``DescribeInstances``, a Compute Engine aggregated
        list, Resource Manager's status listing) overrides it through :meth:`batched`.
        """
        return [self.status(handle) for handle in handles]

    def batched(
        self, handles: Sequence[Handle], listed: Callable[[Sequence[Handle]], Mapping[int, Status]]
    ) -> list[Status]:
        """:meth:`statuses` from one listing: ``listed(handles)`` answers, by position in
        ``handles``, the statuses its calls showed; an instance it showed running or
        starting is taken from it, and every other (ended, or not shown: a fresh launch
        not listed yet, a VM gone) is asked of :meth:`status`, whose own rules (a
        preemption's system event, a fresh instance described again) stay the only ones
        that end an attempt. One handle is asked of :meth:`status` alone (one call
        either way)."""
        if len(handles) <= 1:
            return [self.status(handle) for handle in handles]
        shown = listed(handles)
        out = []
        for at, handle in enumerate(handles):
            found = shown.get(at)
            live = found is not None and found.state in (State.RUNNING, State.PENDING)
            out.append(found if found is not None and live else self.status(handle))
        return out

    @abc.abstractmethod
    def terminate(self, handle: Handle) -> None:
        """Delete it; idempotent (an already-gone instance is fine)."""

    @abc.abstractmethod
    def find(self, job_id: str) -> Sequence[Handle]:
        """Live instances tagged with ``job_id`` (``--attach`` must not launch a duplicate)."""

    def launch_gang(self, offer: Offer, spec: LaunchSpec, attempt: int) -> tuple[Handle, ...]:
        """Create the ``spec.nodes`` instances of attempt ``attempt`` together, all or
        none, in one zone, each told its node rank and the rendezvous at node 0; their
        handles in node-rank order.

        All or none: when the provider cannot give every node, none is left running or
        billed (a :class:`CapacityError`, so recovery tries another place). The default
        launches a single instance and refuses a gang: each adapter opts in to what its
        provider does at once (a fleet, a bulk insert).
        """
        if spec.nodes == 1:
            return (self.launch(offer, spec, attempt),)
        msg = f"--nodes {spec.nodes}: the {self.provider} launcher starts one instance per attempt"
        raise InputError(msg, hint="drop --nodes, or use costguard slurm script --nodes")

    def zones(self, region: str, instance_type: str = "") -> Sequence[str]:
        """The zones of ``region`` an attempt may be placed in (where ``instance_type`` is
        offered, when the provider says), in a stable order; empty (the default): the
        provider places it.

        The price tables are per region, so every zone is priced at its region's price;
        the zones only give recovery somewhere to move within a region after a preemption.
        """
        return ()

    def resume(
        self, offer: Offer, spec: LaunchSpec, attempt: int, token: str, launched_unix: float
    ) -> Handle | None:
        """The instance of a launch whose answer was lost, found by its idempotency token
        ``token`` (sent at ``launched_unix``); ``None`` (the default) when there is none or
        the provider cannot tell, and the listing by tag (:meth:`find`) is what finds it."""
        return None

    def stopped(self, handle: Handle, job_id: str) -> Stopped | None:
        """An attempt's instance the provider stopped rather than deleted (GCP host
        maintenance), when it is provably the job's; ``None`` (the default) otherwise."""
        return None

    def release(self, spec: LaunchSpec) -> None:  # noqa: B027 - an ability with a default
        """Delete what the launcher made for the job ``spec`` besides its instances (a
        gang's security group or firewall rule, placement group, launch templates), once
        the job is over and its last attempt's instances are terminated; idempotent, and
        only what is tagged with the job and its owner. Bounded: what is still in use after
        a while is named, with the command that deletes it, in a :class:`CostguardError`.
        The default made nothing."""

    def close(self) -> None:  # noqa: B027 - an ability with a default, not abstract
        """Release what the launcher holds on this machine (servers, processes); the
        default holds nothing."""


class CapacityError(CostguardError):
    """The provider has no capacity (or no quota) for the offer in that place right now.

    Raised by :meth:`Launcher.launch` when trying another zone, region or market may
    work, so recovery can back off from :attr:`place` instead of giving up; ``code`` is
    the provider's own (``InsufficientInstanceCapacity``, ``ZONE_RESOURCE_POOL_EXHAUSTED``,
    ``SkuNotAvailable``...).
    """

    def __init__(self, message: str, *, place: str, code: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint or "costguard tries another place next")
        self.place = place
        self.code = code


class ThrottledError(CostguardError):
    """The provider refused a call for its request rate (AWS ``RequestLimitExceeded``, an
    HTTP 429, GCP ``rateLimitExceeded``), not for the place or the job: the call is worth
    sending again later, as :mod:`costguard.retry` paces it (``retry_after_s``: the wait
    the provider asked for, when it said). Raised by :meth:`Launcher.launch`; never a
    capacity verdict on the place (recovery does not back off from it)."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        retry_after_s: float | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint or "costguard waits and asks again")
        self.code = code
        self.retry_after_s = retry_after_s
