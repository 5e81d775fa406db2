"""``costguard estimate``: what a run will cost, before you run it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NamedTuple

import click
from click.core import ParameterSource

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
from costguard.money import format_usd
from costguard.pricing.advice import budget_lines, cheapest_line, spot_size_notes
from costguard.pricing.catalog import (
    SLURM,
    Catalog,
    Market,
    PriceStatus,
    as_of_text,
)
from costguard.pricing.document import OTHER_DATE_MARK, dated_apart, header_as_of
from costguard.pricing.estimate import DEFAULT_DISK_GB, CostOption, Estimate
from costguard.pricing.question import (
    ADVISOR_WORD,
    DEFAULT_EVERY_MINUTES,
    DEFAULT_RESTART_MINUTES,
    DEFAULT_SAVE_SECONDS,
    NUMBERS,
    WHOLE_NUMBERS,
    Question,
)
from costguard.pricing.quote import Quote, quote
from costguard.pricing.tables import load_tables
from costguard.settings import Settings

if TYPE_CHECKING:
    from costguard.checkpoint.pace import Pace
    from costguard.pricing.advisor import AdvisorFigures
    from costguard.pricing.interruptions import Interruptions
    from costguard.pricing.slurm import SlurmOption


def number(name: str, kind: type[DecimalRange] = DecimalRange) -> DecimalRange:
    """The type of the option of the question's figure ``name``: its range, once."""
    bounds = NUMBERS[name]
    return kind(bounds.minimum, minimum_open=bounds.above, maximum=bounds.maximum,
                unit=bounds.unit)  # fmt: skip


def whole_number(name: str) -> WholeNumber:
    """The type of the option of the question's whole number ``name``."""
    bounds = WHOLE_NUMBERS[name]
    return WholeNumber(bounds.minimum, bounds.maximum)


#: ``--speedup``: estimate's and pilot's, one range and one meaning.
speedup_option = click.option(
    "--speedup",
    type=number("speedup"),
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
    type=number("hours"),
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
    type=whole_number("steps"),
    help="With --from-run: training steps to price [default: the run's --total-steps].",
)
@click.option(
    "--epochs",
    type=number("epochs"),
    help="With --from-run: epochs to price, at the steps per epoch its trainer recorded "
    "(the Hugging Face and Lightning callbacks record it).",
)
@speedup_option
@click.option(
    "--count",
    default=1,
    show_default=True,
    type=whole_number("count"),
    help="Number of instances; with --provider slurm, nodes (slurm script --nodes) or "
    "the runs of a sweep (slurm script --array 0-9: --count 10), each --hours long.",
)
@click.option(
    "--gpus-per-instance",
    default=1,
    show_default=True,
    type=whole_number("gpus_per_instance"),
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
    type=number("disk_gb"),
    default=DEFAULT_DISK_GB,
    show_default=True,
    help="Block storage per instance, in GB.",
)
@click.option(
    "--storage-gb",
    type=number("storage_gb"),
    default=Decimal(0),
    help="Object storage (bucket) next to the compute, in GB.",
)
@click.option(
    "--storage-months",
    type=number("storage_months"),
    default=Decimal(1),
    show_default=True,
    help="How long the object storage is kept.",
)
@click.option(
    "--egress-gb",
    type=number("egress_gb"),
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
    type=number("data_gb"),
    default=Decimal(0),
    help="GB read from --data-region, in total over all instances.",
)
@click.option(
    "--budget",
    type=number("budget", Usd),
    help="USD: says for each option whether it fits and how many hours it buys; "
    "exit 1 if even the cheapest option costs more.",
)
@click.option(
    "--su-per-gpu-hour",
    type=number("su_per_gpu_hour"),
    help="With --provider slurm: service units your cluster charges per GPU-hour.",
)
@click.option(
    "--su-budget",
    type=number("su_budget"),
    help="With --provider slurm: SUs left in the allocation; exit 1 if the run needs more.",
)
@click.option(
    "--usd-per-su",
    type=number("usd_per_su"),
    help="With --provider slurm: what one SU is worth in USD (else: not billed).",
)
@click.option(
    "--interruptions-per-day",
    type=DecimalOrWord(ADVISOR_WORD, 0, maximum=NUMBERS["interruptions_per_day"].maximum),
    help="Spot preemptions a day you expect: spot rows then show the preemptions over the "
    "run and the effective cost (lost work and restarts paid too). 'advisor': each AWS "
    "row's own, from the AWS Spot Instance Advisor's band (GCP, Azure: none published).",
)
@click.option(
    "--every-minutes",
    type=number("every_minutes"),
    help="With --interruptions-per-day: minutes of work between checkpoints "
    f"[default: {DEFAULT_EVERY_MINUTES}].",
)
@click.option(
    "--save-seconds",
    type=number("save_seconds"),
    help="With --interruptions-per-day: seconds one checkpoint save takes "
    f"[default: {DEFAULT_SAVE_SECONDS}].",
)
@click.option(
    "--restart-minutes",
    type=number("restart_minutes"),
    help="With --interruptions-per-day: minutes from a preemption to training again "
    f"[default: {DEFAULT_RESTART_MINUTES}].",
)
@click.option(
    "--top",
    default=10,
    type=whole_number("top"),
    help="Show the N cheapest provider/regions (0: all) [default: 10, or as many as fit "
    "the terminal's height].",
)
@click.option(
    "--full",
    is_flag=True,
    help="On a terminal too, every place --top asks for, every assumption and every "
    "answer, past the terminal's height (a terminal otherwise gets what fits it).",
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
    says what it assumes. Prices older than 30 days (spot: 7) draw a warning. On a
    terminal the answer fits its height: the assumptions are counted, not listed, and
    fewer places are shown where that makes it fit; --full shows everything.
    """
    top_given = (
        click.get_current_context().get_parameter_source("top") is not ParameterSource.DEFAULT
    )
    fit = None if options["full"] else Fit(places=not top_given)
    show_quote(settings, question_from(options), options["output_format"].lower(),
               stale_warning=not options["no_stale_warning"], fit=fit)  # fmt: skip


def question_from(options: dict[str, Any]) -> Question:
    """The command's options as a :class:`~costguard.pricing.question.Question`."""
    return Question(**{f.name: options[f.name] for f in dataclasses.fields(Question)})


class Fit(NamedTuple):
    """Fit a terminal's height: the assumptions counted, not listed, and (with ``places``)
    fewer places shown, down to :data:`FEWEST_PLACES`, where that makes the answer fit.
    (Named tuples, as these two are: cheaper to define than dataclasses, on every run.)"""

    places: bool = True


class Layout(NamedTuple):
    """What the tables show: the ``top`` cheapest places (0: all), and the assumptions and
    the answers past the cheapest listed (``full``) or counted on one line."""

    top: int
    full: bool = True


#: The fewest places a table is cut to, to fit a terminal's height.
FEWEST_PLACES = 1


def show_quote(
    settings: Settings,
    question: Question,
    output_format: str,
    *,
    stale_warning: bool = True,
    pace: Pace | None = None,
    fit: Fit | None = None,
) -> None:
    """Price ``question`` (:func:`~costguard.pricing.quote.quote`, at ``pace`` when the
    caller has read and checked the run's record) and print the answer as ``costguard
    estimate`` prints it; raise its budget error after the figures. With ``fit``, a table
    on a terminal fits its height (:func:`fitting_layout`)."""
    catalog = load_tables(
        settings.pricing_dir, settings.pricing_cache_dir, parsed=settings.parsed_tables
    )
    answer = quote(question, catalog, pace=pace)
    warn = stale_warning and settings.stale_warning
    if output_format == "json":
        render.print_json(answer.document())
    elif output_format == "csv":
        render.print_csv(*answer.records())
        result = answer.estimate
        notes = [*result.notes, *result.assumptions, *answer.extra_assumptions()]
        render.print_notes(notes, err=True)
    else:
        layout = None if fit is None else fitting_layout(answer, fit, warn=warn)
        if layout is not None:
            answer = answer.showing(layout.top)
        print_tables(answer, layout)
    for line in warning_lines(answer, render.console(stderr=True)) if warn else []:
        click.echo(line, err=True)
    error = answer.budget_error()
    if error is not None:
        raise error


def warning_lines(answer: Quote, con: Any) -> list[str]:
    """The lines of the warning that the prices shown are old, on ``con`` (stderr's)."""
    stale = answer.stale_warning()
    if stale is None:
        return []
    warning = f"{stale}: `costguard pricing refresh` updates them (--no-stale-warning hides this)"
    return render.prose_lines(warning, first="Warning: ", indent="  ", con=con)


def fitting_layout(answer: Quote, fit: Fit, *, warn: bool) -> Layout | None:
    """The layout in which the answer, and the stale-price warning after it (``warn``; on
    stderr, where that is the same screen), fit the terminal stdout is with a line to
    spare for the prompt: everything if it fits; else the assumptions and the answers
    past the cheapest counted, and (``fit.places``) as many places as fit, at least
    :data:`FEWEST_PLACES` (where even that does not fit, the places asked for). ``None``
    (everything) where stdout is no terminal."""
    height = render.terminal_height()
    if height is None:
        return None
    stderr = render.console(stderr=True)
    top = answer.question.top
    candidates = [Layout(top), Layout(top, full=False)]
    if fit.places:
        places = len({(o.provider, o.region) for o in answer.estimate.options})
        most = min(top or places, places)
        candidates += [Layout(n, full=False) for n in range(most - 1, FEWEST_PLACES - 1, -1)]
    for layout in candidates:
        shown = answer.showing(layout.top)
        lines = render.lines_printed(lambda: print_tables(shown, layout))  # noqa: B023
        if warn and stderr.is_terminal:
            lines += len(warning_lines(shown, stderr))
        if lines < height:
            return layout
    return candidates[1]  # fewer places would not make it fit: the places asked for


def print_tables(answer: Quote, layout: Layout | None = None) -> None:
    """One table per GPU asked for, the assumptions once at the end, then the answers
    and the preemption advice; in ``layout`` (default: all of it; the places shown are
    the answer's, :meth:`Quote.showing` ``layout.top``)."""
    layout = layout or Layout(answer.question.top)
    said: set[str] = set()  # a note (regions not covered...) once, not once per GPU
    last = answer.estimates[-1]
    for one in answer.estimates:
        fresh = one._replace(notes=tuple(n for n in one.notes if n not in said))
        said.update(one.notes)
        print_table(answer, fresh, answer.shown_of(one), last=one is last)
    assumptions = [
        "total = compute + storage + egress",
        *last.assumptions,
        *answer.extra_assumptions(answer.shown_of(last)),
    ]
    if layout.full:
        render.print_notes(assumptions, heading="Assumptions:")
    left_out = print_answers(
        answer.estimate, answer.shown, answer.catalog, answer.budget, full=layout.full
    )
    if answer.spot is not None:
        from costguard.pricing.interruptions import advice_lines as spot_advice

        render.print_notes(spot_advice(answer.spot, answer.shown), heading="Preemptions:")
    if answer.advisor is not None:
        from costguard.pricing.advisor import advice_lines

        render.print_notes(advice_lines(answer.advisor, answer.shown), heading="Preemptions:")
    if not layout.full:
        more = f" and {left_out} more answer{'s' * (left_out > 1)}" if left_out else ""
        render.print_prose(
            f"({len(assumptions)} assumptions{more} not shown to fit: --full shows them)"
        )


def print_answers(
    result: Estimate,
    shown: Sequence[CostOption],
    catalog: Catalog,
    budget: Decimal | None,
    *,
    full: bool = True,
) -> int:
    """The lines under the table(s): the cheapest option, why a spot pick is bigger (where
    the tables show one; not ``full``: counted, not said), and with --budget, whether each
    option fits and how many hours the budget buys. Returns how many were not said."""
    lines = [line for line in (cheapest_line(result.options),) if line]
    sizes = spot_size_notes(shown, catalog)
    render.print_notes(lines + sizes if full else lines, heading="Answers:")
    if budget is not None:
        render.print_notes(
            budget_lines(result.options, budget, result.request.hours),
            heading=f"Budget {format_usd(budget)}:",
        )
    return 0 if full else len(sizes)


def print_table(
    answer: Quote, result: Estimate, shown: Sequence[CostOption], *, last: bool = True
) -> None:
    """Two rows per provider and region, on-demand above spot, cheapest place first.

    With spot preemption figures, two more columns: the preemptions expected over the
    run and the total with their lost work and restarts (spot rows only).

    A narrow terminal loses the compute, storage and egress columns (the total keeps
    them), never a price, a total, an instance or a region. Under the ``last`` GPU's
    table: a SLURM allocation gets its own table, and a line that sets it against the
    cheapest cloud option.
    """
    catalog = answer.catalog
    spot, advisor, measured = answer.spot, answer.advisor, answer.measured
    slurm = answer.slurm if last else None
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
    # Titled by the date most prices shown carry; a row of another date is marked.
    header = header_as_of(catalog, shown)
    as_of = as_of_text(header)
    apart, apart_note = dated_apart(catalog, shown, header)
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
                mark += OTHER_DATE_MARK if option in apart else ""
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
    if apart_note is not None:
        notes.append(apart_note)
    if slurm is not None:
        from costguard.pricing.slurm import slurm_comparison

        print_slurm_table(slurm)
        notes.append(slurm_comparison(slurm, result.cheapest))
    render.print_notes(notes, heading="Notes:")


def spot_cells(
    option: CostOption,
    spot: Interruptions | None,
    advisor: AdvisorFigures | None = None,
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
    from costguard.pricing.interruptions import effective_total_usd

    effective = effective_total_usd(option, spot)
    return [f"{spot.expected_preemptions:.1f}", format_usd(effective)]


def print_slurm_table(slurm: SlurmOption) -> None:
    """The SLURM allocation: GPU-hours, service units, and dollars only when given."""
    from costguard.pricing.slurm import format_su

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
