"""``costguard launch`` (spot launcher + recovery controller) and ``costguard jobs status``."""

from __future__ import annotations

import getpass
import os
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import click

from costguard.cli import render
from costguard.cli.params import DecimalRange, FiniteFloat, Name, Text, Url, WholeNumber
from costguard.errors import CostguardError, InputError
from costguard.money import format_usd
from costguard.pricing.gpus import canonical_gpu
from costguard.pricing.tables import load_tables
from costguard.settings import Settings

EXAMPLES = """
\b
Examples:
  # prove preempt-and-resume on this machine first (nothing is billed):
  costguard launch --provider local --gpu a10g --checkpoint ckpt/ --preempt-every 60 --yes \\
      -- python train.py
  costguard launch --gpu a10g --spot --checkpoint s3://my-bucket/run1 --max-total 50 \\
      --option image=ami-0123456789abcdef0 --option instance_profile=costguard-instance \\
      -- python train.py --epochs 10
  costguard launch --attach s3://my-bucket/run1        # a new controller takes over
  costguard jobs status s3://my-bucket/run1 --format json
\b
Exit code: 0 when the job finished (exit 0), 1 when it failed or a limit stopped it,
2 for bad input (nothing was launched).
"""

STATUS_EXAMPLES = """
\b
Examples:
  costguard jobs status s3://my-bucket/run1
  costguard jobs status ckpt/ --format json
"""

#: What ``--max-price`` does on each provider, besides filtering the offers.
MAX_PRICE_REACH = {
    "aws": "filters the offers and is sent as the spot MaxPrice",
    "azure": "filters the offers and is sent as billingProfile.maxPrice",
    "gcp": "filters the offers only: GCP Spot VMs take no price cap",
    "local": "filters the offers (simulated: nothing is billed)",
}
#: A local attempt is polled often: the simulator acts when polled.
LOCAL_POLL_S = 0.5
DEFAULT_PREEMPT_EVERY_S = 60.0


def _options(pairs: Sequence[str]) -> dict[str, str]:
    """``--option KEY=VALUE`` pairs.

    >>> _options(["image=ami-1", "disk_gb=200"])
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


def _open_store(url: str) -> Any:
    # Store.open refuses a URL with credentials (never echoing them) before any call.
    from costguard.checkpoint.store import Store, storage_options_from_env

    return Store.open(url, storage_options_from_env())


def _usd(amount: Decimal) -> str:
    """Dollars for the report: cents, or four decimals below a dollar (a short local run).

    >>> _usd(Decimal("0.00123")), _usd(Decimal("12.5"))
    ('$0.0012', '$12.50')
    """
    return format_usd(amount, rate=amount < 1)


def _echo(message: str) -> None:
    render.print_prose(message, first="costguard: ", indent="  ", err=True)


@click.command(
    "launch",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    epilog=EXAMPLES,
    short_help="Run a job on a spot GPU and relaunch it after each preemption.",
)
@click.option("--gpu", type=Name(), help="GPU model: a10g, l4, t4, a100, h100...")
@click.option(
    "--gpus-per-instance",
    "gpu_count",
    type=WholeNumber(1, 64),
    default=1,
    show_default=True,
    help="GPUs per instance.",
)
@click.option(
    "--provider",
    type=click.Choice(["aws", "gcp", "azure", "local"]),
    default="aws",
    show_default=True,
    help="Where to run; local simulates preemptions on this machine.",
)
@click.option(
    "--region", "regions", type=Name(), multiple=True, help="Only these regions (repeatable)."
)
@click.option(
    "--spot/--on-demand", default=True, show_default=True, help="Start on spot or on-demand."
)
@click.option(
    "--checkpoint", "url", type=Url(), help="Checkpoint URL (s3://, gs://, az://, or a folder)."
)
@click.option(
    "--max-price",
    type=DecimalRange(0, minimum_open=True, maximum=10_000),
    help="Highest spot price to accept, USD per hour.",
)
@click.option(
    "--max-total",
    type=DecimalRange(0, minimum_open=True, maximum=10**7),
    help="Stop before the job's cost would pass this, USD.",
)
@click.option(
    "--max-preemptions",
    type=WholeNumber(0, 1000),
    default=3,
    show_default=True,
    help="Interruptions on spot before falling back to on-demand.",
)
@click.option(
    "--max-failures",
    type=WholeNumber(0, 100),
    default=0,
    show_default=True,
    help="Retries after the script fails (a nonzero exit that is no preemption).",
)
@click.option(
    "--hours",
    type=DecimalRange(0, minimum_open=True, maximum=24 * 366),
    help="Expected run time, for the estimate.",
)
@click.option("--every-steps", type=WholeNumber(min=1), help="Checkpoint every N steps.")
@click.option(
    "--every-minutes",
    type=FiniteFloat(min=0, min_open=True),
    help="Checkpoint every T minutes.",
)
@click.option(
    "--idle-minutes",
    type=WholeNumber(1, 10_000),
    default=30,
    show_default=True,
    help="Tag for the reaper: idle this long means stop it.",
)
@click.option(
    "--option",
    "option_pairs",
    type=Text(),
    multiple=True,
    help="Provider setting KEY=VALUE (image, instance_profile, subnet, project, ...).",
)
@click.option(
    "--attach", "attach_url", type=Url(), help="Supervise the job at this checkpoint URL again."
)
@click.option("--force", is_flag=True, help="With --attach: even if its heartbeat is fresh.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--no-alarm-check", is_flag=True, help="Launch even without a budget alarm (warns).")
@click.option(
    "--poll-seconds",
    type=FiniteFloat(0.05, 3600),
    help="Seconds between status checks (default 10; local: 0.5).",
)
@click.option(
    "--timeout-hours",
    type=FiniteFloat(0, 24 * 60, min_open=True),
    default=72.0,
    show_default=True,
    help="Give up (and terminate) after this long.",
)
@click.option(
    "--preempt-every",
    type=FiniteFloat(1, 10**6),
    help="local: a preemption notice this many seconds into each spot attempt.",
)
@click.option(
    "--preempt-at", type=Text(), help="local: notices at these seconds after the start, e.g. 30,90."
)
@click.option(
    "--seed",
    type=WholeNumber(0, 2**32 - 1),
    help="local: randomise --preempt-every intervals from this seed.",
)
@click.option(
    "--notice-seconds",
    type=FiniteFloat(1, 600),
    help="local: from the notice to the kill. Default: the simulated cloud's (AWS 120, "
    "GCP/Azure 30).",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="The final report: table for people, json for scripts.",
)
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="local: do not print the job's own output (its log files are still named).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def launch_command(settings: Settings, /, **options: Any) -> None:
    """Run COMMAND (after --) on a spot GPU until it is done, relaunching after preemptions.

    Picks the cheapest offer that fits from the price tables, prints the estimate,
    checks for a budget alarm (none: refused), asks for confirmation, launches, and
    supervises: after a preemption it relaunches in another zone (another region after
    repeated preemptions), resuming from the latest checkpoint; after --max-preemptions
    it falls back to on-demand; it stops before --max-total. --max-price is sent to AWS
    and Azure as the spot price cap; GCP Spot VMs take none (it only filters offers).
    The job's state lives next to the checkpoints (job/job.json), so
    another controller can take over with --attach.
    """
    from costguard.spot.controller import Controller, check_not_supervised
    from costguard.spot.job import release_job

    if options["attach_url"]:
        job, store = _attached(options)
        if not options["force"]:
            poll = options["poll_seconds"] or _default_poll(job.spec.provider)
            check_not_supervised(job, time.time(), stale_s=max(90.0, 6 * poll))
        offers = _offers_for(settings, job.spec)
        launcher = _launcher(settings, job.spec, offers)
        _echo(f"attached to job {job.spec.job_id} ({len(job.attempts)} attempt(s) so far)")
    else:
        job, store, offers, launcher = _prepare(settings, options)
    poll_s = options["poll_seconds"] or _default_poll(job.spec.provider)
    controller = Controller(
        store,
        launcher,
        offers,
        poll_s=poll_s,
        timeout_s=options["timeout_hours"] * 3600,
        on_event=lambda event: _echo(event.message),
    )
    try:
        with _following(launcher, job, quiet=options["quiet"]):
            final = controller.run(job)
    except KeyboardInterrupt:
        released = release_job(store)
        _echo(
            "interrupted: the job keeps running unsupervised; "
            f"`costguard launch --attach {job.spec.checkpoint_url}` takes over"
            + ("" if released else " (with --force: this controller could not release it)")
        )
        raise
    finally:
        close = getattr(launcher, "close", None)
        if close is not None:
            close()
    _report(final, offers, options["output_format"])
    if final.status != "succeeded":
        sys.exit(1)


def _following(launcher: Any, job: Any, *, quiet: bool) -> Any:
    """A local job's output on stderr while it runs; nothing to follow elsewhere."""
    from contextlib import nullcontext

    from costguard.cli.follow import Follower

    state_dir = getattr(launcher, "state_dir", None)
    if job.spec.provider != "local" or state_dir is None:
        return nullcontext()
    return Follower(Path(state_dir) / job.spec.job_id, quiet=quiet)


def _default_poll(provider: str) -> float:
    return LOCAL_POLL_S if provider == "local" else 10.0


def _attached(options: Mapping[str, Any]) -> tuple[Any, Any]:
    from costguard.spot.job import load_job

    if options["command"]:
        msg = "--attach takes no command: the job's own is used"
        raise InputError(msg, hint="costguard launch --attach URL")
    url = _normal_url(options["attach_url"])
    store = _open_store(url)
    return load_job(store), store


def _normal_url(url: str) -> str:
    return url if "://" in url else str(Path(url).expanduser().resolve())


def _offers_for(settings: Settings, spec: Any) -> list[Any]:
    from costguard.spot.offers import require_offers

    catalog = load_tables(settings.pricing_dir, settings.pricing_cache_dir)
    return require_offers(
        catalog,
        gpu=spec.gpu,
        gpu_count=spec.gpu_count,
        provider=spec.provider,
        regions=spec.regions,
        spot=spec.spot,
        max_usd_per_hour=spec.max_usd_per_hour,
    )


def _launcher(settings: Settings, spec: Any, offers: Sequence[Any]) -> Any:
    if spec.provider == "local":
        from costguard.spot.launcher.local import LocalLauncher, default_state_dir

        sim = spec.simulation
        return LocalLauncher(
            sim,
            job_started_unix=spec.created_unix,
            state_dir=Path(sim.state_dir) if sim.state_dir else default_state_dir(os.environ),
        )
    from costguard.spot.launcher import cloud_launcher

    regions = list(dict.fromkeys(o.region for o in offers))
    return cloud_launcher(spec.provider, settings, spec.options, regions)


def _prepare(settings: Settings, options: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    """Validate everything, print the estimate, run the guard, confirm; write job.json."""
    from costguard.spot.job import RUNNING, JobSpec, Simulation, job_exists, load_job
    from costguard.spot.launcher.local import default_state_dir
    from costguard.spot.offers import require_offers
    from costguard.spot.recovery import Launch, decide
    from costguard.spot.simulator import parse_times

    provider = options["provider"]
    command = tuple(options["command"])
    if not command:
        msg = "no command to run"
        raise InputError(msg, hint="put it after --, e.g. costguard launch ... -- python train.py")
    if not options["gpu"]:
        msg = "--gpu is required"
        raise InputError(msg, hint="e.g. --gpu a10g")
    url = options["url"]
    if not url:
        msg = (
            "--checkpoint is required: a spot instance is preempted, and without a checkpoint "
            "URL every relaunch would start from scratch"
            if options["spot"]
            else "--checkpoint is required: the job's state is kept next to its checkpoints"
        )
        raise InputError(msg, hint="e.g. --checkpoint s3://my-bucket/run1 (local: a folder)")
    if provider != "local" and "://" not in url:
        msg = f"a cloud instance cannot write checkpoints to the local folder {url!r}"
        raise InputError(msg, hint="use object storage: s3://, gs:// or az://")
    local_only = [
        flag
        for flag, value in (("--preempt-every", options["preempt_every"]),
                            ("--preempt-at", options["preempt_at"]),
                            ("--seed", options["seed"]))
        if value is not None
    ]  # fmt: skip
    if provider != "local" and local_only:
        msg = f"{', '.join(local_only)} only apply to --provider local"
        raise InputError(msg, hint="the cloud sends its own preemption notices")
    provider_options = _options(options["option_pairs"])
    # Before any store is opened: the command and options go into the boot script and
    # job.json, which others can read.
    from costguard.spot.bootstrap import refuse_secrets

    refuse_secrets(command, provider_options, url, os.environ)
    wheel = None
    if provider != "local" and "package" not in provider_options:
        # The instances install this very costguard, shipped with the job: the bare name
        # on the public index is someone else's project (costguard.spot.wheel).
        from costguard.spot import wheel as wheels

        wheel = wheels.build()
        provider_options |= wheels.options(wheel)

    catalog = load_tables(settings.pricing_dir, settings.pricing_cache_dir)
    gpu = canonical_gpu(options["gpu"], catalog.accelerators)
    regions = tuple(dict.fromkeys(options["regions"]))
    for region in regions:
        if provider != "local":
            catalog.region(provider, region)
        else:
            catalog.find_region(region)
    offers = require_offers(
        catalog,
        gpu=gpu,
        gpu_count=options["gpu_count"],
        provider=provider,
        regions=regions,
        spot=options["spot"],
        max_usd_per_hour=options["max_price"],
    )

    url = _normal_url(url)
    store = _open_store(url)
    store.check_writable()
    if job_exists(store):
        previous = load_job(store)
        if previous.status == RUNNING:
            msg = f"job {previous.spec.job_id} already runs with checkpoints at {url}"
            raise InputError(
                msg, hint=f"costguard launch --attach {url} (or costguard jobs status {url})"
            )

    now = time.time()
    simulation = None
    state_dir = default_state_dir(os.environ)
    if provider == "local":
        at = parse_times(options["preempt_at"]) if options["preempt_at"] else ()
        every = options["preempt_every"]
        if not at and every is None:
            every = DEFAULT_PREEMPT_EVERY_S
        if at and every is not None:
            msg = "--preempt-at and --preempt-every exclude each other"
            raise InputError(msg, hint="a fixed schedule or a regular one")
        simulation = Simulation(
            every_s=every,
            at_s=at,
            seed=options["seed"],
            notice_s=options["notice_seconds"],
            state_dir=str(state_dir),
        )
    job_id = f"cg-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
    spec = JobSpec(
        job_id=job_id,
        provider=provider,
        gpu=gpu,
        gpu_count=options["gpu_count"],
        regions=regions,
        spot=options["spot"],
        checkpoint_url=url,
        command=command,
        owner=_owner(),
        created_unix=now,
        expires_at=datetime.now(UTC) + timedelta(hours=options["timeout_hours"]),
        max_usd_per_hour=options["max_price"],
        max_total_usd=options["max_total"],
        max_preemptions=options["max_preemptions"],
        max_failures=options["max_failures"],
        every_steps=options["every_steps"],
        every_minutes=options["every_minutes"],
        idle_minutes=options["idle_minutes"],
        hours=options["hours"],
        options=provider_options,
        simulation=simulation,
    )
    first = decide((), offers, spec.limits(), now)
    if not isinstance(first, Launch):
        raise InputError(first.reason, hint="raise --max-total or pick a cheaper GPU")

    launcher = _launcher(settings, spec, offers)
    try:
        job = _confirm(
            settings, options, store, spec, offers, launcher, catalog.as_of.isoformat(), wheel
        )
    except BaseException:
        close = getattr(launcher, "close", None)
        if close is not None:
            close()
        raise
    return job, store, offers, launcher


def _confirm(
    settings: Settings,
    options: Mapping[str, Any],
    store: Any,
    spec: Any,
    offers: Sequence[Any],
    launcher: Any,
    as_of: str,
    wheel: Any = None,
) -> Any:
    """Check the launcher's settings, print the estimate, run the guard, ask; save job.json
    (and the costguard wheel the instances install, next to it)."""
    from costguard.spot.job import Job, save_job
    from costguard.spot.launcher.base import Market
    from costguard.spot.recovery import Launch, decide

    provider = spec.provider
    simulation = spec.simulation
    provider_options = spec.options
    first = decide((), offers, spec.limits(), spec.created_unix)
    assert isinstance(first, Launch)
    launcher.check(spec.launch_spec())
    if provider == "local" and simulation is not None:
        simulation = replace(simulation, metadata_port=launcher.emulator.port)
        spec = replace(spec, simulation=simulation)
        launcher.simulation = simulation

    fallback = next((o for o in offers if o.market is Market.ON_DEMAND), None)
    _print_estimate(spec, first.offer, fallback, as_of)
    if provider == "local":
        _echo("launch guard: not needed for --provider local (nothing is billed)")
    else:
        _guard(settings, provider, provider_options, options["no_alarm_check"])
    if not options["yes"]:
        if not sys.stdin.isatty():
            msg = "confirmation needed, and there is no terminal to ask"
            raise InputError(msg, hint="pass --yes to launch without asking")
        click.confirm("Launch?", abort=True, err=True)
    if wheel is not None:
        from costguard.spot.wheel import upload

        upload(store, wheel)
    return save_job(store, Job(spec))


def _owner() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _guard(
    settings: Settings, provider: str, provider_options: Mapping[str, str], override: bool
) -> None:
    from costguard.alarms.guard import require_alarm

    if override:
        warning = require_alarm(provider, _NoBackend(), override=True)
    else:
        from costguard.cli.alarm import backend

        warning = require_alarm(
            provider,
            backend(  # type: ignore[arg-type]
                provider,
                settings,
                billing_account=provider_options.get("billing_account"),
                project=provider_options.get("project"),
                subscription=provider_options.get("subscription"),
                resource_group=provider_options.get("resource_group"),
            ),
        )
    if warning:
        click.secho(f"Warning: {warning}", err=True, fg="yellow")
    else:
        _echo(f"launch guard: a costguard budget alarm exists on {provider}")


class _NoBackend:
    """Never asked: ``require_alarm(override=True)`` makes no call."""

    def has_alarm(self) -> bool:
        return False


def _print_estimate(spec: Any, offer: Any, fallback: Any, as_of: str) -> None:
    simulated = " (simulated on this machine; priced as" if spec.provider == "local" else ""
    where = f"{offer.instance_type} {offer.market.value} in {offer.region}"
    lines = [
        f"job {spec.job_id}: {spec.gpu_count} x {spec.gpu} on {spec.provider}{simulated}"
        + (f" {where})" if simulated else f": {where}"),
        f"  price: {format_usd(offer.usd_per_hour, rate=True)}/h "
        f"(list price, prices as of {as_of}; excludes disk, egress and taxes)",
    ]
    if spec.hours:
        lines.append(
            f"  estimate: {format_usd(offer.usd_per_hour * spec.hours)} for {spec.hours} h "
            "if nothing is preempted"
        )
    cap = spec.max_total_usd
    if cap is not None:
        lines.append(
            f"  cap: --max-total {format_usd(cap)} (about {cap / offer.usd_per_hour:.1f} h "
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
        lines.append(
            f"  after {spec.max_preemptions} preemption(s): on-demand {fallback.instance_type} "
            f"in {fallback.region} at {format_usd(fallback.usd_per_hour, rate=True)}/h"
        )
    sim = spec.simulation
    if sim is not None:
        if sim.at_s:
            when = "notices at " + ", ".join(f"{t:g}" for t in sim.at_s) + " s"
        else:
            kind = f"random (seed {sim.seed}), mean " if sim.seed is not None else ""
            when = f"a notice {kind}{sim.every_s:g} s into each spot attempt"
        grace = f"{sim.notice_s:g} s" if sim.notice_s else "the cloud's notice time"
        lines.append(
            f"  simulator: {when}, in {offer.region.split(':')[0]}'s metadata format; "
            f"killed {grace} after the notice if still running"
        )
    for line in lines:
        body = line.removeprefix("  ")
        indent = "  " if body != line else ""
        render.print_prose(body, first=indent, indent=indent + "  ", err=True)


# -- reports ----------------------------------------------------------------------------


def _latest_checkpoint(url: str) -> dict[str, Any] | None:
    """The newest committed checkpoint of the job (the final one once it succeeded)."""
    from costguard.checkpoint.inventory import inventory

    try:
        entries = inventory(_open_store(url), verify_latest=False)
    except CostguardError:
        return None
    latest = next((e for e in entries if e.latest), None)
    if latest is None:
        return None
    return {"name": latest.name, "step": latest.step, "reason": latest.reason}


def _document(
    job: Any, offers: Sequence[Any], now: float, checkpoint: dict[str, Any] | None
) -> dict[str, Any]:
    from costguard.spot.controller import summarise
    from costguard.spot.job import attempt_doc, spec_doc

    summary = summarise(job, offers, now)
    return {
        "job_id": job.spec.job_id,
        "status": job.status,
        "reason": job.reason,
        "checkpoint_url": job.spec.checkpoint_url,
        "latest_checkpoint": checkpoint,
        "controller": job.controller,
        "heartbeat_age_s": round(now - job.heartbeat_unix, 1),
        "summary": {
            "attempts": summary.attempts,
            "preemptions": summary.preemptions,
            "failures": summary.failures,
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
        "spec": spec_doc(job.spec),
        "attempts": [attempt_doc(a) for a in job.attempts],
    }


def _report(job: Any, offers: Sequence[Any], output_format: str) -> None:
    now = time.time()
    checkpoint = _latest_checkpoint(job.spec.checkpoint_url)
    if output_format == "json":
        render.print_json(_document(job, offers, now, checkpoint))
        return
    _print_table(job, offers, now, checkpoint)


def _print_table(
    job: Any, offers: Sequence[Any], now: float, checkpoint: dict[str, Any] | None
) -> None:
    from costguard.spot.controller import handle_label, summarise

    summary = summarise(job, offers, now)
    columns = [
        render.Column(name, "right" if name in ("#", "$/h", "cost") else "left")
        for name in ("#", "where", "market", "$/h", "instance", "outcome", "exit", "steps", "cost")
    ]
    columns[4] = render.Column("instance", drop=2)
    columns[6] = render.Column("exit", drop=1)
    rows = []
    for a in job.attempts:
        steps = f"{a.resumed_step if a.resumed_step is not None else 0}"
        steps += f"->{a.last_step}" if a.last_step is not None else "->?"
        rows.append(
            [
                str(a.number),
                a.offer.place,
                a.offer.market.value,
                format_usd(a.offer.usd_per_hour, rate=True),
                handle_label(a.handle),
                a.outcome.value if a.outcome else "running",
                "" if a.exit_code is None else str(a.exit_code),
                steps,
                _usd(a.cost_usd(now)),
            ]
        )
    render.print_table(f"job {job.spec.job_id}: {job.status}", columns, rows)
    lost = "unknown" if summary.lost_steps is None else str(summary.lost_steps)
    simulated = job.spec.provider == "local"
    lines = [
        f"{job.status}: {job.reason}" if job.reason else job.status,
        f"attempts {summary.attempts}, preemptions {summary.preemptions}, "
        f"failures {summary.failures}, lost steps {lost} ({summary.lost_s:.1f} s of work)",
        f"time: {summary.wall_s:.1f} s wall, {summary.running_s:.1f} s running, "
        f"overhead {summary.overhead_s:.1f} s (relaunch gaps + lost work)",
        ("what it would have cost: " if simulated else "real cost: ")
        + f"{_usd(summary.spent_usd)} (instance-hours x list price, zones at their region's"
        + (", spot as simulated)" if simulated else ")"),
    ]
    if summary.on_demand_usd is not None:
        lines.append(f"the same hours on-demand: {_usd(summary.on_demand_usd)}")
    if summary.estimate_usd is not None:
        lines.append(f"estimate before launch: {_usd(summary.estimate_usd)}")
    if checkpoint is not None:
        final = "final checkpoint" if job.status == "succeeded" else "newest checkpoint"
        lines.append(f"{final}: step {checkpoint['step']} ({checkpoint['name']})")
        lines.append(
            f"  the weights: costguard checkpoint export {job.spec.checkpoint_url} "
            "--to model.safetensors"
        )
    for line in lines:
        render.print_prose(line, first="", indent="  ")


@click.group("jobs", epilog=STATUS_EXAMPLES, short_help="Jobs started by costguard launch.")
def jobs_group() -> None:
    """Inspect jobs started by `costguard launch` (their state lives with the checkpoints)."""


@jobs_group.command("status", epilog=STATUS_EXAMPLES)
@click.argument("url", type=Url())
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table for people, json for scripts.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also draw the cost over wall time, the on-demand line and the preemptions into "
    "this PNG (needs costguard[plot]).",
)
@click.pass_obj
def status_command(settings: Settings, /, url: str, output_format: str, plot: Path | None) -> None:
    """Attempts, preemptions, cost so far and status of the job at checkpoint URL."""
    from costguard.spot.job import load_job

    if plot is not None:
        from costguard.plots import check_target

        check_target(plot)
    job = load_job(_open_store(_normal_url(url)))
    try:
        offers: list[Any] = _offers_for(settings, job.spec)
    except InputError:
        offers = []
    _report(job, offers, output_format)
    if plot is not None:
        from costguard.plots import draw_job

        click.echo(f"Picture: {draw_job(plot, job, offers, time.time()).path}", err=True)
