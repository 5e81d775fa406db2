"""Google Cloud client factories (REST transport, optional endpoint override)."""

from __future__ import annotations

from typing import Any

from costguard.clouds import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, require
from costguard.errors import CostguardError, InputError
from costguard.settings import Settings

EXTRA = "gcp"


def default_credentials() -> Any:
    """Application Default Credentials, or a clear error saying how to get them."""
    auth = require("google.auth", EXTRA)
    exceptions = require("google.auth.exceptions", EXTRA)
    try:
        credentials, _project = auth.default()
    except exceptions.DefaultCredentialsError:
        msg = "no Google Cloud credentials found"
        raise CostguardError(
            msg,
            hint="run `gcloud auth application-default login`, or set "
            "GOOGLE_APPLICATION_CREDENTIALS",
        ) from None
    return credentials


def client(module: str, name: str, settings: Settings, credentials: Any = None) -> Any:
    """Build ``module.name`` (e.g. ``google.cloud.billing.budgets_v1``, ``BudgetServiceClient``).

    Uses the REST transport, and ``settings.gcp_endpoint`` when set.
    """
    cls = getattr(require(module, EXTRA), name)
    options = {"api_endpoint": settings.gcp_endpoint} if settings.gcp_endpoint else None
    return cls(
        credentials=credentials if credentials is not None else default_credentials(),
        client_options=options,
        transport="rest",
    )


class RestSession:
    """Plain REST calls for the few Google APIs whose Python client has no REST transport.

    Cloud Monitoring's notification channels are one: ``google-cloud-monitoring`` speaks
    gRPC only. Requests go to ``https://<service>.googleapis.com`` (or ``gcp_endpoint``).
    """

    def __init__(self, service: str, settings: Settings, credentials: Any = None) -> None:
        transport = require("google.auth.transport.requests", EXTRA)
        self._session = transport.AuthorizedSession(
            credentials if credentials is not None else default_credentials()
        )
        self.base_url = (settings.gcp_endpoint or f"https://{service}.googleapis.com").rstrip("/")

    def request(self, method: str, path: str, action: str, **kwargs: Any) -> Any:
        """One call; a JSON answer, or an actionable error."""
        kwargs.setdefault("timeout", (CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
        try:
            response = self._session.request(method, f"{self.base_url}/{path}", **kwargs)
        except OSError as exc:
            msg = f"cannot reach Google Cloud while {action}: {exc}"
            raise CostguardError(msg, hint="check the network and gcp_endpoint") from None
        if response.status_code in (401, 403):
            msg = f"Google Cloud refused {action} (HTTP {response.status_code})"
            raise CostguardError(msg, hint="the custom role costguard needs is in infra/gcp/")
        if response.status_code >= 400:
            msg = f"Google Cloud rejected {action} (HTTP {response.status_code}): {response.text}"
            raise CostguardError(msg)
        return response.json() if response.content else {}


def translate(exc: BaseException, action: str) -> CostguardError:
    """A google.api_core exception as an actionable :class:`CostguardError`."""
    core = require("google.api_core.exceptions", EXTRA)
    if isinstance(exc, core.PermissionDenied | core.Unauthenticated):
        return CostguardError(
            f"Google Cloud refused {action}: {exc.message}",
            hint="the custom role costguard needs is in infra/gcp/",
        )
    if isinstance(exc, core.InvalidArgument | core.NotFound):
        return InputError(
            f"Google Cloud rejected {action}: {exc.message}",
            hint="check the billing account and project you passed",
        )
    return CostguardError(f"Google Cloud call failed while {action}: {exc}")


def errors() -> tuple[type[BaseException], ...]:
    """The exception classes :func:`translate` understands."""
    core = require("google.api_core.exceptions", EXTRA)
    return (core.GoogleAPIError,)
