"""Refresh the price tables: check the request, read each provider, merge, write.

:func:`plan_refresh` validates names and folders before anything reaches the network
(bad input is an :class:`~costguard.errors.InputError`). :func:`refresh_tables` reads
the providers side by side; one that fails is reported and leaves its rows as they
were, while the others are merged and written (atomically) all the same.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from costguard.errors import CostguardError, InputError
from costguard.pricing.catalog import PROVIDERS, Catalog, check_provider, load_tables
from costguard.pricing.refresh import cache, mirror
from costguard.pricing.refresh.merge import (
    FreshPrices,
    MergeStats,
    TableMeta,
    Target,
    merge_tables,
)
from costguard.pricing.refresh.retry import RetryPolicy
from costguard.settings import Settings

#: Called with (provider, records read so far) as a refresh goes.
Progress = Callable[[str, int], object]


@dataclass(frozen=True)
class RefreshPlan:
    """A checked request: what to read for each provider, from where, and where to write."""

    targets: tuple[Target, ...]
    output: Path
    mirror: Path | None = None


@dataclass(frozen=True)
class ProviderReport:
    """How one provider's refresh went."""

    provider: str
    regions: tuple[str, ...]
    records: int = 0
    seconds: float = 0.0
    source: str = ""
    stats: MergeStats | None = None
    error: CostguardError | None = None

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
    bundled ones when they are fresher (or ``output`` has none).

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
    chosen providers in the tables.

    >>> from costguard.pricing.catalog import load_catalog
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
    if mirror_dir is not None:
        if not mirror_dir.is_dir():
            msg = f"{mirror_dir} is not a folder"
            raise InputError(msg, hint="--from names a folder of downloaded API responses")
        if not chosen:
            chosen = [p for p in PROVIDERS if (mirror_dir / p).is_dir()]
            if not chosen:
                msg = f"{mirror_dir} has no aws/, gcp/ or azure/ folder of API responses"
                raise InputError(msg, hint="see `costguard pricing refresh --help` for the layout")
        for provider in chosen:
            mirror.check(mirror_dir, provider)
    cache.check_target(output)
    targets = []
    for provider in chosen or PROVIDERS:
        wanted = [p.name for p in places if p.provider == provider] or [
            r.name for r in catalog.regions if r.provider == provider
        ]
        rows = tuple(
            row for row in catalog.instances if row.provider == provider and row.region in wanted
        )
        targets.append(Target(provider, tuple(dict.fromkeys(wanted)), rows))
    return RefreshPlan(targets=tuple(targets), output=output, mirror=mirror_dir)


def refresh_tables(
    plan: RefreshPlan,
    catalog: Catalog,
    settings: Settings,
    *,
    now: datetime | None = None,
    retry: RetryPolicy | None = None,
    progress: Progress | None = None,
) -> RefreshReport:
    """Read every provider of ``plan`` (side by side), merge what was read into
    ``catalog``'s tables and write them to ``plan.output``.

    A provider that fails (a :class:`~costguard.errors.CostguardError`) is reported in
    the result and its rows stay as they were; nothing is written when all fail.
    """
    now = now or datetime.now(UTC)
    with ThreadPoolExecutor(max_workers=len(plan.targets) or 1) as pool:
        futures = [
            pool.submit(_fetch_one, target, plan, settings, now, retry, progress)
            for target in plan.targets
        ]
        results = [future.result() for future in futures]
    fresh = [prices for prices, _ in results if prices is not None]
    reports = [report for _, report in results]
    if not fresh:
        return RefreshReport(plan.output, now, tuple(reports))
    merged = merge_tables(catalog, fresh, now)
    cache.write_tables(plan.output, merged, catalog, now)
    reports = [
        replace(report, stats=merged.stats[report.provider]) if report.ok else report
        for report in reports
    ]
    return RefreshReport(plan.output, now, tuple(reports), merged.meta)


def _fetch_one(
    target: Target,
    plan: RefreshPlan,
    settings: Settings,
    now: datetime,
    retry: RetryPolicy | None,
    progress: Progress | None,
) -> tuple[FreshPrices | None, ProviderReport]:
    """One provider's prices, or the error that stopped them; never raises a
    :class:`~costguard.errors.CostguardError` (the other providers go on)."""
    # Adapters are looked up by name, so a run for one provider imports only its SDK.
    adapter = importlib.import_module(f"costguard.pricing.refresh.{target.provider}")
    started = time.perf_counter()

    def tell(records: int) -> None:
        if progress is not None:
            progress(target.provider, records)

    try:
        fresh: FreshPrices = adapter.fetch(
            target, settings, now=now, mirror=plan.mirror, retry=retry, progress=tell
        )
    except CostguardError as exc:
        seconds = time.perf_counter() - started
        return None, ProviderReport(target.provider, target.regions, seconds=seconds, error=exc)
    seconds = time.perf_counter() - started
    report = ProviderReport(target.provider, target.regions, fresh.records, seconds, fresh.source)
    return fresh, report
