"""Provider adapters for the spot launcher, looked up lazily by name.

``local`` is built by the CLI with the job's simulation settings (see
:mod:`costguard.spot.launcher.local`); the clouds through :func:`cloud_launcher`, which
imports the adapter module (and so its SDK) only when it is asked for.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from costguard.errors import InputError
from costguard.providers import adapter_class, providers
from costguard.spot.launcher.base import Launcher

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
    """The adapter of ``provider`` (``aws``, ``gcp``, ``azure``), its SDK imported now.

    The class is the ``launcher`` entry of :data:`costguard.providers.ADAPTERS`, built with
    the keywords it accepts among ``settings`` (the frozen
    :class:`~costguard.settings.Settings`), ``options`` (the ``--option KEY=VALUE``
    mapping), ``regions`` (where the offers are), and any ``--option`` named in
    :data:`OPTION_PARAMETERS`.
    """
    if provider not in providers("launcher"):
        msg = f"unknown provider {provider!r}"
        raise InputError(msg, hint="use aws, gcp, azure or local")
    factory = adapter_class(
        "launcher", provider, absent_hint="use --provider local to try the job first"
    )
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
