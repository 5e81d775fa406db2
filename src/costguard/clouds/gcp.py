"""Google Cloud client factories (REST or gRPC transport, optional endpoint override),
and how Google's answers are read (timestamps, resource URLs) by every adapter."""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from datetime import UTC, datetime
from typing import Any

from costguard.clouds import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, require
from costguard.errors import CostguardError, InputError, MissingCredentialsError
from costguard.settings import Settings

EXTRA = "gcp"
#: Machine families whose GPUs come with the machine type (the others, N1, attach them).
GPU_FAMILIES = ("a2", "a3", "a4", "g2")
#: ``acceleratorTypes/<name>`` -> the canonical GPU names of the price tables.
ACCELERATORS = {
    "nvidia-tesla-t4": "T4",
    "nvidia-tesla-t4-vws": "T4",
    "nvidia-l4": "L4",
    "nvidia-l4-vws": "L4",
    "nvidia-tesla-p4": "P4",
    "nvidia-tesla-p4-vws": "P4",
    "nvidia-tesla-p100": "P100",
    "nvidia-tesla-p100-vws": "P100",
    "nvidia-tesla-v100": "V100",
    "nvidia-tesla-a100": "A100",
    "nvidia-a100-80gb": "A100-80GB",
    "nvidia-h100-80gb": "H100",
    "nvidia-h100-mega-80gb": "H100-MEGA",
    "nvidia-h200-141gb": "H200",
    "nvidia-b200": "B200",
}


def default_credentials() -> Any:
    """Application Default Credentials, or a clear error saying how to get them."""
    auth = require("google.auth", EXTRA)
    exceptions = require("google.auth.exceptions", EXTRA)
    try:
        credentials, _project = auth.default()
    except exceptions.DefaultCredentialsError:
        msg = "no Google Cloud credentials found"
        raise MissingCredentialsError(
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


def grpc_target(endpoint: str) -> tuple[str, bool]:
    """Where a gRPC client connects for an endpoint setting, and whether over TLS.

    ``https://host[:port]`` and a bare ``host[:port]`` are TLS (port 443 unless given);
    ``http://host:port`` is plaintext, and is accepted on loopback only (a test server, a
    local proxy): an access token never leaves the machine unencrypted.

    >>> grpc_target("https://cloudbilling.googleapis.com")
    ('cloudbilling.googleapis.com:443', True)
    >>> grpc_target("private.example:8443"), grpc_target("http://127.0.0.1:8080")
    (('private.example:8443', True), ('127.0.0.1:8080', False))
    >>> grpc_target("http://10.0.0.7:8080")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: a plaintext (http://) Google Cloud endpoint must be on loopback...
    """
    text = endpoint.strip()
    parts = urllib.parse.urlsplit(text if "://" in text else f"https://{text}")
    hint = "use https://HOST[:PORT] (TLS), or http://127.0.0.1:PORT for a local server"
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        msg = f"not a Google Cloud endpoint: {endpoint!r}"
        raise InputError(msg, hint=hint)
    if parts.path.strip("/") or parts.query:
        msg = f"a gRPC endpoint is a host and port, without a path: {endpoint!r}"
        raise InputError(msg, hint=hint)
    host = parts.hostname
    secure = parts.scheme == "https"
    if not secure and not _loopback(host):
        msg = f"a plaintext (http://) Google Cloud endpoint must be on loopback, not {endpoint!r}"
        raise InputError(msg, hint=hint)
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{port or (443 if secure else 80)}", secure


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def grpc_client(module: str, name: str, settings: Settings, credentials: Any = None) -> Any:
    """Build ``module.name`` on its gRPC transport, at ``settings.gcp_endpoint`` when set.

    For large listings: gRPC answers are parsed into protobuf in C, the REST transport
    parses JSON into protobuf in Python (several times slower). The credentials are
    checked first (refreshed when they hold no valid token), so a revoked login is
    reported as such (:class:`google.auth.exceptions.GoogleAuthError`), not as a
    retried ``UNAVAILABLE``. A TLS endpoint (see :func:`grpc_target`) gets the channel
    the client builds itself; a loopback ``http://`` one gets gRPC local credentials,
    which carry the token as the TLS channel would but connect to loopback only. Close
    the client's ``transport`` when done.
    """
    cls = getattr(require(module, EXTRA), name)
    transport_cls = cls.get_transport_class("grpc")
    # Scoped as the transport would scope them (a service account needs its scopes to
    # get a token at all), then refreshed here, before any call.
    credentials = require("google.auth.credentials", EXTRA).with_scopes_if_required(
        credentials if credentials is not None else default_credentials(),
        transport_cls.AUTH_SCOPES,
    )
    requests_transport = require("google.auth.transport.requests", EXTRA)
    if not credentials.valid:
        credentials.refresh(requests_transport.Request())
    if not settings.gcp_endpoint:
        return cls(credentials=credentials, transport="grpc")
    target, secure = grpc_target(settings.gcp_endpoint)
    if secure:
        return cls(
            credentials=credentials, client_options={"api_endpoint": target}, transport="grpc"
        )
    grpc = require("grpc", EXTRA)
    google_grpc = require("google.auth.transport.grpc", EXTRA)
    plugin = google_grpc.AuthMetadataPlugin(credentials, requests_transport.Request())
    channel_credentials = grpc.composite_channel_credentials(
        grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP),
        grpc.metadata_call_credentials(plugin),
    )
    # As the transport's own channels: no cap on message sizes (a page of SKUs is MBs).
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    channel = grpc.secure_channel(target, channel_credentials, options=options)
    return cls(transport=transport_cls(channel=channel))


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


def timestamp(text: str) -> datetime:
    """An RFC 3339 timestamp as Google writes it (any offset, up to nanoseconds, which
    Python reads only to microseconds), in UTC; one without an offset is taken as UTC.

    >>> timestamp("2026-12-01T04:00:00.123456789-08:00").isoformat()
    '2026-12-01T12:00:00.123456+00:00'
    >>> timestamp("2026-12-01T04:00:00Z") == timestamp("2026-12-01T04:00:00")
    True
    """
    parsed = datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", text.strip()))
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC)


def last_segment(url: str) -> str:
    """The name at the end of a resource URL or path (a zone, a machine type).

    >>> last_segment("https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a/")
    'us-central1-a'
    """
    return url.rstrip("/").rsplit("/", 1)[-1]


def translate(exc: BaseException, action: str) -> CostguardError:
    """A google.api_core exception as an actionable :class:`CostguardError`."""
    core = require("google.api_core.exceptions", EXTRA)
    if isinstance(exc, core.Forbidden | core.PermissionDenied | core.Unauthenticated):
        return CostguardError(
            f"Google Cloud refused {action}: {exc.message}",
            hint="the custom role costguard needs is in infra/gcp/",
        )
    if isinstance(exc, core.BadRequest | core.InvalidArgument | core.NotFound):
        return InputError(
            f"Google Cloud rejected {action}: {exc.message}",
            hint="check the billing account and project you passed",
        )
    return CostguardError(f"Google Cloud call failed while {action}: {exc}")


def errors() -> tuple[type[BaseException], ...]:
    """The exception classes :func:`translate` understands."""
    core = require("google.api_core.exceptions", EXTRA)
    return (core.GoogleAPIError,)
