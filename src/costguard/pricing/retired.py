"""GPU series their provider has retired: sizes that can no longer be launched.

The bundled price tables carry no row of them (``pricing/README.md``, "Retired series"),
and a table that still does (a refresh cache or a ``--pricing-dir`` written before the
retirement) loses those rows when it is loaded: costguard never prices what cannot be
bought. Asked for one by name (``--instance-type``) or by its GPU, the estimate says
which series the provider retired and when, and what the provider names in its place.

Only retirements the provider itself states, on a date now past, are listed; each names
the page it was read from.

>>> retired_size("azure", "standard_nc6s_v3").series
'NCv3'
>>> retired_size("aws", "p5.48xlarge") is None
True
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date
from typing import NamedTuple

_AZURE_COMPUTE_DOCS = "MicrosoftDocs/azure-compute-docs"


class RetiredSeries(NamedTuple):
    """One retired series: its sizes, its GPU, the day it was retired and what replaces it."""

    provider: str
    series: str
    sizes: tuple[str, ...]
    accelerator: str
    retired_on: date
    #: The series the provider names in its place, as it names them.
    successors: tuple[str, ...]
    #: A size of the tables in a successor series (what the hint offers).
    example: str
    #: Where the provider states the retirement (repository, file, commit).
    source: str

    def said(self) -> str:
        """``Azure retired NCv3 (V100) on 2025-09-30``."""
        return (
            f"{_PROVIDER_NAMES[self.provider]} retired {self.series} ({self.accelerator}) "
            f"on {self.retired_on.isoformat()}"
        )

    def instead(self) -> str:
        """What to ask for instead, for a hint."""
        names = ", ".join(self.successors[:-1]) + f" or {self.successors[-1]}"
        return (
            f"{_PROVIDER_NAMES[self.provider]} names {names} in its place: "
            f"e.g. --instance-type {self.example}"
        )


_PROVIDER_NAMES = {"aws": "AWS", "gcp": "GCP", "azure": "Azure"}

RETIRED: tuple[RetiredSeries, ...] = (
    RetiredSeries(
        "azure",
        "NC",
        ("Standard_NC6", "Standard_NC12", "Standard_NC24", "Standard_NC24r"),
        "K80",
        date(2023, 9, 6),
        ("NCasT4_v3", "NC_A100_v4"),
        "Standard_NC4as_T4_v3",
        "MicrosoftDocs/azure-docs articles/virtual-machines/nc-series-retirement.md @ fc02a2ff",
    ),
    RetiredSeries(
        "azure",
        "NCv3",
        ("Standard_NC6s_v3", "Standard_NC12s_v3", "Standard_NC24s_v3", "Standard_NC24rs_v3"),
        "V100",
        date(2025, 9, 30),
        ("NCadsH100_v5", "NCasT4_v3", "NVadsA10_v5"),
        "Standard_NC40ads_H100_v5",
        f"{_AZURE_COMPUTE_DOCS} articles/virtual-machines/ncv3-retirement.md @ 11277ad7; "
        "sizes/retirement/retired-sizes-list.md @ 0bdc5d34 (Retired)",
    ),
    RetiredSeries(
        "azure",
        "NVv3",
        (
            "Standard_NV12s_v3",
            "Standard_NV12hs_v3",
            "Standard_NV24s_v3",
            "Standard_NV24ms_v3",
            "Standard_NV32ms_v3",
            "Standard_NV48s_v3",
        ),
        "M60",
        date(2026, 9, 30),
        ("NVadsA10_v5", "NC_RTXPRO6000BSE_v6", "NCasT4_v3", "NVadsV710_v5"),
        "Standard_NV36ads_A10_v5",
        f"{_AZURE_COMPUTE_DOCS} articles/virtual-machines/sizes/gpu-accelerated/"
        "nvv3-series-retirement.md @ 1aca8638; sizes/retirement/retired-sizes-list.md "
        "@ 0bdc5d34 (Announced for 2026-09-30)",
    ),
    RetiredSeries(
        "azure",
        "NVv4",
        (
            "Standard_NV4as_v4",
            "Standard_NV4ahs_v4",
            "Standard_NV8as_v4",
            "Standard_NV8ahs_v4",
            "Standard_NV16as_v4",
            "Standard_NV16ahs_v4",
            "Standard_NV32as_v4",
            "Standard_NV32ahs_v4",
        ),
        "Radeon MI25",
        date(2026, 9, 30),
        ("NVads_V710_v5", "NVadsA10_v5"),
        "Standard_NV6ads_A10_v5",
        f"{_AZURE_COMPUTE_DOCS} articles/virtual-machines/sizes/gpu-accelerated/"
        "nvv4-retirement.md @ 1a043fb3; sizes/retirement/retired-sizes-list.md "
        "@ 0bdc5d34 (Announced for 2026-09-30)",
    ),
)

_BY_SIZE = {(s.provider, size.lower()): s for s in RETIRED for size in s.sizes}


def retired_size(provider: str | None, instance_type: str) -> RetiredSeries | None:
    """The retired series ``instance_type`` belongs to (any provider when ``None``;
    the name in any case), or ``None`` when it can still be launched."""
    wanted = instance_type.lower()
    if provider is not None:
        return _BY_SIZE.get((provider, wanted))
    return next((s for (_, size), s in _BY_SIZE.items() if size == wanted), None)


def retired_carrying(gpu: str, providers: Iterable[str] = ()) -> list[RetiredSeries]:
    """The retired series with ``gpu`` (a canonical name), of ``providers`` (all: empty)."""
    wanted = set(providers)
    return [s for s in RETIRED if s.accelerator == gpu and (not wanted or s.provider in wanted)]
