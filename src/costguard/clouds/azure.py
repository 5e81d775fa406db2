"""Azure management client factories (optional endpoint override) and error translation."""

from __future__ import annotations

import logging
from typing import Any

from costguard.clouds import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, require
from costguard.errors import CostguardError, InputError, MissingCredentialsError
from costguard.settings import Settings

EXTRA = "azure"


def default_credential() -> Any:
    """``DefaultAzureCredential``: env, managed identity, ``az login``..."""
    identity = require("azure.identity", EXTRA)
    quiet_identity()
    return identity.DefaultAzureCredential()


def quiet_identity() -> None:
    """Keep azure.identity's warning (a dozen lines: every credential source it tried)
    off stderr: a missing credential is reported once, as an error with a hint. A level
    the user set stays."""
    logger = logging.getLogger("azure.identity")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.ERROR)


def client(
    module: str,
    name: str,
    subscription_id: str,
    settings: Settings,
    credential: Any = None,
    **kwargs: Any,
) -> Any:
    """Build ``module.name`` (e.g. ``azure.mgmt.consumption``, ``ConsumptionManagementClient``).

    Uses ``settings.azure_endpoint`` as ``base_url`` when set; extra keyword arguments go to
    the client (azure-core pipeline options).
    """
    cls = getattr(require(module, EXTRA), name)
    if settings.azure_endpoint:
        kwargs.setdefault("base_url", settings.azure_endpoint)
    kwargs.setdefault("connection_timeout", CONNECT_TIMEOUT_S)
    kwargs.setdefault("read_timeout", READ_TIMEOUT_S)
    return cls(
        credential if credential is not None else default_credential(), subscription_id, **kwargs
    )


def translate(exc: BaseException, action: str) -> CostguardError:
    """An azure-core exception as an actionable :class:`CostguardError`."""
    core = require("azure.core.exceptions", EXTRA)
    if isinstance(exc, core.ClientAuthenticationError) and "failed to retrieve a token" in str(exc):
        return MissingCredentialsError(  # DefaultAzureCredential: none of its sources had one
            f"no Azure credentials while {action}",
            hint="run `az login`, or set AZURE_CLIENT_ID, AZURE_TENANT_ID and "
            "AZURE_CLIENT_SECRET (a service principal); the role costguard needs is in "
            "infra/azure/",
        )
    if isinstance(exc, core.ClientAuthenticationError):
        return CostguardError(
            f"Azure refused {action}: not signed in or not allowed",
            hint="run `az login`; the role costguard needs is in infra/azure/",
        )
    if isinstance(exc, core.HttpResponseError):
        status = getattr(exc, "status_code", None)
        text = f"Azure rejected {action} (HTTP {status}): {exc.message}"
        if status in (400, 404, 422):
            return InputError(text, hint="check the subscription, resource group and values")
        if status == 403:
            return CostguardError(text, hint="the role costguard needs is in infra/azure/")
        return CostguardError(text)
    return CostguardError(f"Azure call failed while {action}: {exc}")


def errors() -> tuple[type[BaseException], ...]:
    """The exception classes :func:`translate` understands."""
    core = require("azure.core.exceptions", EXTRA)
    return (core.AzureError,)
