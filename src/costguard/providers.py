"""Every provider adapter, by feature and name, in one table; each imported on first use.

In the style of fsspec's registry (``fsspec/registry.py``: ``"s3"`` -> the class path and
the error to show when its package is missing): an entry names the adapter's module, its
class and the costguard extra whose SDK it needs. Nothing is imported until a command asks
for a provider, so ``import costguard`` and ``costguard estimate`` load no SDK; an SDK
that is missing is reported with the extra that installs it.

Adding a cloud is one entry per feature here, plus adapter modules that pass the contract
suites in ``tests/contract/`` (see ARCHITECTURE.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from costguard.errors import InputError, MissingDependencyError


@dataclass(frozen=True)
class Adapter:
    """Where one provider's adapter for one feature lives.

    ``extra`` is the costguard extra that installs its SDK (``None``: it needs none).
    """

    module: str
    name: str
    extra: str | None


#: feature -> provider -> adapter. The launcher classes are built with the keywords they
#: accept (:func:`costguard.spot.launcher.cloud_launcher`); a fleet class lists its fleets
#: with ``for_options``; an alarm backend class is built with ``for_scope``; a price
#: source is the ``fetch`` function of ``costguard pricing refresh`` (its SDK, when it needs
#: one, is imported inside: a mirror needs none).
ADAPTERS: dict[str, dict[str, Adapter]] = {
    "launcher": {
        "aws": Adapter("costguard.spot.launcher.aws", "AwsLauncher", "aws"),
        "gcp": Adapter("costguard.spot.launcher.gcp", "GcpLauncher", "gcp"),
        "azure": Adapter("costguard.spot.launcher.azure", "AzureLauncher", "azure"),
    },
    "fleet": {
        "aws": Adapter("costguard.reaper.aws", "AwsFleet", "aws"),
        "gcp": Adapter("costguard.reaper.gcp", "GcpFleet", "gcp"),
        "azure": Adapter("costguard.reaper.azure", "AzureFleet", "azure"),
    },
    "alarm": {
        "aws": Adapter("costguard.alarms.aws", "AwsAlarms", "aws"),
        "gcp": Adapter("costguard.alarms.gcp", "GcpAlarms", "gcp"),
        "azure": Adapter("costguard.alarms.azure", "AzureAlarms", "azure"),
    },
    "price source": {
        "aws": Adapter("costguard.pricing.refresh.aws", "fetch", "aws"),
        "gcp": Adapter("costguard.pricing.refresh.gcp", "fetch", "gcp"),
        "azure": Adapter("costguard.pricing.refresh.azure", "fetch", None),
    },
}


def providers(feature: str) -> list[str]:
    """The providers a feature has adapters for, in the table's order.

    >>> providers("fleet")
    ['aws', 'gcp', 'azure']
    """
    return list(ADAPTERS[feature])


def adapter_class(feature: str, provider: str, *, absent_hint: str | None = None) -> Any:
    """The class (a price source: the function) of ``provider``'s adapter for ``feature``,
    its module imported now.

    An unknown provider is an :class:`~costguard.errors.InputError` naming the known ones;
    an adapter module missing from this build is one too (``absent_hint`` says what to do
    instead); a missing SDK is a :class:`~costguard.errors.MissingDependencyError` naming
    the extra.

    >>> adapter_class("fleet", "ibm")
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: unknown provider 'ibm'
    """
    table = ADAPTERS[feature]
    if provider not in table:
        msg = f"unknown provider {provider!r}"
        raise InputError(msg, hint=f"use {', '.join(table)}")
    adapter = table[provider]
    try:
        module = importlib.import_module(adapter.module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == adapter.module or adapter.module.startswith(f"{missing}."):
            msg = f"the {provider} {feature} is not part of this costguard build"
            raise InputError(msg, hint=absent_hint or f"use {', '.join(table)}") from None
        if adapter.extra is None or missing.split(".")[0] == "costguard":
            raise
        raise MissingDependencyError(missing, adapter.extra) from None
    return getattr(module, adapter.name)
