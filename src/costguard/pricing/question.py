"""A person's question about cost, as typed values, and the estimates that answer it:
one per GPU asked for, with the data's region looked up from its URL when given.

The CLI (``costguard estimate``) and the notebook API (:func:`costguard.estimate`) build a
:class:`Question` from their arguments and call :func:`answer` (or :func:`build_request`);
every name is checked against the tables before any lookup goes out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

from costguard.errors import CostguardError, InputError, UnknownNameError
from costguard.pricing.advice import expand_regions, split_names
from costguard.pricing.catalog import Catalog, Market, Region, check_provider
from costguard.pricing.estimate import DEFAULT_DISK_GB, Estimate, EstimateRequest, estimate
from costguard.pricing.gpus import canonical_gpu
from costguard.pricing.slurm import SLURM

#: The largest values a question may hold (ten years; a hundred thousand instances; an
#: exabyte): beyond them a figure is a typo, not a plan.
MAX_HOURS = 24 * 366 * 10
MAX_COUNT = 100_000
MAX_GB = 10**9


@dataclass(frozen=True)
class Question:
    """What a run needs, in the words of ``costguard estimate``'s options.

    ``gpus`` may name several models (``("l4,t4",)`` or ``("l4", "t4")``); ``providers``
    and ``regions`` are names as given (a region may be a group such as ``europe``);
    ``spot`` is ``None`` for both markets side by side.
    """

    hours: Decimal
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


def build_request(catalog: Catalog, question: Question, gpu: str | None) -> EstimateRequest:
    """Validate the names of ``question`` against the tables and build the request for
    one GPU (no cloud call)."""
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
    spot = question.spot
    markets = (
        (Market.ON_DEMAND, Market.SPOT)
        if spot is None
        else ((Market.SPOT,) if spot else (Market.ON_DEMAND,))
    )
    data_region = question.data_region
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


def answer(question: Question, catalog: Catalog) -> list[Estimate]:
    """One estimate per GPU asked for (``--gpu l4,t4``), or the one for the instance
    type. A GPU not offered where asked is left out when another is (the first such
    error is raised when none is)."""
    names: list[str | None] = [*split_names(question.gpus)] or [None]
    located = None
    if question.data_url and not question.data_region:
        # Bad input is refused before the lookup goes out.
        build_request(catalog, replace(question, data_gb=Decimal(0)), names[0])
        from costguard.pricing.locate import locate  # --data only: URL rules, dataset table

        located = locate(question.data_url)
        question = replace(question, data_region=f"{located.provider}:{located.region}")
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
    if located is not None:
        extra.append(f"Data: {located.how}")
    if question.data_url and not question.data_gb:
        extra.append("Give --data-gb (how much of the data the run reads) to price moving it")
    return [replace(r, notes=(*extra, *r.notes)) for r in results]


def combine(results: Sequence[Estimate]) -> Estimate:
    """Several GPUs' estimates as one: every option, cheapest first."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    options = sorted((o for r in results for o in r.options), key=lambda o: o.sort_key)
    near = [r.near_data for r in results if r.near_data is not None]
    notes = dict.fromkeys(n for r in results for n in r.notes)
    return replace(
        first,
        options=tuple(options),
        near_data=min(near, key=lambda o: o.sort_key) if near else None,
        notes=tuple(notes),
    )
