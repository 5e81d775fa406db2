"""The whole answer to a cost question, as ``costguard estimate`` gives it: :func:`quote`
prices a :class:`~costguard.pricing.question.Question` into a :class:`Quote`.

A quote holds everything the command prints: the estimate of each GPU asked for, the
options shown, the SLURM allocation, the spot preemption figures (one rate, or each AWS
row's Spot Instance Advisor band), the hours measured from a recorded run, the prices'
age and the budget's verdict. :meth:`Quote.document` is the ``--format json`` document,
:meth:`Quote.records` the ``--format csv`` rows; the CLI, ``costguard pilot``, ``launch
--pilot-steps`` and :func:`costguard.estimate` all ask here.

>>> from costguard.pricing.tables import load_catalog
>>> answer = quote(Question(hours=Decimal(8), gpus=("a10g",), count=4), load_catalog())
>>> answer.estimate.request.count, answer.estimate.cheapest is not None
(4, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from costguard.errors import BudgetExceededError, InputError
from costguard.money import format_usd
from costguard.pricing.advice import cheapest_line, describe, split_names, unverified_fit
from costguard.pricing.catalog import Catalog, Market, Staleness, staleness
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
from costguard.pricing.estimate import CostOption, Estimate, limit_places
from costguard.pricing.question import (
    ADVISOR_WORD,
    MAX_HOURS,
    Question,
    answer,
    build_request,
    checkpointing,
    combine,
    slurm_rate,
)

if TYPE_CHECKING:
    from costguard.checkpoint.pace import Pace
    from costguard.pricing.advisor import AdvisorFigures
    from costguard.pricing.interruptions import Checkpointing, Interruptions
    from costguard.pricing.locate import Located
    from costguard.pricing.measured import Measured
    from costguard.pricing.slurm import SlurmOption, SlurmRate


class Quote(NamedTuple):
    """A priced :class:`Question`: what ``costguard estimate`` prints, as values.

    ``estimates`` has one estimate per GPU asked for; ``estimate`` is them combined,
    cheapest first; ``shown`` its ``top`` cheapest places. ``spot`` holds the preemption
    figures at one stated rate, ``advisor`` those at each AWS row's band; ``measured`` the
    hours read from ``--from-run`` (``question`` then holds them as its hours); ``today``
    the date the prices' age (``stale``) is counted at.
    """

    question: Question
    estimates: tuple[Estimate, ...]
    estimate: Estimate
    shown: tuple[CostOption, ...]
    catalog: Catalog
    rate: SlurmRate | None = None
    slurm: SlurmOption | None = None
    spot: Interruptions | None = None
    advisor: AdvisorFigures | None = None
    measured: Measured | None = None
    stale: Staleness | None = None
    today: date | None = None

    @property
    def budget(self) -> Decimal | None:
        """The budget asked about, in USD."""
        return self.question.budget

    def shown_of(self, one: Estimate) -> tuple[CostOption, ...]:
        """The options of one GPU's estimate that its table shows (``top`` places)."""
        return tuple(limit_places(one.options, self.question.top))

    def showing(self, top: int) -> Quote:
        """The same answer with its tables showing the ``top`` cheapest places (0: all)."""
        shown = tuple(limit_places(self.estimate.options, top))
        stale = self.stale
        if self.today is not None:
            stale = staleness(self.catalog, places(shown), self.today)
        return self._replace(question=replace(self.question, top=top), shown=shown, stale=stale)

    def extra_assumptions(self, shown: Sequence[CostOption] | None = None) -> list[str]:
        """What the SLURM, preemption and measured figures assume, after the estimate's;
        the advisor's bands of the options ``shown`` (default: :attr:`shown`)."""
        lines: list[str] = []
        if self.slurm is not None:
            from costguard.pricing.slurm import slurm_assumptions

            lines += slurm_assumptions(self.slurm)
        if self.spot is not None:
            from costguard.pricing import interruptions

            lines += interruptions.assumption_lines(self.spot)
        if self.advisor is not None:
            from costguard.pricing import advisor as bands

            lines += bands.assumption_lines(self.advisor, self.shown if shown is None else shown)
        if self.measured is not None:
            from costguard.pricing.measured import assumption_lines

            lines += assumption_lines(self.measured)
        return lines

    def stale_warning(self) -> str | None:
        """The prices' age when they are old (without prefix and hint), else ``None``."""
        return stale_text(self.stale, self.catalog)

    def document(self) -> dict[str, Any]:
        """The ``costguard estimate --format json`` document (money as Decimal)."""
        base = to_document(self.estimate, self.shown, self.catalog, self.budget, self.question.top)
        query: dict[str, Any] = {
            **base["query"],
            "gpus": [r.request.gpu for r in self.estimates if r.request.gpu],
            "slurm": slurm_query(self.rate),
        }
        summary = self._preemption_summary()
        if summary is not None:
            query["interruptions"] = {
                k: summary[k]
                for k in ("preemptions_per_day", "every_minutes", "save_seconds", "restart_minutes")
            }
        if self.measured is not None:
            from costguard.pricing.measured import hours_from

            query["hours_from"] = hours_from(self.measured)
        document = {
            **base,
            "query": query,
            "pricing_source": {**base["pricing_source"], "stale_warning": self.stale_warning()},
            "assumptions": [*base["assumptions"], *self.extra_assumptions()],
            "options": [
                self._option_document(row, option)
                for row, option in zip(base["options"], self.shown, strict=True)
            ],
            "cheapest": cheapest_line(self.estimate.options),
            "slurm": slurm_document(self.slurm, self.estimate.cheapest),
        }
        if summary is not None:
            document["interruptions"] = summary
        return document

    def _preemption_summary(self) -> dict[str, object] | None:
        """The run's preemption figures in the JSON, when asked for."""
        if self.spot is not None:
            from costguard.pricing.interruptions import document

            return document(self.spot, self.shown)
        if self.advisor is not None:
            from costguard.pricing import advisor as bands

            return bands.document(self.advisor)
        return None

    def _option_document(self, row: dict[str, Any], option: CostOption) -> dict[str, Any]:
        """One option's JSON: its record, a spot row's preemption figures, and whether
        its hours were scaled from another GPU's."""
        extra: dict[str, object] = {}
        if option.market is Market.SPOT and self.spot is not None:
            from costguard.pricing.interruptions import effective_total_usd

            extra = {
                "expected_preemptions": self.spot.expected_preemptions,
                "effective_hours": self.spot.effective_hours,
                "effective_total_usd": effective_total_usd(option, self.spot),
            }
        elif option.market is Market.SPOT and self.advisor is not None:
            from costguard.pricing import advisor as bands

            extra = bands.option_fields(self.advisor, option)
        if self.measured is not None and self.measured.scaled:
            extra["scaled"] = True
        return {**row, **extra}

    def records(self) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
        """The ``--format csv`` columns and rows: one per option shown, then the SLURM
        allocation's."""
        columns = (*OPTION_FIELDS, "pricing_as_of", *(SLURM_FIELDS if self.slurm else ()))
        rows = [option_row(o, self.catalog) for o in self.shown]
        if self.slurm is not None:
            rows.append(slurm_row(self.slurm, self.estimate.request))
        return columns, rows

    def budget_error(self) -> BudgetExceededError | None:
        """Why the run does not fit: its cheapest option is over ``budget``, or the SLURM
        run needs more SUs than are left; ``None`` when it fits (or no budget is given)."""
        cheapest = self.estimate.cheapest
        budget = self.budget
        if budget is not None and cheapest is not None and cheapest.total_usd > budget:
            msg = (
                f"the cheapest option ({describe(cheapest)}, {format_usd(cheapest.total_usd)}) "
                f"is over the budget of {format_usd(budget)}"
                f"{unverified_fit(self.estimate, budget)}"
            )
            return BudgetExceededError(
                msg, hint="fewer hours or instances, spot, a smaller GPU, or a bigger budget"
            )
        slurm = self.slurm
        if slurm is not None and slurm.within_budget is False:
            from costguard.pricing.slurm import format_su

            msg = (
                f"the SLURM run needs {format_su(slurm.service_units)} SU, more than the "
                f"--su-budget of {format_su(slurm.rate.su_budget or Decimal(0))} SU"
            )
            return BudgetExceededError(
                msg, hint="fewer hours or GPUs, a supplement to the allocation, or the cloud"
            )
        return None


def quote(
    question: Question, catalog: Catalog, *, today: date | None = None, pace: Pace | None = None
) -> Quote:
    """Price ``question`` from ``catalog`` as ``costguard estimate`` does.

    Reads the recorded pace of ``question.from_run`` (a store; ``pace``: the record the
    caller read there and checked, used as it is and not read again), the advisor table for
    ``interruptions_per_day="advisor"``, and looks up the region of ``data_url``
    (:mod:`costguard.pricing.locate`: S3 answers, or the table of well-known datasets),
    then prices each GPU (:func:`~costguard.pricing.question.answer`); prices older than
    their limit at ``today`` (default: the UTC date) are flagged in :attr:`Quote.stale`.
    A budget the run does not fit is :meth:`Quote.budget_error`, for the caller to raise
    after showing the figures.

    Raises:
        InputError: a name the tables do not know, a run with no recorded pace, a GPU
            not offered where asked, a data URL whose region cannot be found.
        StoreError: the run's store cannot be read now.
    """
    rate = slurm_rate(question)
    figures = checkpointing(question)
    measured = None
    if question.from_run is not None:
        measured = _measured(question, catalog, pace)
        question = replace(
            question, from_run=None, steps=None, epochs=None, speedup=None,
            hours=measured.hours, gpus=(measured.gpu,),
        )  # fmt: skip
    located = None
    if question.data_url and not question.data_region:
        question, located = _locate_data(question, catalog)
    estimates = answer(question, catalog)
    if located is not None:
        estimates = [e._replace(notes=(f"Data: {located.how}", *e.notes)) for e in estimates]
    combined = combine(estimates)
    shown = tuple(limit_places(combined.options, question.top))
    hours = combined.request.hours
    today = today or datetime.now(UTC).date()
    spot = advisor = None
    if figures is not None:
        from costguard.pricing.interruptions import expected

        if question.interruptions_per_day == ADVISOR_WORD:
            advisor = _advisor(hours, figures, catalog, shown)
        else:
            spot = expected(hours, figures)
    return Quote(
        question=question,
        estimates=tuple(estimates),
        estimate=combined,
        shown=shown,
        catalog=catalog,
        rate=rate,
        slurm=_slurm(combined, rate),
        spot=spot,
        advisor=advisor,
        measured=measured,
        stale=staleness(catalog, places(shown), today),
        today=today,
    )


def _locate_data(question: Question, catalog: Catalog) -> tuple[Question, Located]:
    """The question with its data's region looked up from ``data_url``; a bad question is
    refused before the lookup goes out."""
    first = [*split_names(question.gpus), None][0]
    build_request(catalog, replace(question, data_gb=Decimal(0)), first)
    from costguard.pricing.locate import locate  # --data only: URL rules, dataset table

    located = locate(question.data_url or "")
    return replace(question, data_region=f"{located.provider}:{located.region}"), located


def _slurm(estimate: Estimate, rate: SlurmRate | None) -> SlurmOption | None:
    """The same GPUs and hours on the SLURM allocation, when one is asked about."""
    if rate is None:
        return None
    from costguard.pricing.slurm import slurm_option

    return slurm_option(estimate.request, rate)


def _advisor(
    hours: Decimal,
    figures: Checkpointing,
    catalog: Catalog,
    shown: Sequence[CostOption],
) -> AdvisorFigures:
    """Each shown spot row's preemptions at the rate of its AWS Spot Instance Advisor
    band (the table is read only here, not on every estimate)."""
    from costguard.pricing.advisor import advisor_figures
    from costguard.pricing.tables import load_interruptions

    info, rows = load_interruptions(catalog.directory)
    return advisor_figures(hours, figures, rows, shown, as_of=info.as_of, source=info.source)


def _measured(question: Question, catalog: Catalog, checked: Pace | None) -> Measured:
    """The hours of ``steps`` (or ``epochs``) at the pace the run at ``from_run``
    recorded (``checked``, when the caller read it already: a second read could find
    another record), on its GPU or the one asked for."""
    from costguard import contract
    from costguard.checkpoint.pace import read_pace
    from costguard.checkpoint.store import Store, storage_options_from_env
    from costguard.pricing.gpus import canonical_gpu
    from costguard.pricing.measured import gpu_of_device, measure, steps_for_epochs

    assert question.from_run is not None
    url = question.from_run
    url = url if "://" in url else str(Path(url).expanduser().resolve())  # as the job records it
    if "://" not in url and not Path(url).is_dir():
        msg = f"--from-run: no run at {url} (no such folder)"
        raise InputError(msg, hint="pass the --checkpoint URL the run wrote to")
    store = Store.open(url, storage_options_from_env())
    pace = checked if checked is not None else read_pace(store)
    if pace is None:
        msg = f"--from-run: {url} holds no measured pace (no job/pace.json)"
        raise InputError(
            msg,
            hint="measure one: costguard pilot --steps 200 -- python train.py (or any "
            "costguard run whose Checkpointer has saved once)",
        )
    accelerators = catalog.accelerators
    # A job.json that is not costguard's is named and left out: the pace is the run's.
    job = contract.read_or_warn(store, contract.JOB_FILE, contract.JOB, contract.JOB_BYTES)
    measured_gpu = (
        canonical_gpu(job["spec"]["gpu"], accelerators)
        if job is not None  # launched: the GPU it asked for
        else gpu_of_device(pace.device, accelerators)
    )
    asked = split_names(question.gpus)
    gpu = canonical_gpu(asked[0], accelerators) if asked else measured_gpu
    if gpu is None:
        msg = f"--from-run: {url} was measured on {pace.device}, which the tables do not price"
        raise InputError(
            msg, hint="name the GPU to price: --gpu a10g --speedup F (F: how many times as fast)"
        )
    epochs = question.epochs
    steps = steps_for_epochs(pace, epochs, url) if epochs else question.steps or pace.total_steps
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
        speedup=question.speedup,
        max_hours=Decimal(MAX_HOURS),
        epochs=epochs,
    )
