"""Provider adapters for the spot launcher, looked up lazily by name.

``local`` is built by the CLI with the job's simulation settings (see
:mod:`costguard.spot.launcher.local`); the clouds through :func:`cloud_launcher`, which
imports the adapter module (and so its SDK) only when it is asked for.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from costguard.errors import InputError
from costguard.spot.launcher.base import Launcher

#: provider -> (module, class). The class is built with the keywords it accepts among
#: ``settings`` (the frozen :class:`~costguard.settings.Settings`), ``options`` (the
#: ``--option KEY=VALUE`` mapping), ``regions`` (where the offers are), and any
#: ``--option`` named in :data:`OPTION_PARAMETERS`.
CLOUD_ADAPTERS = {
    "aws": ("costguard.spot.launcher.aws", "AwsLauncher"),
    "gcp": ("costguard.spot.launcher.gcp", "GcpLauncher"),
    "azure": ("costguard.spot.launcher.azure", "AzureLauncher"),
}


#: The only constructor parameters an ``--option`` may set, and the keys that name them.
#: Everything else a constructor takes (clients, credentials, environments) is for tests
#: and embedding code, never for the command line.
OPTION_PARAMETERS = {
    "project": ("project",),
    "resource_group": ("resource_group",),
    "subscription_id": ("subscription_id", "subscription"),
}


def cloud_launcher(
    provider: str, settings: Any, options: Mapping[str, str], regions: Sequence[str] = ()
) -> Launcher:
    """The adapter of ``provider`` (``aws``, ``gcp``, ``azure``), its SDK imported now."""
    if provider not in CLOUD_ADAPTERS:
        msg = f"unknown provider {provider!r}"
        raise InputError(msg, hint="use aws, gcp, azure or local")
    module_name, factory_name = CLOUD_ADAPTERS[provider]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        msg = f"the {provider} launcher is not part of this costguard build"
        raise InputError(msg, hint="use --provider local to try the job first") from None
    factory = getattr(module, factory_name)
    offered: dict[str, Any] = {
        "settings": settings,
        "options": dict(options),
        "regions": list(regions),
    }
    accepted = inspect.signature(factory).parameters
    for name, keys in OPTION_PARAMETERS.items():
        found = [options[key] for key in keys if key in options]
        if name in accepted and found:
            offered[name] = found[0]
    launcher: Launcher = factory(**{k: v for k, v in offered.items() if k in accepted})
    return launcher
