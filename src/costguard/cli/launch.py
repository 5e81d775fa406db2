"""``costguard launch`` (spot launcher + recovery controller) and ``costguard jobs status``."""

from __future__ import annotations

import getpass
import os
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from costguard import contract
from costguard.cli import render
from costguard.cli.helpformat import HelpGroup
from costguard.cli.options import TRAILING_COMMAND, cadence_options
from costguard.cli.params import (
    DecimalRange,
    FiniteFloat,
    Name,
    StoreUrl,
    Text,
    Url,
    WholeNumber,
    table_or_json,
)
from costguard.errors import CostguardError, InputError
from costguard.gang import MAX_NODES
from costguard.providers import providers
from costguard.settings import Settings
from costguard.text import visible

if TYPE_CHECKING:
    from costguard.checkpoint.pace import Pace
    from costguard.checkpoint.store import Store
    from costguard.spot.job import Job, JobSpec
    from costguard.spot.launcher.base import Launcher, Offer
    from costguard.spot.prepare import LaunchRequest

EXAMPLES = """
\b
Examples:
  # prove preempt-and-resume on this machine first (nothing is billed):
  costguard launch --provider local --gpu a10g --checkpoint ckpt/ \\
      --preempt-every 60 --yes -- python train.py
  costguard launch --gpu a10g --spot --checkpoint s3://my-bucket/run1 \\
      --max-total 50 --option image=ami-0123456789abcdef0 \\
      --option instance_profile=costguard-instance \\
      -- python train.py --epochs 10
  # a Hugging Face, Accelerate or Lightning script that saves to out/:
  costguard launch --gpu a10g --checkpoint s3://my-bucket/run1 \\
      --sync-dir out/ --option image=ami-0123456789abcdef0 \\
      --option instance_profile=costguard-instance -- python train_hf.py
  # time 200 steps on the GPU itself, then price 20000 steps there:
  costguard launch --gpu a10g --checkpoint s3://my-bucket/pilot \\
      --pilot-steps 200 --total-steps 20000 \\
      --option image=ami-0123456789abcdef0 -- python train.py
  # two nodes of 2 processes each, on this machine (one is preempted):
  costguard launch --provider local --gpu t4 --checkpoint ckpt/ --nodes 2 \\
      --procs-per-node 2 --preempt-at 60 --yes -- train.py --epochs 3
  costguard launch --attach s3://my-bucket/run1  # a new controller takes over
  costguard jobs status s3://my-bucket/run1 --format json

Exit code: 0 when the job finished (exit 0), 1 when it failed or a limit stopped it,
75 when --stop-at-projection saved and stopped it, 2 for bad input.
"""

STATUS_EXAMPLES = """
\b
Examples:
  costguard jobs status s3://my-bucket/run1
  costguard jobs status ckpt/ --format json
  costguard jobs stop s3://my-bucket/run1
"""
STOP_EXAMPLES = """
\b
Examples:
  costguard jobs stop s3://my-bucket/run1
  costguard jobs stop sweep/ --yes
"""

#: A local attempt is polled often: the simulator acts when polled.
LOCAL_POLL_S = 0.5
#: Exit code when --stop-at-projection stopped the job after its save (EX_TEMPFAIL, as
#: costguard run's after a notice): the work so far is in a committed checkpoint.
EXIT_SAVED = contract.EXIT_SAVED


def _echo(message: str) -> None:
    render.print_prose(message, first="costguard: ", indent="  ", err=True)


@click.command(
    "launch",
    context_settings=TRAILING_COMMAND,
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
    type=click.Choice([*providers("launcher"), "local"]),
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
    "--checkpoint",
    "url",
    type=StoreUrl(),
    help="Checkpoint URL (s3://, gs://, az://, or a folder).",
)
@click.option(
    "--sync-dir",
    metavar="DIR",
    type=Text(),
    help="Keep the trainer's own checkpoints written in this folder on the instance (relative: "
    "under its workdir) in the store, and put the newest back before each attempt; see "
    "costguard run --help.",
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
@cadence_options("Checkpoint")
@click.option(
    "--total-steps",
    type=WholeNumber(1, 10**12),
    help="The whole run's steps: with the measured pace, the job's finish time and "
    "projected total (jobs status; --max-total acts on it).",
)
@click.option(
    "--pilot-steps",
    type=WholeNumber(10, 10**7),
    help="A pilot on the launched GPU: stop the script after this many steps, then print "
    "costguard estimate --from-run's answer for --total-steps (as costguard pilot does here).",
)
@click.option(
    "--stop-at-projection",
    is_flag=True,
    help="With --max-total: save and stop (exit 75) once the projected total passes it, "
    "not only when the money is spent.",
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
    metavar="KEY=VALUE",
    type=Text(),
    multiple=True,
    help="Provider setting KEY=VALUE (image, instance_profile, subnet, project, ...).",
)
@click.option(
    "--nodes",
    type=WholeNumber(1, MAX_NODES),
    help="A multi-node gang: this many instances started together (all or none), each "
    "running one torchrun (c10d rendezvous at node 0) under costguard run; a notice to any "
    "node saves all of them, and the whole gang is relaunched. COMMAND is what torchrun "
    "runs (train.py ARGS), as with costguard slurm script --nodes.",
)
@click.option(
    "--procs-per-node",
    type=WholeNumber(1, 1024),
    help="With --nodes: processes each node's torchrun starts (default: one per GPU).",
)
@click.option(
    "--array",
    type=Text(),
    metavar="INDEXES",
    help="Many tasks under one budget, in SLURM's syntax: 0-9%4 runs tasks 0..9, at most 4 "
    "at once, each with COSTGUARD_ARRAY_TASK_ID and its own checkpoint prefix URL/task-<index> "
    "(--provider local for now).",
)
@click.option(
    "--attach",
    "attach_url",
    type=StoreUrl(),
    help="Supervise the job at this checkpoint URL again.",
)
@click.option("--force", is_flag=True, help="With --attach: even if its heartbeat is fresh.")
@click.option(
    "--accept-spec",
    is_flag=True,
    help="With --attach: run a job.json spec you did not launch (it is shown first).",
)
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
    "--preempt-at",
    metavar="SECONDS",
    type=Text(),
    help="local: notices at these seconds after the start, e.g. 30,90.",
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
@table_or_json("The final report: table for people, json for scripts.")
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
    from costguard.spot import report
    from costguard.spot.controller import Controller, check_not_supervised
    from costguard.spot.job import release_job
    from costguard.spot.prepare import launcher_for, offers_for

    if _array_launch(settings, options):
        return
    if options["attach_url"]:
        job, store = _attached(options)
        if not options["force"]:
            poll = options["poll_seconds"] or _default_poll(job.spec.provider)
            check_not_supervised(job, time.time(), stale_s=max(90.0, 6 * poll))
        offers = offers_for(settings, job.spec)
        launcher = launcher_for(settings, job.spec, offers)
        try:
            job = _confirm_attach(settings, job, offers, launcher, options)
        except BaseException:
            launcher.close()  # every launcher has it (a no-op by default)
            raise
        _echo(f"attached to job {job.spec.job_id} ({len(job.attempts)} attempt(s) so far)")
    else:
        job, store, offers, launcher = _prepare(settings, _request(options))
    poll_s = options["poll_seconds"] or _default_poll(job.spec.provider)
    controller = Controller(
        store,
        launcher,
        offers,
        poll_s=poll_s,
        timeout_s=options["timeout_hours"] * 3600,
        on_event=lambda event: _echo(event.message),
        owner=_owner(),
    )
    try:
        with _following(launcher, job, quiet=options["quiet"]):
            final = controller.run(job)
    except KeyboardInterrupt:
        released = release_job(store)
        _echo(report.interrupted_line(job.spec.checkpoint_url, released=released))
        raise
    finally:
        launcher.close()
    if final.spec.pilot_steps is not None and final.status == "succeeded":
        _pilot_answer(settings, final, options["output_format"])
        return
    _report(final, offers, options["output_format"], store.url)
    if final.status == "stopped" and final.stop_requested:
        sys.exit(EXIT_SAVED)  # saved and stopped at the projection: resumable
    if final.status != "succeeded":
        sys.exit(1)


def _array_launch(settings: Settings, options: Mapping[str, Any]) -> bool:
    """``--array``, or ``--attach`` of an array's URL: the sweep runs it (costguard.cli.
    sweep); ``False`` for a single job."""
    from costguard.cli import sweep

    launching = sweep.Launching(_owner(), _guard, _default_poll)
    if options["array"] is not None:  # its options are checked first, before any read
        sweep.launch_array(settings, options, _request(options), launching)
        return True
    if options["attach_url"]:
        found = sweep.array_at(options["attach_url"])
        if found is not None:
            sweep.attach_array(settings, options, launching, *found)
            return True
    return False


def _pilot_answer(settings: Settings, job: Job, output_format: str) -> None:
    """What a pilot job measured, priced as ``costguard pilot`` prices it: the job's GPU,
    the run's --total-steps (or the script's own total)."""
    from costguard.cli.estimate import show_quote
    from costguard.pricing.question import Question
    from costguard.spot.recovery import spent_usd
    from costguard.spot.report import usd

    spent = spent_usd(job.attempts, time.time())
    _echo(
        f"pilot job {job.spec.job_id} succeeded after {job.spec.pilot_steps} steps "
        f"({usd(spent)}); costguard jobs status {job.spec.checkpoint_url} has its attempts"
    )
    question = Question(
        from_run=job.spec.checkpoint_url, steps=job.spec.total_steps, gpus=(job.spec.gpu,)
    )
    show_quote(settings, question, output_format.lower())


def _following(launcher: Launcher, job: Job, *, quiet: bool) -> AbstractContextManager[object]:
    """A local job's output on stderr while it runs; nothing to follow elsewhere."""
    from contextlib import nullcontext

    from costguard.cli.follow import Follower

    if job.spec.provider != "local" or launcher.state_dir is None:
        return nullcontext()
    return Follower(launcher.state_dir / job.spec.job_id, quiet=quiet)


def _default_poll(provider: str) -> float:
    return LOCAL_POLL_S if provider == "local" else 10.0


def _attached(options: Mapping[str, Any]) -> tuple[Job, Store]:
    from costguard.spot.job import load_job
    from costguard.spot.prepare import normal_url, open_store

    if options["command"]:
        msg = "--attach takes no command: the job's own is used"
        raise InputError(msg, hint="`costguard launch --attach URL`")
    url = normal_url(options["attach_url"])
    store = open_store(url)
    job = load_job(store)
    # A spec copied to another folder (signed, so it is shown as this user's) would run
    # attempts that save to, and write their exit records in, the folder it names, while
    # this controller waits here: each attempt "lost", relaunched until the limit.
    named = normal_url(job.spec.checkpoint_url)
    if named.rstrip("/") != url.rstrip("/"):
        msg = (
            f"job.json at {url} is the job of {named}: its attempts would save there, "
            "not here (a copy of another job's folder?)"
        )
        raise InputError(msg, hint=f"attach where the job is: costguard launch --attach {named}")
    return job, store


def _confirm_attach(
    settings: Settings,
    job: Job,
    offers: Sequence[Offer],
    launcher: Launcher,
    options: Mapping[str, Any],
) -> Job:
    """What attaching would run, shown and asked for as a launch is: the command, where
    it runs and at what price; launch's guards (a gang's rules, the launcher's ``check``
    and its secret search: :func:`~costguard.spot.prepare.check_spec`; the budget
    alarm). A spec this user did not launch (its signature by this user's key does not
    hold: someone else wrote job.json) is refused unless ``--accept-spec``; accepted, it
    is signed as this user's from then on."""
    from dataclasses import replace

    from costguard import proof
    from costguard.spot.job import sign_spec, signed_by
    from costguard.spot.prepare import check_spec

    key = proof.user_key(create=True)
    assert key is not None  # made, or InputError
    spec = job.spec
    for line in _attach_plan(job, offers):
        render.print_prose(line, first="", indent="  ", err=True)
    if not signed_by(spec, key):
        msg = (
            f"job.json at {spec.checkpoint_url} holds a spec you did not launch (its "
            "signature by your costguard key does not hold): someone else may have written it"
        )
        if not options["accept_spec"]:
            raise InputError(
                msg,
                hint="check the command, instance and price above; --accept-spec runs it as it is",
            )
        click.secho(f"Warning: {msg}; accepted with --accept-spec", err=True, fg="yellow")
    check_spec(spec.launch_spec(), launcher)  # as launch checked it, before any cloud call
    if spec.provider == "local":
        _echo("launch guard: not needed for --provider local (nothing is billed)")
    else:
        _guard(settings, spec.provider, spec.options, options["no_alarm_check"])
    if not options["yes"]:
        _confirm("Attach and supervise?", "attach", "not attached")
    return replace(job, spec=sign_spec(spec, key))


def _attach_plan(job: Job, offers: Sequence[Offer]) -> list[str]:
    """The plan of an attach, in lines: the job's command, where its attempt runs or the
    next would, and the price."""
    from costguard.shell import command
    from costguard.spot.controller import instances_label

    spec = job.spec
    current = job.current
    gang = f"{spec.nodes} nodes of " if spec.nodes > 1 else ""
    lines = [
        f"Attach to job {spec.job_id} (owner {spec.owner or 'unknown'}, {spec.provider}, "
        f"{gang}{spec.gpu_count} x {spec.gpu}):",
        f"  command: {command(*spec.command)}",
    ]
    if current is not None:
        where = instances_label(current) if current.handle else "not confirmed"
        lines.append(
            f"  attempt {current.number} runs: {current.offer.instance_type} "
            f"{current.offer.market.value} in {current.offer.place} ({where}) at "
            f"${current.usd_per_hour}/h"
        )
    elif offers:
        cheapest = min(offers, key=lambda o: o.usd_per_hour)
        lines.append(
            f"  next attempt from ${cheapest.usd_per_hour}/h ({cheapest.instance_type} "
            f"{cheapest.market.value} in {cheapest.place})"
        )
    if spec.max_total_usd is not None:
        lines.append(f"  --max-total ${spec.max_total_usd}")
    return lines


def _request(options: Mapping[str, Any]) -> LaunchRequest:
    from costguard.spot.prepare import LaunchRequest

    return LaunchRequest(
        provider=options["provider"],
        gpu=options["gpu"],
        command=tuple(options["command"]),
        checkpoint_url=options["url"],
        gpu_count=options["gpu_count"],
        regions=tuple(options["regions"]),
        spot=options["spot"],
        max_usd_per_hour=options["max_price"],
        max_total_usd=options["max_total"],
        max_preemptions=options["max_preemptions"],
        max_failures=options["max_failures"],
        hours=options["hours"],
        every_steps=options["every_steps"],
        every_minutes=options["every_minutes"],
        idle_minutes=options["idle_minutes"],
        option_pairs=tuple(options["option_pairs"]),
        timeout_hours=options["timeout_hours"],
        preempt_every_s=options["preempt_every"],
        preempt_at=options["preempt_at"],
        seed=options["seed"],
        notice_s=options["notice_seconds"],
        sync_dir=options["sync_dir"],
        no_alarm_check=options["no_alarm_check"],
        yes=options["yes"],
        total_steps=options["total_steps"],
        stop_at_projection=options["stop_at_projection"],
        pilot_steps=options["pilot_steps"],
        nodes=options["nodes"] or 1,
        procs_per_node=options["procs_per_node"],
        array=options["array"],
    )


def _prepare(
    settings: Settings, request: LaunchRequest
) -> tuple[Job, Store, list[Offer], Launcher]:
    """Check everything, print the estimate, run the guard, confirm; write job.json."""
    from costguard.spot.offers import fallback_offer
    from costguard.spot.prepare import check_launcher, commit, launcher_for, prepare

    prepared = prepare(settings, request, owner=_owner(), environ=os.environ)
    launcher = launcher_for(settings, prepared.spec, prepared.offers)
    try:
        prepared = check_launcher(prepared, launcher)
        first = prepared.first.offer
        _print_estimate(
            prepared.spec,
            first,
            fallback_offer(prepared.offers),
            prepared.as_of,
            prepared.offers,
            _recorded_pace(prepared.store),
        )
        if prepared.spec.provider == "local":
            _echo("launch guard: not needed for --provider local (nothing is billed)")
        else:
            _guard(settings, prepared.spec.provider, prepared.spec.options, request.no_alarm_check)
        if not request.yes:
            _confirm("Launch?", "launch", "not launched")
        job = commit(prepared)
    except BaseException:
        launcher.close()
        prepared.store.remove_if_unused()  # declined or refused: no empty folder left
        raise
    return job, prepared.store, prepared.offers, launcher


def _confirm(question: str, verb: str, declined: str) -> None:
    """Ask ``question`` on the terminal; refused without one (``--yes`` skips it)."""
    if not sys.stdin.isatty():
        msg = "confirmation needed, and there is no terminal to ask"
        raise InputError(msg, hint=f"pass --yes to {verb} without asking")
    if not click.confirm(question, err=True):
        msg = f"{declined}: declined at the confirmation"
        raise CostguardError(msg)


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
        from costguard.alarms.backend import Scope, alarm_backend

        backend = alarm_backend(provider, settings, Scope.of(provider_options))
        warning = require_alarm(provider, backend)
    if warning:
        click.secho(f"Warning: {visible(warning)}", err=True, fg="yellow")
    else:
        _echo(f"launch guard: a costguard budget alarm exists on {provider}")


class _NoBackend:
    """Never asked: ``require_alarm(override=True)`` makes no call."""

    def has_alarm(self) -> bool:
        return False


def _recorded_pace(store: Store) -> Pace | None:
    """The pace a pilot or an earlier run recorded at the checkpoint URL, if any."""
    from costguard.checkpoint.pace import read_pace

    try:
        return read_pace(store)
    except CostguardError:
        return None


def _print_estimate(
    spec: JobSpec,
    offer: Offer,
    fallback: Offer | None,
    as_of: str,
    offers: Sequence[Offer] = (),
    pace: Pace | None = None,
) -> None:
    from costguard.spot.report import estimate_lines

    for line in estimate_lines(spec, offer, fallback, as_of, offers, pace):
        body = line.removeprefix("  ")
        indent = "  " if body != line else ""
        render.print_prose(body, first=indent, indent=indent + "  ", err=True)


def _report(job: Job, offers: Sequence[Offer], output_format: str, url: str) -> None:
    """The job's report; its checkpoints and pace read from ``url``, the store asked
    about (never the URL its job.json names)."""
    from costguard.spot import report

    now = time.time()
    checkpoint = report.latest_checkpoint(url)
    projection = report.projection_of(job, url, now)
    if output_format == "json":
        render.print_json(report.job_document(job, offers, now, checkpoint, projection))
        return
    columns = [
        render.Column(name, "right" if name in ("#", "$/h", "cost") else "left")
        for name in report.ATTEMPT_COLUMNS
    ]
    columns[4] = render.Column("instance", drop=2)
    columns[6] = render.Column("exit", drop=1)
    render.print_table(
        f"job {job.spec.job_id}: {job.status}", columns, report.attempt_rows(job, now)
    )
    for line in report.summary_lines(job, offers, now, checkpoint, projection):
        render.print_prose(line, first="", indent="  ")


@click.group(
    "jobs", cls=HelpGroup, epilog=STATUS_EXAMPLES, short_help="Jobs started by costguard launch."
)
def jobs_group() -> None:
    """Inspect jobs started by `costguard launch` (their state lives with the checkpoints)."""


def _array_status(url: str, output_format: str, extras: bool) -> bool:
    """``jobs status`` of an array's URL: the roll-up of its tasks (costguard.cli.sweep);
    ``False`` for a single job."""
    from costguard.cli import sweep

    found = sweep.array_at(url)
    if found is None:
        return False
    if extras:
        msg = "--plot and --spend show one job: of an array, pass a task's URL"
        raise InputError(
            msg, hint=f"e.g. costguard jobs status {url.rstrip('/')}/task-0 --plot x.png"
        )
    sweep.show_status(*found, output_format)
    return True


@jobs_group.command("status", epilog=STATUS_EXAMPLES)
@click.argument("url", type=StoreUrl())
@table_or_json("table for people, json for scripts.")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also draw the cost over wall time, the on-demand line and the preemptions into "
    "this PNG (needs costguard[plot]).",
)
@click.option(
    "--spend",
    "exports",
    multiple=True,
    type=Url(),
    help="A billing export (repeatable): what it billed under the job's tag, by service, "
    "and what the difference from the running cost is made of (costguard spend --job).",
)
@click.pass_obj
def status_command(
    settings: Settings,
    /,
    url: str,
    output_format: str,
    plot: Path | None,
    exports: tuple[str, ...],
) -> None:
    """Attempts, preemptions, cost so far and status of the job at checkpoint URL."""
    from costguard.spot.job import load_job
    from costguard.spot.prepare import normal_url, offers_for, open_store

    if plot is not None:
        from costguard.plots import check_target

        check_target(plot)
    if exports and output_format == "json":
        msg = "jobs status --spend prints tables; its JSON is costguard spend's"
        raise InputError(msg, hint=f"costguard spend EXPORT --job {url} --format json")
    if _array_status(url, output_format, plot is not None or bool(exports)):
        return
    url = normal_url(url)
    store = open_store(url)
    job = load_job(store)
    try:
        offers = offers_for(settings, job.spec)
    except InputError:
        offers = []
    _report(job, offers, output_format, store.url)
    if exports:
        from costguard.cli.spend import job_spend

        job_spend(settings, job, exports, "service", None, None, output_format)
    if plot is not None:
        from costguard.plots import draw_job

        click.echo(f"Picture: {draw_job(plot, job, offers, time.time()).path}", err=True)


@jobs_group.command("stop", epilog=STOP_EXAMPLES)
@click.argument("url", type=StoreUrl())
@click.option("--yes", "-y", is_flag=True, help="Stop an array without asking.")
def stop_command(url: str, yes: bool) -> None:
    """Ask the running attempt of the job at checkpoint URL to save and stop (exit 75).

    The request is signed with your costguard key, for that attempt only: the job's
    `costguard run` honours it, and its controller ends the job stopped (resumable with
    `costguard launch --attach URL`) instead of relaunching it. At an array's URL,
    every task: the running ones save and stop, the pending ones never start.
    """
    from costguard.cli.sweep import stop_array
    from costguard.spot.job import RUNNING, load_job, request_stop
    from costguard.spot.prepare import normal_url, open_store

    if stop_array(url, yes):
        return
    store = open_store(normal_url(url))
    job = load_job(store)
    current = job.current
    if job.status != RUNNING or current is None:
        msg = f"job {job.spec.job_id} has no running attempt ({job.status})"
        raise InputError(msg, hint=f"`costguard jobs status {url}` shows where it stands")
    reason = "stopped by costguard jobs stop"
    request_stop(store, job.spec.job_id, current.number, reason, time.time())
    _echo(f"asked attempt {current.number} of job {job.spec.job_id} to save and stop")
