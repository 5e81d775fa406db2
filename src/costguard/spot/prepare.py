"""Everything ``costguard launch`` checks and builds before the first instance.

The rules on the request (:func:`check_request`, :func:`sync_dir_for`,
:func:`parse_option_pairs`, :func:`simulation_for`, :func:`new_spec`, :func:`first_launch`)
are pure and testable
without click; :func:`prepare` runs them with the I/O around them (price tables, the
store, the wheel the instances install) and decides the first launch once. The command
then asks for confirmation and :func:`commit` writes the job.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from costguard.checkpoint.completion import sync_dir_path
from costguard.errors import InputError
from costguard.pricing.catalog import as_of_text
from costguard.pricing.gpus import canonical_gpu
from costguard.pricing.tables import load_tables
from costguard.settings import Settings
from costguard.shell import command
from costguard.spot.job import RUNNING, Job, JobSpec, job_exists, load_job, save_job
from costguard.spot.launcher.base import Launcher, LaunchSpec, Offer
from costguard.spot.offers import fallback_offer, offers_as_of, require_offers
from costguard.spot.recovery import Launch, decide
from costguard.spot.simulator import Simulation

if TYPE_CHECKING:
    from costguard.checkpoint.store import Store
    from costguard.pricing.catalog import Catalog
    from costguard.spot.wheel import Wheel

#: ``--provider local`` without ``--preempt-at`` or ``--preempt-every``: a notice a minute.
DEFAULT_PREEMPT_EVERY_S = 60.0


@dataclass(frozen=True)
class LaunchRequest:
    """What ``costguard launch`` was asked, as parsed (each value already in range)."""

    provider: str
    gpu: str | None
    command: tuple[str, ...]
    checkpoint_url: str | None
    gpu_count: int = 1
    regions: tuple[str, ...] = ()
    spot: bool = True
    max_usd_per_hour: Decimal | None = None
    max_total_usd: Decimal | None = None
    max_preemptions: int = 3
    max_failures: int = 0
    hours: Decimal | None = None
    every_steps: int | None = None
    every_minutes: float | None = None
    idle_minutes: int = 30
    option_pairs: tuple[str, ...] = ()
    timeout_hours: float = 72.0
    preempt_every_s: float | None = None
    preempt_at: str | None = None
    seed: int | None = None
    notice_s: float | None = None
    #: ``--sync-dir``: the folder the trainer writes its own checkpoints in, on the instance.
    sync_dir: str | None = None
    no_alarm_check: bool = False
    yes: bool = False
    total_steps: int | None = None
    stop_at_projection: bool = False
    pilot_steps: int | None = None
    #: ``--nodes``: a gang of instances, started, saved and relaunched together.
    nodes: int = 1
    #: ``--procs-per-node``: the processes each node's torchrun starts.
    procs_per_node: int | None = None
    #: ``--array``, which a gang does not go with.
    array: str | None = None


@dataclass(frozen=True)
class Prepared:
    """A checked request: the job's spec, its store, the offers and the first launch.

    ``as_of`` dates the price tables the offers came from; ``wheel`` is the costguard the
    instances install (``None``: local, or ``--option package=...``).
    """

    spec: JobSpec
    store: Store
    offers: list[Offer]
    first: Launch
    as_of: str
    wheel: Wheel | None = None


def check_request(request: LaunchRequest) -> None:
    """The request's own rules, before anything is read: bad input is an InputError.

    >>> check_request(LaunchRequest("aws", "a10g", ("python", "t.py"), None))
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: --checkpoint is required: a spot instance is preempted, ...
    """
    if not request.command:
        msg = "no command to run"
        raise InputError(msg, hint="put it after --, e.g. costguard launch ... -- python train.py")
    if not request.gpu:
        msg = "--gpu is required"
        raise InputError(msg, hint="e.g. --gpu a10g")
    url = request.checkpoint_url
    if not url:
        msg = (
            "--checkpoint is required: a spot instance is preempted, and without a checkpoint "
            "URL every relaunch would start from scratch"
            if request.spot
            else "--checkpoint is required: the job's state is kept next to its checkpoints"
        )
        raise InputError(msg, hint="e.g. --checkpoint s3://my-bucket/run1 (local: a folder)")
    if request.provider != "local" and "://" not in url:
        msg = f"a cloud instance cannot write checkpoints to the local folder {url!r}"
        raise InputError(msg, hint="use object storage: s3://, gs:// or az://")
    local_only = [
        flag
        for flag, value in (("--preempt-every", request.preempt_every_s),
                            ("--preempt-at", request.preempt_at),
                            ("--seed", request.seed))
        if value is not None
    ]  # fmt: skip
    if request.provider != "local" and local_only:
        msg = f"{', '.join(local_only)} only apply to --provider local"
        raise InputError(msg, hint="the cloud sends its own preemption notices")
    check_gang(request)


def check_gang(gang: LaunchRequest | LaunchSpec) -> None:
    """``--nodes`` and ``--procs-per-node``: a gang's own rules (an InputError), on a
    request, or on a job's spec as job.json holds it for an attach (a spec may be older
    than the rules, or someone else's accepted with ``--accept-spec``); a task of an
    array is one instance.

    >>> check_gang(LaunchRequest("local", "t4", ("train.py",), "c", nodes=2, procs_per_node=2))
    >>> check_gang(LaunchRequest("local", "t4", ("train.py",), "c", procs_per_node=2))
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: --procs-per-node is for a gang, and --nodes is not 2 or more
    """
    from costguard.gang import check_node_command

    if gang.nodes < 2:
        if gang.procs_per_node is not None:
            msg = "--procs-per-node is for a gang, and --nodes is not 2 or more"
            raise InputError(msg, hint="add --nodes N (2 or more), or drop --procs-per-node")
        return
    task = gang.array if isinstance(gang, LaunchRequest) else gang.array_task
    if task is not None:
        msg = "--nodes and --array do not go together: each array task is one instance"
        raise InputError(msg, hint="launch the gang alone, or drop --nodes from the array")
    if gang.sync_dir is not None:
        msg = "--sync-dir is for one instance: a gang's nodes would each sync the folder"
        raise InputError(msg, hint="save through the Checkpointer (costguard run's URL)")
    if gang.pilot_steps is not None:
        msg = "--pilot-steps times one instance: a gang's pace is its slowest node's"
        raise InputError(msg, hint="pilot on one node first, then launch --nodes")
    check_node_command(gang.command)


def sync_dir_for(request: LaunchRequest) -> str | None:
    """The ``--sync-dir`` every attempt's ``costguard run`` gets, or an InputError.

    The rules every ``--sync-dir`` follows
    (:func:`~costguard.checkpoint.completion.sync_dir_path`). On a cloud instance it is a
    path there, kept as given: a relative one is under the job's workdir, where the boot
    script starts ``costguard run``. Simulated on this machine (``local``), it is made
    absolute here, as ``slurm script`` does, since the attempts may start in another folder
    (``--attach``), and a file is refused.

    >>> sync_dir_for(LaunchRequest("aws", "t4", ("x",), "s3://b/r", sync_dir="out/"))
    'out/'
    """
    if request.sync_dir is None:
        return None
    return sync_dir_path(request.sync_dir, here=request.provider == "local")


def parse_option_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``--option KEY=VALUE`` pairs.

    >>> parse_option_pairs(["image=ami-1", "disk_gb=200"])
    {'image': 'ami-1', 'disk_gb': '200'}
    """
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            msg = f"--option {pair!r} is not KEY=VALUE"
            raise InputError(msg, hint="e.g. --option image=ami-0123456789abcdef0")
        out[key.strip()] = value.strip()
    return out


def normal_url(url: str) -> str:
    """A store URL, or a local folder made absolute (the job records where it is)."""
    return url if "://" in url else str(Path(url).expanduser().resolve())


def simulation_for(request: LaunchRequest, state_dir: Path) -> Simulation | None:
    """``--provider local``: when the simulator sends notices (none for a cloud).

    >>> simulation_for(LaunchRequest("local", "t4", ("x",), "c"), Path("/s")).every_s
    60.0
    """
    if request.provider != "local":
        return None
    from costguard.spot.simulator import parse_times

    at = parse_times(request.preempt_at) if request.preempt_at else ()
    every = request.preempt_every_s
    if not at and every is None:
        every = DEFAULT_PREEMPT_EVERY_S
    if at and every is not None:
        msg = "--preempt-at and --preempt-every exclude each other"
        raise InputError(msg, hint="a fixed schedule or a regular one")
    return Simulation(
        every_s=every,
        at_s=at,
        seed=request.seed,
        notice_s=request.notice_s,
        state_dir=str(state_dir),
    )


def owner_word(owner: str) -> str:
    """The owner's name as it goes into a job id: ASCII lower-case letters and digits only,
    at most 12 (no ``-``, so one owner's prefix ``cg-<word>-`` never matches another's).

    >>> owner_word("Alice.Smith-2"), owner_word("Zoë"), owner_word("")
    ('alicesmith2', 'zo', 'x')
    """
    word = "".join(c for c in owner.lower() if c.isascii() and c.isalnum())
    return word[:12] or "x"


def new_spec(
    request: LaunchRequest,
    *,
    gpu: str,
    checkpoint_url: str,
    options: Mapping[str, str],
    simulation: Simulation | None,
    owner: str,
    now: datetime,
    token: str,
) -> JobSpec:
    """The job's spec; ``now`` (read once) names it, dates it and sets its expiry.

    The job id carries the owner's name as one word (:func:`owner_word`), so the names of
    its VMs (``costguard-cg-<owner>-...``) can be bound to their owner where a cloud's IAM
    sees names only (GCP: infra/gcp/launcher-instances-condition.yaml)."""
    return JobSpec(
        job_id=f"cg-{owner_word(owner)}-{now:%Y%m%d-%H%M%S}-{token}",
        provider=request.provider,
        gpu=gpu,
        gpu_count=request.gpu_count,
        regions=tuple(dict.fromkeys(request.regions)),
        spot=request.spot,
        checkpoint_url=checkpoint_url,
        command=request.command,
        owner=owner,
        created_unix=now.timestamp(),
        expires_at=now + timedelta(hours=request.timeout_hours),
        max_usd_per_hour=request.max_usd_per_hour,
        max_total_usd=request.max_total_usd,
        max_preemptions=request.max_preemptions,
        max_failures=request.max_failures,
        every_steps=request.every_steps,
        every_minutes=request.every_minutes,
        idle_minutes=request.idle_minutes,
        hours=request.hours,
        options=dict(options),
        sync_dir=request.sync_dir,
        simulation=simulation,
        total_steps=request.total_steps,
        stop_at_projection=request.stop_at_projection,
        pilot_steps=request.pilot_steps,
        nodes=request.nodes,
        procs_per_node=request.procs_per_node,
    )


def first_launch(spec: JobSpec, offers: Sequence[Offer]) -> Launch:
    """The first attempt the recovery rules start, or an InputError saying why none."""
    first = decide((), offers, spec.limits(), spec.created_unix)
    if not isinstance(first, Launch):
        raise InputError(first.reason, hint="raise --max-total or pick a cheaper GPU")
    return first


def open_store(url: str) -> Store:
    """The job's store; it refuses a URL with credentials (never echoing them) before any
    call."""
    from costguard.checkpoint.store import Store, storage_options_from_env

    return Store.open(url, storage_options_from_env())


def offers_for(settings: Settings, spec: JobSpec) -> list[Offer]:
    """The offers the spec allows, from the price tables (``--attach``, ``jobs status``)."""
    return offers_in(load_tables(settings.pricing_dir, settings.pricing_cache_dir), spec)


def offers_in(catalog: Catalog, spec: JobSpec) -> list[Offer]:
    """The offers of ``catalog`` the spec allows; an InputError when there are none."""
    return require_offers(
        catalog,
        gpu=spec.gpu,
        gpu_count=spec.gpu_count,
        provider=spec.provider,
        regions=spec.regions,
        spot=spec.spot,
        max_usd_per_hour=spec.max_usd_per_hour,
    )


def launcher_for(settings: Settings, spec: JobSpec, offers: Sequence[Offer]) -> Launcher:
    """The provider's launcher: the simulator for ``local``, else the cloud's adapter."""
    if spec.provider == "local":
        from costguard.spot.launcher.local import LocalLauncher, default_state_dir

        sim = spec.simulation
        if sim is None:  # launch always writes one (simulation_for): not costguard's
            msg = f"job {spec.job_id} is a local job without its simulation settings"
            raise InputError(msg, hint="was job.json written by costguard launch?")
        return LocalLauncher(
            sim,
            job_started_unix=spec.created_unix,
            state_dir=Path(sim.state_dir) if sim.state_dir else default_state_dir(os.environ),
        )
    from costguard.spot.launcher import cloud_launcher

    regions = list(dict.fromkeys(o.region for o in offers))
    return cloud_launcher(spec.provider, settings, spec.options, regions)


def prepare(
    settings: Settings, request: LaunchRequest, *, owner: str, environ: Mapping[str, str]
) -> Prepared:
    """Check the request, read the price tables and the store, and decide the first launch.

    Nothing is launched or written: a job already running at the URL is refused, and so
    is a secret in the command or options (they reach the boot script and job.json).
    """
    from costguard.spot.bootstrap import refuse_secrets
    from costguard.spot.launcher.local import default_state_dir, recorded_environment

    check_request(request)
    request = replace(request, sync_dir=sync_dir_for(request))
    assert request.checkpoint_url is not None  # checked above
    assert request.gpu is not None
    provider = request.provider
    provider_options = parse_option_pairs(request.option_pairs)
    # Before any store is opened: the command and options go into the boot script and
    # job.json, which others can read.
    refuse_secrets(
        request.command,
        provider_options,
        request.checkpoint_url,
        environ,
        sync_dir=request.sync_dir,
    )
    wheel = None
    if provider != "local" and "package" not in provider_options:
        # The instances install this very costguard, shipped with the job: the bare name
        # on the public index is someone else's project (costguard.spot.wheel).
        from costguard.spot import wheel as wheels

        wheel = wheels.build()
        provider_options |= wheels.options(wheel)

    catalog = load_tables(settings.pricing_dir, settings.pricing_cache_dir)
    gpu = canonical_gpu(request.gpu, catalog.accelerators)
    regions = tuple(dict.fromkeys(request.regions))
    for region in regions:
        if provider != "local":
            catalog.region(provider, region)
        else:
            catalog.find_region(region)
    # The spec before any store is touched: what it refuses (--preempt-at with
    # --preempt-every) is bad input, refused before any I/O.
    url = normal_url(request.checkpoint_url)
    spec = new_spec(
        request,
        gpu=gpu,
        checkpoint_url=url,
        options=provider_options,
        simulation=simulation_for(request, default_state_dir(environ)),
        owner=owner,
        now=datetime.now(UTC),
        token=secrets.token_hex(3),
    )
    if provider == "local":  # the simulated instance runs with it (an attach too)
        spec = replace(spec, environment=recorded_environment(environ))
    offers = offers_in(catalog, spec)

    store = open_store(url)
    store.check_writable()
    if job_exists(store):
        previous = load_job(store)
        if previous.status == RUNNING:
            msg = f"job {previous.spec.job_id} already runs with checkpoints at {url}"
            attach = command("costguard", "launch", "--attach", url)
            raise InputError(
                msg, hint=f"{attach} (or {command('costguard', 'jobs', 'status', url)})"
            )
    first = first_launch(spec, offers)
    shown = [first.offer, *filter(None, [fallback_offer(offers)])]  # what the estimate prices
    return Prepared(spec, store, offers, first, as_of_text(offers_as_of(catalog, shown)), wheel)


def check_launcher(prepared: Prepared, launcher: Launcher) -> Prepared:
    """The launcher's checks on the spec (:func:`check_spec`); a local simulator's port
    goes into the spec (the attempts read their notices there)."""
    from costguard.spot.launcher.local import LocalLauncher

    check_spec(prepared.spec.launch_spec(), launcher)
    simulation = prepared.spec.simulation
    if not isinstance(launcher, LocalLauncher) or simulation is None:
        return prepared
    simulation = replace(simulation, metadata_port=launcher.emulator.port)
    launcher.simulation = simulation
    return replace(prepared, spec=replace(prepared.spec, simulation=simulation))


def check_spec(spec: LaunchSpec, launcher: Launcher) -> None:
    """What a launch checks on a job's spec with its launcher before job.json is written,
    and an attach repeats on the spec job.json holds, before any cloud call: a gang's rules
    (:func:`check_gang`), a gang only where the launcher starts one (the base starts
    one instance), and the launcher's own :meth:`~Launcher.check`. An InputError if not."""
    check_gang(spec)
    if spec.nodes > 1 and type(launcher).launch_gang is Launcher.launch_gang:
        name = launcher.provider
        msg = f"--nodes {spec.nodes}: the {name} launcher starts one instance per attempt"
        raise InputError(msg, hint="drop --nodes, or use costguard slurm script --nodes")
    launcher.check(spec)


def commit(prepared: Prepared) -> Job:
    """Write the job (and the costguard wheel the instances install, next to it)."""
    if prepared.wheel is not None:
        from costguard.spot.wheel import upload

        upload(prepared.store, prepared.wheel)
    from costguard.proof import user_key
    from costguard.spot.job import sign_spec

    key = user_key(create=True)
    assert key is not None  # made, or InputError
    return save_job(prepared.store, Job(sign_spec(prepared.spec, key)))
