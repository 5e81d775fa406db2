"""``costguard estimate``: what a run will cost, before you run it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from costguard.cli import render
from costguard.cli.params import (
    DecimalOrWord,
    DecimalRange,
    Name,
    StoreUrl,
    Url,
    Usd,
    WholeNumber,
    table_or_json,
)
from costguard.errors import BudgetExceededError, InputError
from costguard.money import format_usd
from costguard.pricing import advisor as bands
from costguard.pricing import interruptions as preemption
from costguard.pricing.advice import (
    budget_lines,
    cheapest_line,
    describe,
    split_names,
    spot_size_notes,
    unverified_fit,
)
from costguard.pricing.catalog import (
    Catalog,
    Market,
    PriceStatus,
    prices_as_of,
    staleness,
)
from costguard.pricing.document import (
    OPTION_FIELDS,
    SLURM_FIELDS,
    option_row,
    places,
    slurm_document,
    slurm_query,
    slurm_row,
    stale_text,
    to_document,
)
from costguard.pricing.estimate import (
    DEFAULT_DISK_GB,
    CostOption,
    Estimate,
    limit_places,
)
from costguard.pricing.question import MAX_COUNT, MAX_GB, MAX_HOURS, Question, answer, combine
from costguard.pricing.slurm import (
    SLURM,
    SlurmOption,
    SlurmRate,
    format_su,
    slurm_assumptions,
    slurm_comparison,
    slurm_option,
)
from costguard.pricing.tables import load_interruptions, load_tables
from costguard.settings import Settings

if TYPE_CHECKING:
    from costguard.pricing.measured import Measured

#: ``--speedup``: estimate's and pilot's, one range and one meaning.
speedup_option = click.option(
    "--speedup",
    type=DecimalRange(0, minimum_open=True, maximum=1000),
    help="With another --gpu than the run measured: how many times as fast it runs the "
    "steps (a stated guess; the rows are flagged as scaled).",
)

EXAMPLES = """
\b
Examples:
  costguard estimate --gpu a10g --hours 8 --count 4
  costguard estimate --gpu h100 --gpus-per-instance 8 --hours 24 --spot \\
      --format json
  costguard estimate --gpu l4 --hours 10 --data-region us-east-1 --data-gb 500
  costguard estimate --instance-type g5.xlarge --region us-east-1 --hours 8 \\
      --budget 50
  # an ACCESS allocation next to every cloud:
  costguard estimate --gpu a100 --hours 24 --provider slurm \\
      --su-per-gpu-hour 64 --su-budget 50000
  costguard estimate --gpu a100 --hours 24 --provider slurm --provider aws \\
      --su-per-gpu-hour 64 --usd-per-su 0.02
  costguard estimate --gpu a100 --gpus-per-instance 4 --count 10 --hours 2 \\
      --provider slurm --su-per-gpu-hour 64   # a 10-task array, 4 GPUs each
  costguard estimate --from-run s3://my-bucket/run1 --steps 20000
      # hours from the run's measured step time (costguard run or pilot)
  costguard estimate --from-run s3://my-bucket/run1 --epochs 3
      # a trainer's run: its recorded steps per epoch
"""


@click.command(
    "estimate",
    epilog=EXAMPLES,
    short_help="Estimate what a GPU run costs, across providers, regions and markets.",
)
@click.option(
    "--gpu",
    "gpus",
    multiple=True,
    type=Name(),
    help="GPU model: a10g, l4, t4, a100, a100-80gb, h100, h200, l40s, b200... Several: "
    "--gpu l4,t4 (or --gpu repeated) prices each.",
)
@click.option(
    "--hours",
    type=DecimalRange(0, minimum_open=True, maximum=MAX_HOURS, unit="hours (10 years)"),
    help="Hours each instance runs (or --from-run: measured).",
)
@click.option(
    "--from-run",
    type=StoreUrl(),
    help="A run's checkpoint URL (costguard run, launch or pilot): the hours are its "
    "measured step time x --steps.",
)
@click.option(
    "--steps",
    type=WholeNumber(1, 10**12),
    help="With --from-run: training steps to price [default: the run's --total-steps].",
)
@click.option(
    "--epochs",
    type=DecimalRange(0, minimum_open=True, maximum=10**6, unit="epochs"),
    help="With --from-run: epochs to price, at the steps per epoch its trainer recorded "
    "(the Hugging Face and Lightning callbacks record it).",
)
@speedup_option
@click.option(
    "--count",
    default=1,
    show_default=True,
    type=WholeNumber(1, MAX_COUNT),
    help="Number of instances; with --provider slurm, nodes (slurm script --nodes) or "
    "the runs of a sweep (slurm script --array 0-9: --count 10), each --hours long.",
)
@click.option(
    "--gpus-per-instance",
    default=1,
    show_default=True,
    type=WholeNumber(1, 64),
    help="Only instances with this many GPUs.",
)
@click.option(
    "--provider",
    "providers",
    type=Name(),
    multiple=True,
    help="aws, gcp, azure or slurm (repeatable). Default: all clouds. slurm (with "
    "--su-per-gpu-hour) adds a SLURM allocation next to the clouds named, or all of them.",
)
@click.option(
    "--region",
    "regions",
    type=Name(),
    multiple=True,
    help="Region (repeatable), e.g. us-east-1, us-central1, eastus, or a group: europe, "
    "us, asia (every region of the tables there). Default: all.",
)
@click.option(
    "--instance-type",
    type=Name(),
    help="One instance type, e.g. g5.xlarge (then --gpu is optional).",
)
@click.option(
    "--spot/--on-demand",
    "spot",
    default=None,
    help="Only spot, or only on-demand. Default: both, side by side.",
)
@click.option(
    "--disk-gb",
    type=DecimalRange(0, maximum=MAX_GB),
    default=DEFAULT_DISK_GB,
    show_default=True,
    help="Block storage per instance, in GB.",
)
@click.option(
    "--storage-gb",
    type=DecimalRange(0, maximum=MAX_GB),
    default=Decimal(0),
    help="Object storage (bucket) next to the compute, in GB.",
)
@click.option(
    "--storage-months",
    type=DecimalRange(0, maximum=1200),
    default=Decimal(1),
    show_default=True,
    help="How long the object storage is kept.",
)
@click.option(
    "--egress-gb",
    type=DecimalRange(0, maximum=MAX_GB),
    default=Decimal(0),
    help="Data sent out to the internet, in GB (in total).",
)
@click.option(
    "--data",
    "data_url",
    type=Url(),
    help="Your input data's URL (s3://, gs://, az:// or https): its region is looked up "
    "(S3 answers in seconds; well-known public datasets offline) to price moving it.",
)
@click.option(
    "--data-region",
    type=Name(),
    help="Where your input data is stored, e.g. us-east-1 or gcp:us-central1.",
)
@click.option(
    "--data-gb",
    type=DecimalRange(0, maximum=MAX_GB),
    default=Decimal(0),
    help="GB read from --data-region, in total over all instances.",
)
@click.option(
    "--budget",
    type=Usd(0, minimum_open=True, maximum=10**9),
    help="USD: says for each option whether it fits and how many hours it buys; "
    "exit 1 if even the cheapest option costs more.",
)
@click.option(
    "--su-per-gpu-hour",
    type=DecimalRange(0, minimum_open=True, maximum=10**9),
    help="With --provider slurm: service units your cluster charges per GPU-hour.",
)
@click.option(
    "--su-budget",
    type=DecimalRange(0, minimum_open=True, maximum=10**15),
    help="With --provider slurm: SUs left in the allocation; exit 1 if the run needs more.",
)
@click.option(
    "--usd-per-su",
    type=DecimalRange(0, maximum=10**6),
    help="With --provider slurm: what one SU is worth in USD (else: not billed).",
)
@click.option(
    "--interruptions-per-day",
    type=DecimalOrWord(bands.ADVISOR_WORD, 0, maximum=48),
    help="Spot preemptions a day you expect: spot rows then show the preemptions over the "
    "run and the effective cost (lost work and restarts paid too). 'advisor': each AWS "
    "row's own, from the AWS Spot Instance Advisor's band (GCP, Azure: none published).",
)
@click.option(
    "--every-minutes",
    type=DecimalRange(0, minimum_open=True, maximum=10_080),
    help="With --interruptions-per-day: minutes of work between checkpoints "
    f"[default: {preemption.DEFAULT_EVERY_MINUTES}].",
)
@click.option(
    "--save-seconds",
    type=DecimalRange(0, maximum=86_400),
    help="With --interruptions-per-day: seconds one checkpoint save takes "
    f"[default: {preemption.DEFAULT_SAVE_SECONDS}].",
)
@click.option(
    "--restart-minutes",
    type=DecimalRange(0, maximum=1_440),
    help="With --interruptions-per-day: minutes from a preemption to training again "
    f"[default: {preemption.DEFAULT_RESTART_MINUTES}].",
)
@click.option(
    "--top",
    default=10,
    show_default=True,
    type=WholeNumber(0, 10_000),
    help="Show the N cheapest provider/regions (0: all).",
)
@table_or_json("table for people, json or csv for scripts.", case_sensitive=False, csv=True)
@click.option(
    "--no-stale-warning",
    is_flag=True,
    help="Do not warn when the prices used are old (COSTGUARD_STALE_WARNING=0 for always).",
)
@click.pass_obj
def estimate_command(settings: Settings, /, **options: Any) -> None:
    """Estimate a GPU run: price x hours x count + storage + egress, cheapest first.

    Works offline, from the fresher of the tables bundled with costguard and those
    `costguard pricing refresh` wrote, and says which. On-demand and spot are shown side
    by side for the cheapest instance in each provider and region, and every figure
    says what it assumes. Prices older than 30 days (spot: 7) draw a warning.
    """
    rate = slurm_rate(options)
    checkpointing = checkpointing_from(options)
    check_hours(options)
    catalog = load_tables(settings.pricing_dir, settings.pricing_cache_dir)
    measured = None
    if options["from_run"] is not None:
        measured = measured_from(options, catalog)
        options = {**options, "hours": measured.hours, "gpus": (measured.gpu,)}
    results = answer(question_from(options), catalog)
    result = combine(results)
    request = result.request
    slurm = slurm_option(request, rate) if rate is not None else None
    shown = limit_places(result.options, options["top"])
    budget: Decimal | None = options["budget"]
    stale = staleness(catalog, places(shown), datetime.now(UTC).date())
    advisor = None
    spot = None
    if checkpointing is not None and options["interruptions_per_day"] == bands.ADVISOR_WORD:
        advisor = advisor_from(request.hours, checkpointing, catalog, shown)
    elif checkpointing is not None:
        spot = preemption.expected(request.hours, checkpointing)
    output_format = options["output_format"].lower()
    if output_format == "json":
        document = to_document(result, shown, catalog, budget, options["top"])
        document["query"]["gpus"] = [r.request.gpu for r in results if r.request.gpu]
        document["cheapest"] = cheapest_line(result.options)
        document["pricing_source"]["stale_warning"] = stale_text(stale, catalog)
        document["query"]["slurm"] = slurm_query(rate)
        document["slurm"] = slurm_document(slurm, result.cheapest)
        if slurm is not None:
            document["assumptions"].extend(slurm_assumptions(slurm))
        if spot is not None:
            add_interruptions(document, spot, shown)
        if advisor is not None:
            add_advisor(document, advisor, shown)
        if measured is not None:
            add_measured(document, measured)
        render.print_json(document)
    elif output_format == "csv":
        columns = (*OPTION_FIELDS, "pricing_as_of", *(SLURM_FIELDS if slurm else ()))
        rows = [option_row(o, catalog) for o in shown]
        if slurm is not None:
            rows.append(slurm_row(slurm, request))
        render.print_csv(columns, rows)
        extra = [*(slurm_assumptions(slurm) if slurm else ())]
        extra += preemption.assumption_lines(spot) if spot is not None else ()
        extra += bands.assumption_lines(advisor, shown) if advisor is not None else ()
        extra += measured_lines(measured) if measured is not None else ()
        render.print_notes([*result.notes, *result.assumptions, *extra], err=True)
    else:
        said: set[str] = set()  # a note (regions not covered...) once, not once per GPU
        for one in results:  # one table per GPU asked for; the assumptions once, at the end
            shown_one = limit_places(one.options, options["top"])
            last = one is results[-1]
            fresh = dataclasses.replace(one, notes=tuple(n for n in one.notes if n not in said))
            said.update(one.notes)
            print_table(
                fresh,
                shown_one,
                catalog,
                slurm if last else None,
                assumptions=last,
                spot=spot,
                advisor=advisor,
                measured=measured,
            )
        print_answers(result, catalog, budget)
        if spot is not None:
            render.print_notes(preemption.advice_lines(spot, shown), heading="Preemptions:")
        if advisor is not None:
            render.print_notes(bands.advice_lines(advisor, shown), heading="Preemptions:")
    if stale is not None and settings.stale_warning and not options["no_stale_warning"]:
        render.print_prose(
            f"{stale_text(stale, catalog)}: `costguard pricing refresh` updates them "
            "(--no-stale-warning hides this)",
            first="Warning: ",
            indent="  ",
            err=True,
        )
    cheapest = result.cheapest
    if budget is not None and cheapest is not None and cheapest.total_usd > budget:
        msg = (
            f"the cheapest option ({describe(cheapest)}, {format_usd(cheapest.total_usd)}) "
            f"is over the budget of {format_usd(budget)}{unverified_fit(result, budget)}"
        )
        raise BudgetExceededError(
            msg, hint="fewer hours or instances, spot, a smaller GPU, or a bigger budget"
        )
    if slurm is not None and slurm.within_budget is False:
        msg = (
            f"the SLURM run needs {format_su(slurm.service_units)} SU, more than the "
            f"--su-budget of {format_su(slurm.rate.su_budget or Decimal(0))} SU"
        )
        raise BudgetExceededError(
            msg, hint="fewer hours or GPUs, a supplement to the allocation, or the cloud"
        )


def question_from(options: dict[str, Any]) -> Question:
    """The command's options as a :class:`~costguard.pricing.question.Question`."""
    fields = {f.name for f in dataclasses.fields(Question)} - {"gpus"}
    return Question(gpus=tuple(options["gpus"]), **{k: options[k] for k in fields})


def check_hours(options: dict[str, Any]) -> None:
    """Exactly one of --hours and --from-run; --steps and --speedup only with --from-run."""
    if options["from_run"] is None:
        if options["hours"] is None:
            msg = "the run's length is missing: give --hours, or --from-run with --steps"
            raise InputError(
                msg, hint="costguard estimate --gpu a10g --hours 8 (or --from-run URL --steps N)"
            )
        for flag in ("steps", "epochs", "speedup"):
            if options[flag] is not None:
                msg = f"--{flag} is for --from-run (a measured run), and it is not given"
                raise InputError(msg, hint=f"add --from-run URL, or drop --{flag}")
        return
    if options["hours"] is not None:
        msg = "--hours and --from-run both give the hours"
        raise InputError(msg, hint="drop --hours to price the measured ones")
    if options["steps"] is not None and options["epochs"] is not None:
        msg = "--steps and --epochs both give the run's length"
        raise InputError(msg, hint="keep one of them")
    if len(split_names(options["gpus"])) > 1:
        msg = "--from-run prices one GPU: the one measured, or one --gpu with --speedup"
        raise InputError(msg, hint="run the estimate once per GPU")
    if options["instance_type"] is not None:
        msg = "--from-run prices the measured GPU; --instance-type is not taken with it"
        raise InputError(msg, hint="use --gpu (and --speedup for another GPU than measured)")


def measured_from(options: dict[str, Any], catalog: Catalog) -> Measured:
    """The hours of --steps steps at the pace the run at --from-run recorded."""
    from costguard.checkpoint.pace import read_pace
    from costguard.contract import warn
    from costguard.pricing.gpus import canonical_gpu
    from costguard.pricing.measured import gpu_of_device, measure, steps_for_epochs
    from costguard.spot.job import JobError, job_exists, load_job
    from costguard.spot.prepare import normal_url, open_store

    url = normal_url(options["from_run"])
    if "://" not in url and not Path(url).is_dir():
        msg = f"--from-run: no run at {url} (no such folder)"
        raise InputError(msg, hint="pass the --checkpoint URL the run wrote to")
    store = open_store(url)
    pace = read_pace(store)
    if pace is None:
        msg = f"--from-run: {url} holds no measured pace (no job/pace.json)"
        raise InputError(
            msg,
            hint="measure one: costguard pilot --steps 200 -- python train.py (or any "
            "costguard run whose Checkpointer has saved once)",
        )
    accelerators = catalog.accelerators
    measured_gpu = gpu_of_device(pace.device, accelerators)
    if job_exists(store):
        try:
            measured_gpu = canonical_gpu(load_job(store).spec.gpu, accelerators)
        except JobError as exc:  # the pace is still the run's: priced from its device
            warn(exc)
    asked = split_names(options["gpus"])
    gpu = canonical_gpu(asked[0], accelerators) if asked else measured_gpu
    if gpu is None:
        msg = f"--from-run: {url} was measured on {pace.device}, which the tables do not price"
        raise InputError(
            msg, hint="name the GPU to price: --gpu a10g --speedup F (F: how many times as fast)"
        )
    epochs = options["epochs"]
    steps = steps_for_epochs(pace, epochs, url) if epochs else options["steps"] or pace.total_steps
    if steps is None:
        msg = "--from-run needs --steps: the run recorded no total steps"
        raise InputError(
            msg, hint="add --steps N (the training steps to price), or --epochs E (a trainer's)"
        )
    return measure(
        pace,
        run=url,
        steps=steps,
        measured_gpu=measured_gpu,
        gpu=gpu,
        speedup=options["speedup"],
        max_hours=Decimal(MAX_HOURS),
        epochs=epochs,
    )


def add_measured(document: dict[str, Any], measured: Measured) -> None:
    """The JSON's record of the measured hours: ``query.hours_from`` and the assumptions."""
    from costguard.pricing.measured import hours_from

    document["query"]["hours_from"] = hours_from(measured)
    document["assumptions"].extend(measured_lines(measured))
    if measured.scaled:
        for row in document["options"]:
            row["scaled"] = True


def measured_lines(measured: Measured) -> list[str]:
    """The measurement as assumption lines."""
    from costguard.pricing.measured import assumption_lines

    return assumption_lines(measured)


def checkpointing_from(options: dict[str, Any]) -> preemption.Checkpointing | None:
    """The spot preemption figures when --interruptions-per-day is given; exit 2 on
    checkpoint figures without a rate, or on a rate for on-demand only."""
    per_day: Decimal | str | None = options["interruptions_per_day"]
    given = {
        flag: options[name]
        for flag, name in (
            ("--every-minutes", "every_minutes"),
            ("--save-seconds", "save_seconds"),
            ("--restart-minutes", "restart_minutes"),
        )
        if options[name] is not None
    }
    if per_day is None:
        if given:
            flag = next(iter(given))
            msg = f"{flag} prices spot preemptions, and --interruptions-per-day is not given"
            raise InputError(msg, hint="add --interruptions-per-day N (e.g. 1), or drop " + flag)
        return None
    if options["spot"] is False:
        msg = "--interruptions-per-day prices spot, and --on-demand asks for on-demand only"
        raise InputError(msg, hint="drop --on-demand to see spot next to on-demand")
    return preemption.Checkpointing(
        every_minutes=fallback(options["every_minutes"], preemption.DEFAULT_EVERY_MINUTES),
        save_seconds=fallback(options["save_seconds"], preemption.DEFAULT_SAVE_SECONDS),
        restart_minutes=fallback(options["restart_minutes"], preemption.DEFAULT_RESTART_MINUTES),
        # advisor: each row's own rate, set per row (advisor_from)
        per_day=Decimal(0) if isinstance(per_day, str) else per_day,
    )


def fallback(value: Decimal | None, default: Decimal) -> Decimal:
    """The value given, else the stated default."""
    return default if value is None else value


def add_interruptions(
    document: dict[str, Any], spot: preemption.Interruptions, shown: Sequence[CostOption]
) -> None:
    """The JSON's spot preemption fields: the query's figures, each spot option's expected
    preemptions and effective total, the run's summary and the assumptions."""

    def fields(option: CostOption) -> dict[str, object]:
        return {
            "expected_preemptions": spot.expected_preemptions,
            "effective_hours": spot.effective_hours,
            "effective_total_usd": preemption.effective_total_usd(option, spot),
        }

    summary = preemption.document(spot, shown)
    add_spot(document, summary, shown, fields, preemption.assumption_lines(spot))


def add_advisor(
    document: dict[str, Any], advisor: bands.AdvisorFigures, shown: Sequence[CostOption]
) -> None:
    """The JSON's spot preemption fields under ``--interruptions-per-day advisor``: each
    spot option's band, rate and effective total (or why it has none)."""
    add_spot(
        document,
        bands.document(advisor),
        shown,
        lambda option: bands.option_fields(advisor, option),
        bands.assumption_lines(advisor, shown),
    )


def add_spot(
    document: dict[str, Any],
    summary: dict[str, object],
    shown: Sequence[CostOption],
    fields: Callable[[CostOption], dict[str, object]],
    assumptions: Sequence[str],
) -> None:
    """The run's preemption summary, the query's figures of it, each spot option's
    ``fields`` and the assumptions, into the JSON document."""
    document["query"]["interruptions"] = {
        k: summary[k]
        for k in ("preemptions_per_day", "every_minutes", "save_seconds", "restart_minutes")
    }
    document["interruptions"] = summary
    for row, option in zip(document["options"], shown, strict=True):
        if option.market is Market.SPOT:
            row.update(fields(option))
    document["assumptions"].extend(assumptions)


def advisor_from(
    hours: Decimal,
    checkpointing: preemption.Checkpointing,
    catalog: Catalog,
    shown: Sequence[CostOption],
) -> bands.AdvisorFigures:
    """Each shown spot row's preemptions at the rate of its AWS Spot Instance Advisor
    band (the table is read only here, not on every estimate)."""
    info, rows = load_interruptions(catalog.directory)
    return bands.advisor_figures(
        hours, checkpointing, rows, shown, as_of=info.as_of, source=info.source
    )


def slurm_rate(options: dict[str, Any]) -> SlurmRate | None:
    """The SLURM rate when --provider slurm is asked for; exit 2 on a half-given one."""
    wanted = any(p.strip().lower() == SLURM for p in options["providers"])
    given = [
        flag
        for flag, name in (
            ("--su-per-gpu-hour", "su_per_gpu_hour"),
            ("--su-budget", "su_budget"),
            ("--usd-per-su", "usd_per_su"),
        )
        if options[name] is not None
    ]
    if not wanted:
        if given:
            msg = f"{given[0]} is for SLURM allocations, and --provider slurm is not asked for"
            raise InputError(msg, hint=f"add --provider slurm, or drop {given[0]}")
        return None
    if options["su_per_gpu_hour"] is None:
        msg = "--provider slurm needs --su-per-gpu-hour (allocations are counted in SUs)"
        raise InputError(
            msg,
            hint="your centre publishes it, e.g. --su-per-gpu-hour 64 (a GPU-hour costs 64 SU)",
        )
    return SlurmRate(
        su_per_gpu_hour=options["su_per_gpu_hour"],
        usd_per_su=options["usd_per_su"],
        su_budget=options["su_budget"],
    )


def print_answers(result: Estimate, catalog: Catalog, budget: Decimal | None) -> None:
    """The lines under the table(s): the cheapest option, why a spot pick is bigger, and
    with --budget, whether each option fits and how many hours the budget buys."""
    lines = [line for line in (cheapest_line(result.options),) if line]
    lines += spot_size_notes(result.options, catalog)
    render.print_notes(lines, heading="Answers:")
    if budget is not None:
        render.print_notes(
            budget_lines(result.options, budget, result.request.hours),
            heading=f"Budget {format_usd(budget)}:",
        )


def print_table(
    result: Estimate,
    shown: Sequence[CostOption],
    catalog: Catalog,
    slurm: SlurmOption | None = None,
    *,
    assumptions: bool = True,
    spot: preemption.Interruptions | None = None,
    advisor: bands.AdvisorFigures | None = None,
    measured: Measured | None = None,
) -> None:
    """Two rows per provider and region, on-demand above spot, cheapest place first.

    With spot preemption figures, two more columns: the preemptions expected over the
    run and the total with their lost work and restarts (spot rows only).

    A narrow terminal loses the compute, storage and egress columns (the total keeps
    them), never a price, a total, an instance or a region. A SLURM allocation gets its
    own table right below, in service units, and a line that sets it against the
    cheapest cloud option.
    """
    request = result.request
    markets = request.markets
    by_place: dict[tuple[str, str], dict[Market, CostOption]] = {}
    for shown_option in shown:
        by_place.setdefault((shown_option.provider, shown_option.region), {})[
            shown_option.market
        ] = shown_option
    what = request.gpu or request.instance_type
    per_instance = "" if request.instance_type else f" x {request.gpus_per_instance} per instance"
    # The oldest of the prices shown: after a partial refresh, not the oldest region's.
    as_of = prices_as_of(catalog, places(shown)).isoformat()
    hours_how = ""
    if measured is not None:
        hours_how = " (measured, SCALED)" if measured.scaled else " (measured)"
    title = (
        f"{what}{per_instance}, {request.count} instance(s), {request.hours} h{hours_how}"
        f" - {catalog.origin} prices as of {as_of}"
    )
    columns: tuple[render.Column, ...] = (
        render.Column("Where"),
        render.Column("Market"),
        render.Column("Instance"),
        render.Column("$/h", "right"),
        render.Column("Compute", "right", drop=1),
        render.Column("Total", "right"),
        render.Column("Storage", "right", drop=2),
        render.Column("Egress", "right", drop=3),
    )
    if spot is not None or advisor is not None:
        columns += (render.Column("Preempt.", "right", drop=4), render.Column("Effective", "right"))
    rows: list[list[str]] = []
    flagged = False
    for (provider, region), by_market in by_place.items():
        where = f"{provider} {region}"
        for market in markets:
            option = by_market.get(market)
            if option is None:
                rows.append([where, str(market), *["-"] * (len(columns) - 2)])
            else:
                mark = "*" if option.price_status is PriceStatus.UNVERIFIED else ""
                flagged = flagged or bool(mark)
                rows.append(
                    [
                        where,
                        str(market),
                        option.instance_type,
                        format_usd(option.usd_per_hour, rate=True) + mark,
                        format_usd(option.compute_usd),
                        format_usd(option.total_usd),
                        format_usd(option.storage_usd),
                        format_usd(option.egress_usd),
                        *spot_cells(option, spot, advisor),
                    ]
                )
            where = ""
    render.print_table(title, columns, rows)
    hidden = len({(o.provider, o.region) for o in result.options}) - len(by_place)
    if hidden > 0:
        click.echo(f"({hidden} more region(s): --top 0 shows all)")
    notes = list(result.notes)
    if flagged:
        notes.append(
            "* unverified price (suspect in the source, or not read from one): "
            "`costguard pricing show gpu_instances --unverified` gives the reasons"
        )
    if slurm is not None:
        print_slurm_table(slurm)
        notes.append(slurm_comparison(slurm, result.cheapest))
    render.print_notes(notes, heading="Notes:")
    if not assumptions:
        return
    extra = [*(slurm_assumptions(slurm) if slurm is not None else ())]
    extra += preemption.assumption_lines(spot) if spot is not None else ()
    extra += bands.assumption_lines(advisor, shown) if advisor is not None else ()
    extra += measured_lines(measured) if measured is not None else ()
    render.print_notes(
        ["total = compute + storage + egress", *result.assumptions, *extra],
        heading="Assumptions:",
    )


def spot_cells(
    option: CostOption,
    spot: preemption.Interruptions | None,
    advisor: bands.AdvisorFigures | None = None,
) -> list[str]:
    """The preemption columns of a row: none without the figures, dashes on on-demand,
    ``n/a`` on a spot row the advisor has no band for (the assumptions say why)."""
    if spot is None and advisor is None:
        return []
    if option.market is not Market.SPOT:
        return ["-", "-"]
    if advisor is not None:
        spot = advisor.interruptions(option)
        if spot is None:
            return ["n/a", "n/a"]
    assert spot is not None
    effective = preemption.effective_total_usd(option, spot)
    return [f"{spot.expected_preemptions:.1f}", format_usd(effective)]


def print_slurm_table(slurm: SlurmOption) -> None:
    """The SLURM allocation: GPU-hours, service units, and dollars only when given."""
    rate = slurm.rate
    title = (
        f"SLURM allocation: {slurm.gpus} x {slurm.accelerator} GPU(s), {slurm.hours} h "
        "- counted in service units (SU)"
    )
    columns = [
        render.Column("Provider"),
        render.Column("GPU-hours", "right"),
        render.Column("SU/GPU-h", "right"),
        render.Column("Service units", "right"),
    ]
    cells = [SLURM, format_su(slurm.gpu_hours), format_su(rate.su_per_gpu_hour)]
    cells.append(format_su(slurm.service_units))
    if rate.su_budget is not None:
        columns.append(render.Column("Of allocation", "right"))
        share = slurm.budget_share or Decimal(0)
        cells.append(f"{share * 100:.1f}% of {format_su(rate.su_budget)}")
    columns.append(render.Column("USD", "right"))
    if slurm.usd is None:
        cells.append("allocation, not billed")
    else:
        usd_per_su = format_usd(rate.usd_per_su or Decimal(0), rate=True)
        cells.append(f"{format_usd(slurm.usd)} (at {usd_per_su}/SU)")
    render.print_table(title, columns, [cells])
