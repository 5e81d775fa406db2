"""The GPU name registry: what people type -> the canonical names the tables use.

Canonical names follow the tables (``A10G``, ``A100-80GB``, ``H100-MEGA``). Lookup is
forgiving about case, spaces, underscores and an ``nvidia`` prefix; unknown names get
a did-you-mean hint.

>>> canonical_gpu("a10g"), canonical_gpu("NVIDIA A100 80GB"), canonical_gpu("h100")
('A10G', 'A100-80GB', 'H100')
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from costguard.errors import UnknownNameError


class GpuModel(NamedTuple):
    """One accelerator model: its canonical name, what it is, and how people spell it."""

    name: str
    vendor: str
    memory_gb: int | None
    aliases: tuple[str, ...] = ()
    #: Close relatives offered elsewhere under another name (A10 on Azure, A10G on AWS).
    similar: tuple[str, ...] = ()


MODELS: tuple[GpuModel, ...] = (
    GpuModel("T4", "NVIDIA", 16, ("t4", "tesla-t4")),
    GpuModel("T4g", "NVIDIA", 16, ("t4g",), similar=("T4",)),
    GpuModel("L4", "NVIDIA", 24, ("l4",)),
    GpuModel("L40S", "NVIDIA", 48, ("l40s", "l40-s")),
    GpuModel("A10G", "NVIDIA", 24, ("a10g",), similar=("A10",)),
    GpuModel("A10", "NVIDIA", 24, ("a10",), similar=("A10G",)),
    GpuModel(
        "A100", "NVIDIA", 40, ("a100", "a100-40gb", "a100-40g", "a100-40"), similar=("A100-80GB",)
    ),
    GpuModel("A100-80GB", "NVIDIA", 80, ("a100-80gb", "a100-80g", "a100-80"), similar=("A100",)),
    GpuModel("H100", "NVIDIA", 80, ("h100", "h100-80gb", "h100-sxm"), similar=("H100-MEGA",)),
    GpuModel("H100-MEGA", "NVIDIA", 80, ("h100-mega", "h100mega"), similar=("H100",)),
    GpuModel("H200", "NVIDIA", 141, ("h200",)),
    GpuModel("B200", "NVIDIA", 180, ("b200",)),
    GpuModel("B300", "NVIDIA", 288, ("b300",)),
    GpuModel("V100", "NVIDIA", 16, ("v100", "v100-16gb"), similar=("V100-32GB",)),
    GpuModel("V100-32GB", "NVIDIA", 32, ("v100-32gb", "v100-32g"), similar=("V100",)),
    GpuModel("P100", "NVIDIA", 16, ("p100",)),
    GpuModel("P4", "NVIDIA", 8, ("p4",)),
    GpuModel("M60", "NVIDIA", 8, ("m60",)),
    # Retired everywhere the tables priced it (costguard.pricing.retired): known, so that
    # `--gpu k80` says so rather than "unknown GPU".
    GpuModel("K80", "NVIDIA", 12, ("k80", "tesla-k80")),
    GpuModel("Radeon Pro V520", "AMD", 8, ("v520", "radeon-pro-v520")),
    GpuModel("Radeon MI25", "AMD", 16, ("mi25", "radeon-mi25")),
    GpuModel("MI300X", "AMD", 192, ("mi300x", "instinct-mi300x", "amd-mi300x")),
    GpuModel("GB200", "NVIDIA", 186, ("gb200", "grace-blackwell")),
    GpuModel(
        "RTXPRO6000",
        "NVIDIA",
        96,
        ("rtx-pro-6000", "rtxpro6000", "rtx-pro-6000-blackwell", "rtx-6000-pro"),
    ),
    GpuModel("RTXPRO4500", "NVIDIA", 32, ("rtx-pro-4500", "rtxpro4500", "rtx-pro-4500-blackwell")),
    # Fractions of one GPU (AWS g6f/gr6f, Azure NVadsA10 v5, GCP g4-standard-6/12/24): their
    # own names, so that `--gpu l4` never prices a slice as a whole GPU.
    GpuModel("L4-1/8", "NVIDIA", 3, ("l4-1/8", "l4-eighth"), similar=("L4",)),
    GpuModel("L4-1/4", "NVIDIA", 6, ("l4-1/4", "l4-quarter"), similar=("L4",)),
    GpuModel("L4-1/2", "NVIDIA", 12, ("l4-1/2", "l4-half"), similar=("L4",)),
    GpuModel("A10-1/6", "NVIDIA", 4, ("a10-1/6",), similar=("A10",)),
    GpuModel("A10-1/3", "NVIDIA", 8, ("a10-1/3",), similar=("A10",)),
    GpuModel("A10-1/2", "NVIDIA", 12, ("a10-1/2", "a10-half"), similar=("A10",)),
    GpuModel("RTXPRO6000-1/8", "NVIDIA", 12, ("rtx-pro-6000-1/8",), similar=("RTXPRO6000",)),
    GpuModel("RTXPRO6000-1/4", "NVIDIA", 24, ("rtx-pro-6000-1/4",), similar=("RTXPRO6000",)),
    GpuModel("RTXPRO6000-1/2", "NVIDIA", 48, ("rtx-pro-6000-1/2",), similar=("RTXPRO6000",)),
    # Accelerators that are not GPUs: `--gpu` prices them too, by these names.
    GpuModel("INFERENTIA2", "AWS", 32, ("inferentia2", "inf2")),
    GpuModel("TRAINIUM", "AWS", 32, ("trainium", "trainium1", "trn1")),
)

_BY_NAME = {m.name: m for m in MODELS}


def _normalise(name: str) -> str:
    key = re.sub(r"[\s_]+", "-", name.strip().lower())
    key = re.sub(r"^nvidia-?", "", key)
    return re.sub(r"-+", "-", key).strip("-")


def _alias_table(extra_names: Iterable[str]) -> dict[str, str]:
    table: dict[str, str] = {}
    for model in MODELS:
        table[_normalise(model.name)] = model.name
        for alias in model.aliases:
            table[_normalise(alias)] = model.name
    # Accelerators that appear in the tables but not in MODELS (TPUs, new GPUs)
    # are still found by their own name.
    for name in extra_names:
        table.setdefault(_normalise(name), name)
    return table


def canonical_gpu(name: str, known: Iterable[str] = ()) -> str:
    """Map a GPU name as typed to its canonical table name.

    ``known`` adds accelerator names from the loaded tables (so a refreshed table with a
    new GPU needs no code change). Raises :class:`UnknownNameError` with a did-you-mean.

    >>> canonical_gpu("A100_80GB")
    'A100-80GB'
    >>> canonical_gpu("tpu-v3-8", known=["tpu-v3-8"])
    'tpu-v3-8'
    """
    known = list(known)
    table = _alias_table(known)
    found = table.get(_normalise(name))
    if found is None:
        candidates = [m.name for m in MODELS] + known
        raise UnknownNameError(kind="GPU", name=name, known=candidates)
    return found


def gpu_model(name: str) -> GpuModel | None:
    """The registry entry for a canonical name, or ``None`` for names only the tables know."""
    return _BY_NAME.get(name)


def other_gpus_near(gpu: str, providers: Mapping[str, frozenset[str]]) -> list[str]:
    """GPUs whose name is ``gpu``'s with one more letter (A10 -> A10G, T4 -> T4g), offered
    by a provider that does not offer ``gpu``: what someone typing ``gpu`` may have meant,
    and would not see priced. ``providers`` maps each GPU in the tables to its providers.

    >>> offered = {"A10": frozenset({"azure"}), "A10G": frozenset({"aws"}),
    ...            "T4": frozenset({"aws", "gcp"}), "T4g": frozenset({"aws"})}
    >>> other_gpus_near("A10", offered), other_gpus_near("T4", offered)
    (['A10G'], [])
    """
    own = providers.get(gpu, frozenset())
    return sorted(
        name
        for name, where in providers.items()
        if len(name) == len(gpu) + 1
        and name.lower().startswith(gpu.lower())
        and name[-1].isalpha()
        and where - own
    )
