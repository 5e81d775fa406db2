"""A person's question about cost, as typed values, checked: what ``costguard estimate``,
``costguard pilot``, ``launch --pilot-steps`` and :func:`costguard.estimate` ask. Pure.

:class:`Question` refuses a bad question when it is made (figures out of range, flags
that exclude each other); :func:`answer` prices it, one estimate per GPU asked for, after
every name is checked against the tables. :mod:`costguard.pricing.quote` adds the rest of
the answer (the data's region looked up from its URL, budget, SLURM, preemptions,
measured hours).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, NamedTuple

from costguard.errors import CostguardError, InputError, UnknownNameError
from costguard.money import parse_decimal
from costguard.pricing.advice import expand_regions, split_names
from costguard.pricing.catalog import SLURM, Catalog, Market, Region, check_provider
from costguard.pricing.estimate import DEFAULT_DISK_GB, Estimate, EstimateRequest, estimate
from costguard.pricing.gpus import canonical_gpu, other_gpus_near
from costguard.pricing.retired import retired_carrying

if TYPE_CHECKING:
    from costguard.pricing.interruptions import Checkpointing
    from costguard.pricing.slurm import SlurmRate

#: The largest values a question may hold (ten years; a hundred thousand instances; an
#: exabyte): beyond them a figure is a typo, not a plan.
MAX_HOURS = 24 * 366 * 10
MAX_COUNT = 100_000
MAX_GB = 10**9
#: ``--interruptions-per-day advisor``: each AWS row's rate from its Spot Instance
#: Advisor band (:mod:`costguard.pricing.advisor`), not one rate for all.
ADVISOR_WORD = "advisor"
#: Stated defaults when the user gives a preemption rate but no checkpoint figures.
DEFAULT_EVERY_MINUTES = Decimal(30)
DEFAULT_SAVE_SECONDS = Decimal(60)
DEFAULT_RESTART_MINUTES = Decimal(5)


class Bounds(NamedTuple):
    """The range of one figure of a question: ``above`` refuses the minimum itself;
    ``unit`` names what the bounds count, in the error. (A named tuple: two dozen of
    them are made on every start-up.)"""

    minimum: int
    maximum: int
    above: bool = False
    unit: str = ""

    def check(self, name: str, value: Decimal | int) -> None:
        """Raise an :class:`InputError` naming ``name`` when ``value`` is out of range.

        >>> Bounds(0, 10, above=True).check("hours", Decimal(0))
        Traceback (most recent call last):
        ...
        costguard.errors.InputError: hours: must be more than 0, not '0'
        """
        unit = f" {self.unit}" if self.unit else ""
        if self.above and value <= self.minimum:
            problem = f"must be more than {self.minimum}"
        elif value < self.minimum:
            problem = f"must be at least {self.minimum}"
        elif value > self.maximum:
            problem = f"must be at most {self.maximum}{unit}"
        else:
            return
        msg = f"{name}: {problem}, not '{value}'"
        low = f"more than {self.minimum}" if self.above else f"from {self.minimum}"
        raise InputError(msg, hint=f"{name} takes a number {low} up to {self.maximum}{unit}")


#: The range of each decimal figure of a :class:`Question` (the CLI's options take theirs).
NUMBERS = {
    "hours": Bounds(0, MAX_HOURS, above=True, unit="hours (10 years)"),
    "epochs": Bounds(0, 10**6, above=True, unit="epochs"),
    "speedup": Bounds(0, 1000, above=True),
    "disk_gb": Bounds(0, MAX_GB),
    "storage_gb": Bounds(0, MAX_GB),
    "storage_months": Bounds(0, 1200),
    "egress_gb": Bounds(0, MAX_GB),
    "data_gb": Bounds(0, MAX_GB),
    "budget": Bounds(0, 10**9, above=True),
    "su_per_gpu_hour": Bounds(0, 10**9, above=True),
    "su_budget": Bounds(0, 10**15, above=True),
    "usd_per_su": Bounds(0, 10**6),
    "interruptions_per_day": Bounds(0, 48),
    "every_minutes": Bounds(0, 10_080, above=True),
    "save_seconds": Bounds(0, 86_400),
    "restart_minutes": Bounds(0, 1_440),
}
#: The range of each whole-number figure of a :class:`Question`.
WHOLE_NUMBERS = {
    "count": Bounds(1, MAX_COUNT),
    "gpus_per_instance": Bounds(1, 64),
    "steps": Bounds(1, 10**12),
    "top": Bounds(0, 10_000),
}


def to_decimal(name: str, value: float | int | str | Decimal) -> Decimal:
    """A figure given as a number or its text, as a ``Decimal``; an :class:`InputError`
    naming ``name`` when it is no finite number.

    >>> to_decimal("hours", 8.5)
    Decimal('8.5')
    """
    try:
        return parse_decimal(value)
    except ValueError:
        msg = f"{name}: is not a finite number, not '{value}'"
        raise InputError(msg, hint=f"{name} takes a finite number") from None


@dataclass(frozen=True)
class Question:
    """What a run needs, in the words of ``costguard estimate``'s options; checked when
    made (an :class:`InputError` with a hint on a bad one).

    ``gpus`` may name several models (``("l4,t4",)`` or ``("l4", "t4")``); ``providers``
    and ``regions`` are names as given (a region may be a group such as ``europe``);
    ``spot`` is ``None`` for both markets side by side. The run's length is ``hours``, or
    the pace recorded at ``from_run`` times ``steps`` (or ``epochs``).

    >>> Question(hours=Decimal(8), gpus=("a10g",), count=4).count
    4
    """

    hours: Decimal | None = None
    count: int = 1
    gpus: tuple[str, ...] = ()
    gpus_per_instance: int = 1
    instance_type: str | None = None
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    spot: bool | None = None
    disk_gb: Decimal = DEFAULT_DISK_GB
    storage_gb: Decimal = Decimal(0)
    storage_months: Decimal = Decimal(1)
    egress_gb: Decimal = Decimal(0)
    data_url: str | None = None
    data_region: str | None = None
    data_gb: Decimal = Decimal(0)
    #: A run's store (``--from-run``): the hours are its recorded pace x ``steps``.
    from_run: str | None = None
    steps: int | None = None
    epochs: Decimal | None = None
    speedup: Decimal | None = None
    #: USD: whether each option fits, and how many hours it buys.
    budget: Decimal | None = None
    #: How many of the cheapest provider/regions to show (0: all).
    top: int = 10
    #: ``--provider slurm``: the allocation's rate, budget and worth.
    su_per_gpu_hour: Decimal | None = None
    su_budget: Decimal | None = None
    usd_per_su: Decimal | None = None
    #: Spot preemptions a day (or :data:`ADVISOR_WORD`), and how the run checkpoints.
    interruptions_per_day: Decimal | str | None = None
    every_minutes: Decimal | None = None
    save_seconds: Decimal | None = None
    restart_minutes: Decimal | None = None

    def __post_init__(self) -> None:
        _check_figures(self)
        slurm_rate(self)
        checkpointing(self)
        _check_length(self)


def _check_figures(question: Question) -> None:
    """Every figure within its range (the CLI's options have checked theirs already)."""
    for name, bounds in NUMBERS.items():
        value = getattr(question, name)
        if value is None or value == ADVISOR_WORD:
            continue
        if not isinstance(value, Decimal) or not value.is_finite():
            msg = f"{name}: is not a finite number, not '{value}'"
            raise InputError(msg, hint=f"{name} takes a finite number")
        bounds.check(name, value)
    for name, bounds in WHOLE_NUMBERS.items():
        value = getattr(question, name)
        if value is None:
            continue
        if not isinstance(value, int) or not bounds.minimum <= value <= bounds.maximum:
            msg = (
                f"{name} must be a whole number from {bounds.minimum} to {bounds.maximum}, "
                f"not {value!r}"
            )
            raise InputError(msg, hint=f"e.g. {name}=1")


def _check_length(question: Question) -> None:
    """Exactly one of --hours and --from-run; --steps and --speedup only with --from-run."""
    if question.from_run is None:
        if question.hours is None:
            msg = "the run's length is missing: give --hours, or --from-run with --steps"
            raise InputError(
                msg, hint="costguard estimate --gpu a10g --hours 8 (or --from-run URL --steps N)"
            )
        for flag in ("steps", "epochs", "speedup"):
            if getattr(question, flag) is not None:
                msg = f"--{flag} is for --from-run (a measured run), and it is not given"
                raise InputError(msg, hint=f"add --from-run URL, or drop --{flag}")
        return
    if question.hours is not None:
        msg = "--hours and --from-run both give the hours"
        raise InputError(msg, hint="drop --hours to price the measured ones")
    if question.steps is not None and question.epochs is not None:
        msg = "--steps and --epochs both give the run's length"
        raise InputError(msg, hint="keep one of them")
    if len(split_names(question.gpus)) > 1:
        msg = "--from-run prices one GPU: the one measured, or one --gpu with --speedup"
        raise InputError(msg, hint="run the estimate once per GPU")
    if question.instance_type is not None:
        msg = "--from-run prices the measured GPU; --instance-type is not taken with it"
        raise InputError(msg, hint="use --gpu (and --speedup for another GPU than measured)")


def _flags_given(question: Question, names: Sequence[str]) -> list[str]:
    """The options (``--su-budget``) of the fields ``names`` that the question gives."""
    return ["--" + name.replace("_", "-") for name in names if getattr(question, name) is not None]


def slurm_rate(question: Question) -> SlurmRate | None:
    """The SLURM rate when --provider slurm is asked for; an :class:`InputError` on a
    half-given one."""
    wanted = any(p.strip().lower() == SLURM for p in question.providers)
    given = _flags_given(question, ("su_per_gpu_hour", "su_budget", "usd_per_su"))
    if not wanted:
        if given:
            msg = f"{given[0]} is for SLURM allocations, and --provider slurm is not asked for"
            raise InputError(msg, hint=f"add --provider slurm, or drop {given[0]}")
        return None
    from costguard.pricing.slurm import SlurmRate  # --provider slurm only

    if question.su_per_gpu_hour is None:
        msg = "--provider slurm needs --su-per-gpu-hour (allocations are counted in SUs)"
        raise InputError(
            msg,
            hint="your centre publishes it, e.g. --su-per-gpu-hour 64 (a GPU-hour costs 64 SU)",
        )
    return SlurmRate(
        su_per_gpu_hour=question.su_per_gpu_hour,
        usd_per_su=question.usd_per_su,
        su_budget=question.su_budget,
    )


def checkpointing(question: Question) -> Checkpointing | None:
    """The spot preemption figures when --interruptions-per-day is given; an
    :class:`InputError` on checkpoint figures without a rate, or on a rate for on-demand
    only."""
    per_day = question.interruptions_per_day
    given = _flags_given(question, ("every_minutes", "save_seconds", "restart_minutes"))
    if per_day is None:
        if given:
            msg = f"{given[0]} prices spot preemptions, and --interruptions-per-day is not given"
            raise InputError(
                msg, hint="add --interruptions-per-day N (e.g. 1), or drop " + given[0]
            )
        return None
    if question.spot is False:
        msg = "--interruptions-per-day prices spot, and --on-demand asks for on-demand only"
        raise InputError(msg, hint="drop --on-demand to see spot next to on-demand")
    from costguard.pricing.interruptions import Checkpointing  # --interruptions-per-day only

    return Checkpointing(
        every_minutes=_given(question.every_minutes, DEFAULT_EVERY_MINUTES),
        save_seconds=_given(question.save_seconds, DEFAULT_SAVE_SECONDS),
        restart_minutes=_given(question.restart_minutes, DEFAULT_RESTART_MINUTES),
        # advisor: each row's own rate, set per row (pricing.advisor.advisor_figures)
        per_day=Decimal(0) if isinstance(per_day, str) else per_day,
    )


def _given(value: Decimal | None, default: Decimal) -> Decimal:
    """The value given, else the stated default."""
    return default if value is None else value


def build_request(catalog: Catalog, question: Question, gpu: str | None) -> EstimateRequest:
    """Validate the names of ``question`` against the tables and build the request for
    one GPU (no cloud call)."""
    providers, regions = _places(catalog, question, gpu)
    spot = question.spot
    markets = (
        (Market.ON_DEMAND, Market.SPOT)
        if spot is None
        else ((Market.SPOT,) if spot else (Market.ON_DEMAND,))
    )
    data_region = question.data_region
    if question.hours is None:  # a --from-run question: pricing.quote measures the hours
        msg = "the run's hours are not measured yet"
        raise InputError(msg, hint="price a --from-run question with costguard.pricing.quote")
    return EstimateRequest(
        hours=question.hours,
        count=question.count,
        gpu=canonical_gpu(gpu, catalog.accelerators) if gpu else None,
        gpus_per_instance=question.gpus_per_instance,
        instance_type=question.instance_type,
        providers=providers,
        regions=tuple(dict.fromkeys(regions)),
        markets=markets,
        disk_gb=question.disk_gb,
        storage_gb=question.storage_gb,
        storage_months=question.storage_months,
        egress_gb=question.egress_gb,
        data_region=catalog.find_region(data_region) if data_region else None,
        data_gb=question.data_gb,
    )


def _find_region(
    catalog: Catalog, name: str, providers: tuple[str, ...], gpu: str | None
) -> Region:
    """:meth:`Catalog.find_region`, whose did-you-mean names only regions of the providers
    asked for, or else of those that have the GPU (an AWS-only GPU: AWS regions)."""
    try:
        return catalog.find_region(name)
    except UnknownNameError as exc:
        clouds = set(providers)
        if not clouds and gpu:
            with contextlib.suppress(CostguardError):  # an unknown GPU is reported later
                wanted = canonical_gpu(gpu, catalog.accelerators)
                clouds = {i.provider for i in catalog.instances if i.accelerator == wanted}
        if not clouds or ":" in name:
            raise
        import difflib  # on error paths only

        labels = {"aws": "AWS", "gcp": "GCP", "azure": "Azure"}
        close = []
        for cloud in sorted(clouds):
            names = [r.name for r in catalog.regions if r.provider == cloud]
            if found := difflib.get_close_matches(exc.name, names, n=2, cutoff=0.6):
                close.append(f"{' or '.join(found)} ({labels.get(cloud, cloud)})")
        kind = "/".join(labels.get(c, c) for c in sorted(clouds))
        known = [r.name for r in catalog.regions if r.provider in clouds]
        hint = f"did you mean {'; '.join(close)}?" if close else None
        what = f"{kind} region"
        raise UnknownNameError(what, exc.name, known, hint=hint) from None


def _places(
    catalog: Catalog, question: Question, gpu: str | None
) -> tuple[tuple[str, ...], list[str]]:
    """The providers and regions ``question`` names, checked against the tables (for
    ``gpu``'s closest regions in a hint)."""
    clouds = [p for p in question.providers if p.strip().lower() != SLURM]
    providers = tuple(dict.fromkeys(check_provider(p) for p in clouds))
    regions = []
    for name in question.regions:
        group = expand_regions(name, catalog.regions)
        if group == []:
            msg = f"the tables have no region in {name}"
            raise InputError(msg, hint="`costguard pricing show regions` lists them")
        for region in group or [_find_region(catalog, name, providers, gpu)]:
            if providers and region.provider not in providers:
                if group is not None:
                    continue  # a group stays within the providers asked for
                providers = (*providers, region.provider)
            regions.append(region.name)
    if question.regions and not regions:
        msg = f"none of the regions {', '.join(question.regions)} is of {', '.join(providers)}"
        raise InputError(msg, hint="drop --provider, or name another region")
    return providers, regions


def check_names(catalog: Catalog, question: Question) -> None:
    """Refuse the GPU, provider and region names of ``question`` that the tables do not
    know (:class:`InputError`, with the closest names), before work that takes time: a
    pilot runs its script first and prices its pace after. No cloud call."""
    names: list[str | None] = [*split_names(question.gpus)] or [None]
    for name in names:
        if name is not None:
            canonical_gpu(name, catalog.accelerators)
        _places(catalog, question, name)


def answer(question: Question, catalog: Catalog) -> list[Estimate]:
    """One estimate per GPU asked for (``--gpu l4,t4``), or the one for the instance
    type. A GPU not offered where asked is left out when another is (the first such
    error is raised when none is)."""
    names: list[str | None] = [*split_names(question.gpus)] or [None]
    results: list[Estimate] = []
    errors: list[InputError] = []
    for name in names:
        request = build_request(catalog, question, name)
        try:
            results.append(estimate(request, catalog))
        except InputError as exc:
            if len(names) == 1:
                raise
            errors.append(exc)
    if not results:
        raise errors[0]
    extra = []
    if question.data_url and not question.data_gb:
        extra.append("Give --data-gb (how much of the data the run reads) to price moving it")
    return [
        r._replace(
            notes=(
                *extra,
                *_near_gpu_notes(question, r, catalog),
                *_retired_notes(r, catalog),
                *r.notes,
            )
        )
        for r in results
    ]


def _retired_notes(result: Estimate, catalog: Catalog) -> list[str]:
    """A note for each retired series of the GPU asked for, of a provider asked for
    (``--gpu v100``: Azure's V100 sizes are not in the answer because Azure retired them)."""
    request = result.request
    if request.gpu is None:
        return []
    asked = set(request.providers) or {
        r.provider for r in catalog.regions if r.name in request.regions
    }
    return [
        f"No {series.series} size is priced: {series.said()} ({series.instead()})"
        for series in retired_carrying(request.gpu, asked)
    ]


def _near_gpu_notes(question: Question, result: Estimate, catalog: Catalog) -> list[str]:
    """A note naming another GPU, one letter longer, that a provider asked for offers and
    this GPU's do not (``--gpu a10``: Azure's A10 only; AWS's A10G is another GPU), with
    the command that prices it."""
    gpu = result.request.gpu
    if gpu is None:
        return []
    offered: dict[str, set[str]] = {}
    for row in catalog.instances:
        if row.accelerator and (not question.providers or row.provider in question.providers):
            offered.setdefault(row.accelerator, set()).add(row.provider)
    providers = {name: frozenset(where) for name, where in offered.items()}
    notes = []
    for other in other_gpus_near(gpu, providers):
        command = f"costguard estimate --gpu {other.lower()} --hours {question.hours}"
        if question.count != 1:
            command += f" --count {question.count}"
        notes.append(
            f"{gpu} is offered by {', '.join(sorted(providers.get(gpu, ())))} only; "
            f"{other} ({', '.join(sorted(providers[other]))}) is another GPU: `{command}` "
            "prices it"
        )
    return notes


def combine(results: Sequence[Estimate]) -> Estimate:
    """Several GPUs' estimates as one: every option, cheapest first."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    options = sorted((o for r in results for o in r.options), key=lambda o: o.sort_key)
    near = [r.near_data for r in results if r.near_data is not None]
    notes = dict.fromkeys(n for r in results for n in r.notes)
    return first._replace(
        options=tuple(options),
        near_data=min(near, key=lambda o: o.sort_key) if near else None,
        notes=tuple(notes),
    )
