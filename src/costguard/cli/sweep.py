"""``costguard launch --array``, and the array side of ``costguard jobs status`` and
``costguard jobs stop``: the CLI around :mod:`costguard.spot.sweep`."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import click

from costguard import contract
from costguard.cli import render
from costguard.errors import CostguardError, InputError
from costguard.money import format_usd
from costguard.settings import Settings
from costguard.shell import command

if TYPE_CHECKING:
    from costguard.checkpoint.store import Store
    from costguard.spot.array import ArrayRecord, ArraySpec
    from costguard.spot.job import JobSpec
    from costguard.spot.launcher.base import Offer
    from costguard.spot.prepare import LaunchRequest, Prepared
    from costguard.spot.sweep import Task

#: The roll-up table's columns.
COLUMNS = ("task", "status", "attempts", "preempted", "step", "left", "cost", "projected")


def _echo(message: str) -> None:
    render.print_prose(message, first="costguard: ", indent="  ", err=True)


def check_array_options(options: Mapping[str, Any]) -> ArraySpec:
    """The ``--array`` value and the options it excludes, refused before any call."""
    from costguard.spot import array

    spec = array.parse(options["array"])
    if options["attach_url"]:
        msg = "--array and --attach exclude each other"
        raise InputError(
            msg, hint="`costguard launch --attach URL` takes over a whole array (its record)"
        )
    if options["pilot_steps"] is not None:
        msg = "--pilot-steps prices one job, not an array"
        raise InputError(msg, hint="pilot one task without --array first")
    if options["stop_at_projection"] and options["max_total"] is None:
        msg = "--stop-at-projection needs --max-total"
        raise InputError(msg, hint="e.g. --max-total 50 --stop-at-projection")
    return spec


@dataclass(frozen=True)
class Launching:
    """What ``costguard launch`` (:mod:`costguard.cli.launch`, which owns them) lends an
    array's launch or attach: the user it acts for, its launch guard (``guard(settings,
    provider, options, no_alarm_check)``) and its poll without ``--poll-seconds``."""

    owner: str
    guard: Callable[[Settings, str, Mapping[str, str], bool], None]
    default_poll: Callable[[str], float]


def launch_array(
    settings: Settings, options: Mapping[str, Any], request: LaunchRequest, launching: Launching
) -> None:
    """Check, price, confirm, write the array and supervise every task."""
    from costguard.spot import array
    from costguard.spot.prepare import check_launcher, launcher_for, prepare

    spec = check_array_options(options)
    cap, stop_at_projection = request.max_total_usd, request.stop_at_projection
    # The array keeps the one budget; each task's own job has none.
    request = replace(request, max_total_usd=None, stop_at_projection=False)
    prepared = prepare(settings, request, owner=launching.owner, environ=os.environ)
    try:
        if array.read_record(prepared.store) is not None:
            url = prepared.spec.checkpoint_url
            msg = f"an array already has its record at {url}"
            status = command("costguard", "jobs", "status", url)
            raise InputError(msg, hint=f"pick another --checkpoint URL, or {status}")
        launcher = launcher_for(settings, prepared.spec, prepared.offers)
        try:
            prepared = check_launcher(prepared, launcher)
        finally:
            launcher.close()
        estimate = _task_estimate(prepared.spec, prepared.first.offer)
        _print_plan(prepared, spec, cap, stop_at_projection, estimate)
        _guard(settings, prepared.spec, request.no_alarm_check, launching)
        _confirm(request.yes, len(spec.indexes))
    except BaseException:
        prepared.store.remove_if_unused()
        raise
    record = array.ArrayRecord(
        array_id=prepared.spec.job_id,
        url=prepared.spec.checkpoint_url,
        array=spec.text,
        indexes=spec.indexes,
        concurrency=spec.concurrency,
        created_unix=prepared.spec.created_unix,
        max_total_usd=cap,
        stop_at_projection=stop_at_projection,
    )
    tasks = _commit(prepared, record)
    _supervise(settings, options, launching, record, prepared.store, tasks, prepared.offers,
               estimate)  # fmt: skip


def attach_array(
    settings: Settings,
    options: Mapping[str, Any],
    launching: Launching,
    store: Store,
    record: ArrayRecord,
) -> None:
    """``costguard launch --attach URL`` of an array: supervise its tasks again."""
    from costguard.spot.controller import check_not_supervised
    from costguard.spot.prepare import offers_for
    from costguard.spot.sweep import load_tasks, task_state

    if options["command"]:
        msg = "--attach takes no command: the array's own is used"
        raise InputError(msg, hint="`costguard launch --attach URL`")
    tasks = load_tasks(record)
    poll = options["poll_seconds"] or launching.default_poll(tasks[0].job.spec.provider)
    if not options["force"]:
        for task in tasks:
            if task_state(task.job) == "running":
                check_not_supervised(task.job, time.time(), stale_s=max(90.0, 6 * poll))
    template = tasks[0].job.spec
    offers = offers_for(settings, template)
    tasks = _proven(tasks, offers, options)
    _guard(settings, template, options["no_alarm_check"], launching)
    estimate = _task_estimate(template, min(offers, key=lambda o: o.usd_per_hour))
    _echo(f"attached to array {record.array_id} ({len(tasks)} tasks)")
    _supervise(settings, options, launching, record, store, tasks, offers, estimate)


def _proven(tasks: list[Task], offers: Sequence[Offer], options: Mapping[str, Any]) -> list[Task]:
    """The tasks an attach may run, as an attach of one job proves its spec: each task's
    spec signed by this user's key (launch signed it; anyone else who can write the
    bucket cannot), else shown and refused unless ``--accept-spec`` (then signed as this
    user's); every task on the first one's provider, and none a gang; the plan shown
    and, without ``--yes``, asked for."""
    from costguard import proof
    from costguard.spot.job import save_job, sign_spec, signed_by
    from costguard.spot.prepare import check_gang

    key = proof.user_key(create=True)
    assert key is not None  # made, or InputError
    template = tasks[0].job.spec
    cheapest = min(offers, key=lambda o: o.usd_per_hour)
    _echo(
        f"attach to array of {len(tasks)} task(s), owner {template.owner or 'unknown'}, "
        f"{template.provider}, {template.gpu_count} x {template.gpu}, from "
        f"${cheapest.usd_per_hour}/h a task; command: {command(*template.command)}"
    )
    unproven = [t for t in tasks if not signed_by(t.job.spec, key)]
    for task in unproven:
        if task.job.spec.command != template.command:  # each one that runs otherwise
            _echo(f"task {task.index}'s command: {command(*task.job.spec.command)}")
    if any(t.job.spec.provider != template.provider for t in tasks):
        msg = f"an array's task names another provider than {template.provider}"
        raise InputError(msg, hint="check who wrote the array's job.json files")
    for task in tasks:  # as launch --array refused them: no task is a gang
        check_gang(task.job.spec.launch_spec())
    if unproven:
        names = ", ".join(str(t.index) for t in unproven[:10])
        msg = (
            f"task(s) {names} hold a spec you did not launch (its signature by your "
            "costguard key does not hold): someone else may have written it"
        )
        if not options["accept_spec"]:
            hint = "check the commands above; --accept-spec runs the tasks as they are"
            raise InputError(msg, hint=hint)
        click.secho(f"Warning: {msg}; accepted with --accept-spec", err=True, fg="yellow")
    if not options["yes"]:
        if not sys.stdin.isatty():
            msg = "confirmation needed, and there is no terminal to ask"
            raise InputError(msg, hint="pass --yes to attach without asking")
        if not click.confirm("Attach and supervise?", err=True):
            msg = "not attached: declined at the confirmation"
            raise CostguardError(msg)
    for task in unproven:
        task.job = save_job(task.store, replace(task.job, spec=sign_spec(task.job.spec, key)))
    return tasks


def _task_estimate(spec: JobSpec, offer: Offer) -> Decimal:
    """What a task is counted at before it starts: its price for ``--hours``, else for one
    hour (the rule a single job's relaunch follows)."""
    return offer.usd_per_hour * (spec.hours or Decimal(1))


def _print_plan(
    prepared: Prepared,
    spec: ArraySpec,
    cap: Decimal | None,
    stop_at_projection: bool,
    estimate: Decimal,
) -> None:
    from costguard.spot.offers import fallback_offer
    from costguard.spot.report import estimate_lines, usd

    offer = prepared.first.offer
    lines = [
        line
        for line in estimate_lines(
            prepared.spec, offer, fallback_offer(prepared.offers), prepared.as_of, prepared.offers
        )
        if not line.startswith(("  cap:", "  estimate:"))
    ]
    n, k, price = len(spec.indexes), spec.concurrency, offer.usd_per_hour
    hours = prepared.spec.hours
    lines.append(
        f"  array {spec.text}: {n} task(s), at most {k} at once; each a job of its own under "
        f"{prepared.spec.checkpoint_url}/task-<index>, with "
        f"{contract.ENV_ARRAY_TASK_ID}=<index>"
    )
    if hours:
        lines.append(
            f"  estimate: {n} task(s) x {hours} h x {format_usd(price, rate=True)}/h = "
            f"{usd(price * hours * n)} if nothing is preempted"
        )
    else:
        lines.append("  estimate: --hours prices the array (tasks x hours x price)")
    lines.append(
        f"  peak spend: {k} running x {format_usd(price, rate=True)}/h = "
        f"{format_usd(price * k, rate=True)}/h"
    )
    if cap is None:
        lines.append("  cap: none (--max-total caps the whole array)")
    else:
        lines.append(
            f"  cap: --max-total {usd(cap)} for the whole array: a task starts only "
            "while what every task spent, the running tasks' projections and its own "
            f"{usd(estimate)} ({'--hours' if hours else 'one hour'} at its price) "
            "stay within it, and running tasks stop before passing it"
            + ("; with --stop-at-projection they save and stop once the projection passes it"
               if stop_at_projection else "")
        )  # fmt: skip
    for line in lines:
        body = line.removeprefix("  ")
        indent = "  " if body != line else ""
        render.print_prose(body, first=indent, indent=indent + "  ", err=True)


def _guard(settings: Settings, spec: JobSpec, no_alarm_check: bool, launching: Launching) -> None:
    """The launch guard of a single job's launch: a budget alarm on the cloud (none:
    refused unless ``--no-alarm-check``)."""
    if spec.provider == "local":
        _echo("launch guard: not needed for --provider local (nothing is billed)")
    else:
        launching.guard(settings, spec.provider, spec.options, no_alarm_check)


def _confirm(yes: bool, tasks: int) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        msg = "confirmation needed, and there is no terminal to ask"
        raise InputError(msg, hint="pass --yes to launch without asking")
    if not click.confirm(f"Launch the array of {tasks} task(s)?", err=True):
        msg = "not launched: declined at the confirmation"
        raise CostguardError(msg)


def _commit(prepared: Prepared, record: ArrayRecord) -> list[Task]:
    """Write the costguard wheel every task's instances install (once, at the array's
    URL), every task's ``job.json`` (no attempt yet: pending), then the array's record."""
    from costguard import proof
    from costguard.spot import array
    from costguard.spot.job import Job, save_job, sign_spec
    from costguard.spot.sweep import Task, task_specs

    if prepared.wheel is not None:
        from costguard.spot.wheel import upload

        upload(prepared.store, prepared.wheel)
    key = proof.user_key(create=True)
    assert key is not None  # made, or InputError
    tasks = []
    for index, spec in zip(record.indexes, task_specs(prepared.spec, record), strict=True):
        store = prepared.store.child(array.task_name(index))  # one session for every task
        tasks.append(Task(index, store, save_job(store, Job(sign_spec(spec, key)))))
    array.write_record(prepared.store, record)
    return tasks


def _supervise(
    settings: Settings,
    options: Mapping[str, Any],
    launching: Launching,
    record: ArrayRecord,
    store: Store,
    tasks: list[Task],
    offers: Sequence[Offer],
    estimate: Decimal,
) -> None:
    from costguard.spot import array, report
    from costguard.spot.job import release_job
    from costguard.spot.launcher.base import Launcher
    from costguard.spot.launcher.local import LocalLauncher
    from costguard.spot.prepare import launcher_for
    from costguard.spot.sweep import Sweep, rows

    index_of = {task.job.spec.job_id: task.index for task in tasks}
    provider = tasks[0].job.spec.provider
    # A cloud's adapter holds nothing per job: one serves every task (its clients shared).
    shared = None if provider == "local" else launcher_for(settings, tasks[0].job.spec, offers)

    def make_launcher(spec: JobSpec) -> Launcher:
        if shared is not None:
            return shared
        launcher = launcher_for(settings, spec, offers)
        if isinstance(launcher, LocalLauncher):  # its processes get the launcher's env
            launcher.env[contract.ENV_ARRAY_TASK_ID] = str(index_of[spec.job_id])
            launcher.notice_poll_max_s = array.notice_poll_max_s(record.concurrency)
        return launcher

    sweep = Sweep(
        record,
        store,
        tasks,
        offers,
        make_launcher,
        task_estimate_usd=estimate,
        poll_s=options["poll_seconds"] or launching.default_poll(provider),
        timeout_s=options["timeout_hours"] * 3600,
        on_event=lambda event: _echo(event.message),
        launch_interval_s=array.LAUNCH_INTERVAL_S.get(provider, 0.5),
        owner=None if provider == "local" else launching.owner,
    )
    sim = tasks[0].job.spec.simulation
    if sim is not None and sim.state_dir:
        _echo(f"each task's output: {sim.state_dir}/{record.array_id}-t<index>/attempt-N.log")
    try:
        jobs = sweep.run()
    except KeyboardInterrupt:
        released = [release_job(task.store) for task in tasks]  # every one, not the first
        _echo(report.interrupted_line(record.url, released=all(released)))
        raise
    _echo(f"at most {sweep.peak_running} task(s) ran at once (--array {record.array})")
    task_rows = rows(record.url, zip(record.indexes, jobs, strict=True), time.time())
    _show(record, task_rows, options["output_format"])
    if all(r.status == "succeeded" for r in task_rows):
        return
    if record.stop_at_projection and any(j.stop_requested for j in jobs):
        sys.exit(contract.EXIT_SAVED)
    sys.exit(1)


def _show(record: ArrayRecord, task_rows: Sequence[Any], output_format: str) -> None:
    from costguard.money import duration
    from costguard.spot.report import usd
    from costguard.spot.sweep import outcome_lines, rollup_document

    if output_format == "json":
        render.print_json(rollup_document(record, task_rows))
        return
    columns = [render.Column(name, "left" if name == "status" else "right") for name in COLUMNS]
    columns[-1] = render.Column("projected", "right", drop=1)
    columns[5] = render.Column("left", "right", drop=2)
    table = [
        [
            str(r.index),
            r.status,
            str(r.attempts),
            str(r.preemptions),
            "-" if r.step is None else str(r.step),
            "-" if r.left_s is None else duration(r.left_s),
            usd(r.spent_usd),
            "-" if r.projected_usd is None else usd(r.projected_usd),
        ]
        for r in task_rows
    ]
    spent = sum((r.spent_usd for r in task_rows), Decimal(0))
    cap = f" of --max-total {usd(record.max_total_usd)}" if record.max_total_usd else ""
    render.print_table(
        f"array {record.array_id} ({record.array}): {usd(spent)} spent{cap}", columns, table
    )
    for line in outcome_lines(record, task_rows):
        render.print_prose(line, first="", indent="  ")


def array_at(url: str) -> tuple[Store, ArrayRecord] | None:
    """The array whose record is at ``url``, ``None`` when there is none (a single job)."""
    from costguard.spot import array
    from costguard.spot.job import JobError
    from costguard.spot.prepare import normal_url, open_store

    store = open_store(normal_url(url))
    try:
        record = array.read_record(store)
    except contract.RecordError as exc:
        raise JobError(exc.message, hint=exc.hint) from None
    return None if record is None else (store, record)


def show_status(store: Store, record: ArrayRecord, output_format: str) -> None:
    """``costguard jobs status URL`` of an array: one row per task, and the totals (a task
    whose ``job.json`` is not costguard's is named in a warning and left out)."""
    from costguard.spot.sweep import load_tasks, rows

    tasks = load_tasks(record, skip_bad=True)
    paces = {t.index: t.pace_copy for t in tasks if t.pace_copy is not None}
    task_rows = rows(record.url, ((t.index, t.job) for t in tasks), time.time(), paces=paces)
    _show(record, task_rows, output_format)


def stop_array(url: str, yes: bool) -> bool:
    """Stop every task of the array at URL, if there is one there (``False`` if not):
    the running ones save and stop, the pending ones never start (its controller acts at
    its next poll)."""
    from costguard.spot.job import request_stop

    found = array_at(url)
    if found is None:
        return False
    store, record = found
    if not yes:
        if not sys.stdin.isatty():
            msg = "confirmation needed, and there is no terminal to ask"
            raise InputError(msg, hint="pass --yes to stop without asking")
        if not click.confirm(f"Stop all {len(record.indexes)} task(s)?", err=True):
            return True
    request_stop(store, record.array_id, 1, "costguard jobs stop", time.time())
    _echo(
        f"asked array {record.array_id} to stop: its controller has the running tasks save "
        "and stop, and starts no more, at its next poll; with no controller running, "
        f"{command('costguard', 'launch', '--attach', record.url)} does it"
    )
    return True
