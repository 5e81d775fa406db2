"""Refresh the price tables: check the request, read each provider, merge, write.

:func:`plan_refresh` validates names and folders before anything reaches the network
(bad input is an :class:`~costguard.errors.InputError`). :func:`refresh_tables` reads
the providers side by side; one that fails, whatever the error, is reported and leaves
its rows as they were, while the others are merged and written (atomically) all the
same. Only the regions prices came back for are refreshed; the others keep their rows,
date and source, and are reported.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from costguard.errors import CostguardError, InputError
from costguard.pricing.advisor import InterruptionTable
from costguard.pricing.catalog import PROVIDERS, Catalog, check_provider
from costguard.pricing.refresh import advisor, cache, mirror
from costguard.pricing.refresh.merge import (
    FreshPrices,
    MergeStats,
    TableMeta,
    Target,
    merge_tables,
    new_rows,
)
from costguard.pricing.tables import load_gpu_parts, load_tables
from costguard.providers import adapter_class
from costguard.retry import RetryPolicy
from costguard.settings import Settings
from costguard.workers import worker_pool

#: Called with (provider, records read so far) as a refresh goes.
Progress = Callable[[str, int], object]


@dataclass(frozen=True)
class RefreshPlan:
    """A checked request: what to read for each provider, from where, and where to write."""

    targets: tuple[Target, ...]
    output: Path
    mirror: Path | None = None
    #: Whether the regions were named (``--region``); else every region in the tables
    #: (with a mirror: those the mirror holds prices for).
    regions_named: bool = False
    #: The interruption table read from the mirror's Spot Instance Advisor file, if any.
    interruptions: InterruptionTable | None = None


@dataclass(frozen=True)
class ProviderReport:
    """How one provider's refresh went: ``regions`` are those refreshed (prices came
    back for them; all those asked for when it failed); ``missing`` those asked for by
    name that nothing came back for (kept as they were)."""

    provider: str
    regions: tuple[str, ...]
    records: int = 0
    seconds: float = 0.0
    source: str = ""
    stats: MergeStats | None = None
    error: CostguardError | None = None
    missing: tuple[str, ...] = ()
    #: Regions whose answer was incomplete (pages missing): rows priced there updated,
    #: nothing marked "not listed", the region not re-dated.
    partial: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether its prices were read and merged."""
        return self.error is None


@dataclass(frozen=True)
class RefreshReport:
    """What a refresh did: per provider, and the tables it wrote (if any)."""

    output: Path
    refreshed_at: datetime
    providers: tuple[ProviderReport, ...]
    tables: tuple[TableMeta, ...] = ()
    #: The interruption table written (from the mirror's advisor file), if any.
    interruptions: InterruptionTable | None = None

    @property
    def written(self) -> bool:
        """Whether new tables were written (at least one provider refreshed)."""
        return bool(self.tables)

    @property
    def failed(self) -> tuple[ProviderReport, ...]:
        """The providers that could not be refreshed."""
        return tuple(p for p in self.providers if not p.ok)


def current_tables(output: Path) -> Catalog:
    """The tables a refresh into ``output`` starts from: those already there, or the
    bundled ones when they are newer than anything there (the rule of
    :func:`~costguard.pricing.tables.load_tables`), or when ``output`` has none.

    Leftovers of a crashed refresh are cleared first, so tables a crash moved aside
    are found again rather than rebuilt from the bundled ones.
    """
    cache.tidy(output)
    return load_tables(cache_dir=output)


def plan_refresh(
    catalog: Catalog,
    providers: Sequence[str] = (),
    regions: Sequence[str] = (),
    *,
    output: Path,
    mirror_dir: Path | None = None,
) -> RefreshPlan:
    """Check a request against the tables in use; nothing is fetched.

    Providers default to those of ``regions``, else (with ``mirror_dir``) those the
    mirror has responses for, else all three. Regions default to every region of the
    chosen providers in the tables; with ``mirror_dir``, in effect to those the mirror
    holds prices for (the others come back with nothing and are kept as they were,
    without a warning: see :attr:`RefreshPlan.regions_named`).

    >>> from costguard.pricing.tables import load_catalog
    >>> plan = plan_refresh(load_catalog(), regions=["us-east-1"], output=Path("out"))
    >>> [(t.provider, t.regions) for t in plan.targets]
    [('aws', ('us-east-1',))]
    """
    chosen = list(dict.fromkeys(check_provider(p) for p in providers))
    places = [catalog.find_region(name) for name in regions]
    for place in places:
        if chosen and place.provider not in chosen:
            msg = f"{place.name} is an {place.provider} region, not one of {', '.join(chosen)}"
            raise InputError(msg, hint=f"add --provider {place.provider}, or drop --region")
    if not chosen and places:
        chosen = list(dict.fromkeys(place.provider for place in places))
    interruptions = None
    if mirror_dir is not None:
        if not mirror_dir.is_dir():
            msg = f"{mirror_dir} is not a folder"
            raise InputError(msg, hint="--from names a folder of downloaded API responses")
        interruptions = advisor.read(mirror_dir, catalog)
        if not chosen:
            chosen = [p for p in PROVIDERS if mirror.has_responses(mirror_dir, p)]
            if not chosen and interruptions is None:
                msg = f"{mirror_dir} has no aws/, gcp/ or azure/ folder of API responses"
                raise InputError(msg, hint="see `costguard pricing refresh --help` for the layout")
        for provider in chosen:
            mirror.check(mirror_dir, provider)
    cache.check_target(output)
    targets = []
    # With a mirror that holds only the advisor's file, no provider's prices are read.
    only_interruptions = mirror_dir is not None and not chosen
    for provider in () if only_interruptions else chosen or PROVIDERS:
        wanted = [p.name for p in places if p.provider == provider] or [
            r.name for r in catalog.regions if r.provider == provider
        ]
        rows = tuple(
            row for row in catalog.instances if row.provider == provider and row.region in wanted
        )
        added = tuple(
            row
            for region in dict.fromkeys(wanted)
            if (provider, region) not in catalog.covered
            for row in new_rows(catalog, provider, region)
        )
        targets.append(Target(provider, tuple(dict.fromkeys(wanted)), rows + added, added))
    return RefreshPlan(
        targets=tuple(targets),
        output=output,
        mirror=mirror_dir,
        regions_named=bool(places),
        interruptions=interruptions,
    )


def refresh_tables(
    plan: RefreshPlan,
    catalog: Catalog,
    settings: Settings,
    *,
    now: datetime | None = None,
    retry: RetryPolicy | None = None,
    progress: Progress | None = None,
) -> RefreshReport:
    """Read every provider of ``plan`` (side by side), merge what was read into the
    tables in use and write them to ``plan.output``.

    A provider that fails (any error, as a :class:`~costguard.errors.CostguardError`)
    is reported in the result and its rows stay as they were; nothing is written when
    all fail. The merge starts from the tables in ``plan.output`` as they are once its
    lock is held (another refresh may have written since ``catalog`` was read), or from
    ``catalog`` when the output has none yet; so two refreshes at once both count.
    """
    now = now or datetime.now(UTC)
    with worker_pool(len(plan.targets), "costguard-refresh") as pool:  # Ctrl-C: not waited for
        futures = [
            pool.submit(_fetch_one, target, plan, settings, now, retry, progress)
            for target in plan.targets
        ]
        results = [future.result() for future in futures]
    fresh = [prices for prices, _ in results if prices is not None]
    reports = [report for _, report in results]
    if not fresh and plan.interruptions is None:
        return RefreshReport(plan.output, now, tuple(reports))
    cache.check_target(plan.output)
    with cache.locked(plan.output):
        base = current_tables(plan.output) if cache.has_tables(plan.output) else catalog
        merged = merge_tables(base, fresh, now, load_gpu_parts(base.directory))
        cache.write_tables(plan.output, merged, base, now, plan.interruptions)
    reports = [
        replace(report, stats=merged.stats[report.provider]) if report.ok else report
        for report in reports
    ]
    return RefreshReport(plan.output, now, tuple(reports), merged.meta, plan.interruptions)


def _fetch_one(
    target: Target,
    plan: RefreshPlan,
    settings: Settings,
    now: datetime,
    retry: RetryPolicy | None,
    progress: Progress | None,
) -> tuple[FreshPrices | None, ProviderReport]:
    """One provider's prices, or the error that stopped them; never raises (the other
    providers go on). An unexpected error is reported as a
    :class:`~costguard.errors.CostguardError` naming its type and the provider; so is
    a provider that came back with prices for none of the regions asked for."""
    # Looked up in the provider table, so a run for one provider imports only its SDK.
    fetch = adapter_class("price source", target.provider)
    started = time.perf_counter()

    def tell(records: int) -> None:
        if progress is not None:
            progress(target.provider, records)

    try:
        fresh: FreshPrices = fetch(
            target, settings, now=now, mirror=plan.mirror, retry=retry, progress=tell
        )
        if target.regions and not fresh.answered:
            where = plan.mirror / target.provider if plan.mirror else fresh.source
            names = ", ".join(target.regions[:5]) + (", ..." if len(target.regions) > 5 else "")
            msg = f"no prices came back for any region asked for ({names}) from {where}"
            raise CostguardError(msg, hint="check the region names, and the endpoint or mirror")
        fresh = replace(fresh, new_rows=target.new_rows)
    except CostguardError as exc:
        return None, _failed(target, started, exc)
    except Exception as exc:  # the partial-failure contract: report it, the others go on
        kind = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
        msg = f"unexpected {kind} while reading {target.provider} prices: {exc}"
        error = CostguardError(
            msg, hint="try again; if it happens again, please report it (costguard missed it)"
        )
        return None, _failed(target, started, error)
    seconds = time.perf_counter() - started
    answered = tuple(r for r in target.regions if r in fresh.answered)
    quiet = plan.mirror is not None and not plan.regions_named
    missing = () if quiet else tuple(r for r in target.regions if r in fresh.unanswered)
    partial = tuple(r for r in answered if r.lower() in fresh.rows.partial)
    report = ProviderReport(
        target.provider,
        answered,
        fresh.records,
        seconds,
        fresh.source,
        missing=missing,
        partial=partial,
    )
    return fresh, report


def _failed(target: Target, started: float, error: CostguardError) -> ProviderReport:
    seconds = time.perf_counter() - started
    return ProviderReport(target.provider, target.regions, seconds=seconds, error=error)
