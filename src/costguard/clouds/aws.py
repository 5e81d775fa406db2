"""boto3 clients with bounded retries and timeouts, and botocore errors made actionable.

Endpoints come from the standard ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_<SERVICE>``
variables, which boto3 reads itself; credentials from the usual chain (env, profile,
instance role). No secret is ever logged.

One boto3 session serves the whole process, and each (service, region, retry rule) gets
one client from it: botocore parses a service's model once per session (about half a
second for EC2), so a client per region from fresh sessions cost a 32-region ``burn``
half a minute. The session is made again when an ``AWS_*`` variable changes, and every
session the process makes (the checkpoint stores' too) reads the models through one data
loader (:func:`share_models`), so a new session does not read them again.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from costguard.clouds import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, require
from costguard.errors import CostguardError, InputError, MissingCredentialsError

if TYPE_CHECKING:
    from collections.abc import Iterator

EXTRA = "aws"

_LOCK = threading.Lock()
#: The shared session, the ``AWS_*`` environment it was made in, and its clients.
_SHARED: dict[str, Any] = {}
#: botocore's data loaders, per data path: they read the service models, endpoint rules
#: and partitions from botocore's JSON files and keep them (about 0.15 s of CPU for S3,
#: more for EC2). The files do not change while the process runs; a fork inherits them.
LOADERS: dict[str | None, Any] = {}


def share_models(botocore_session: Any) -> None:
    """Have ``botocore_session`` (botocore's or aiobotocore's) read the service models
    through the process's data loader for its data path (:data:`LOADERS`). Its own
    credentials, profile, region and endpoints are untouched. When its configuration
    cannot be read (no such profile), it is left as it is: its first client says why."""
    exceptions = require("botocore.exceptions", EXTRA)
    try:
        path = botocore_session.get_config_variable("data_path")
    except exceptions.BotoCoreError:
        return
    loader = LOADERS.get(path)
    if loader is None:
        loader = LOADERS.setdefault(path, require("botocore.loaders", EXTRA).create_loader(path))
    botocore_session.register_component("data_loader", loader)


def session() -> Any:
    """The process's boto3 session (one per ``AWS_*`` environment; see the module doc)."""
    boto3 = require("boto3", EXTRA)
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    with _LOCK:
        if _SHARED.get("environment") != environment:
            core = require("botocore.session", EXTRA).Session()
            share_models(core)
            made = boto3.session.Session(botocore_session=core)
            # boto3 adds its own data folder to the loader's search paths, once a session:
            # the shared loader keeps one.
            paths = core.get_component("data_loader").search_paths
            paths[:] = dict.fromkeys(paths)
            _SHARED.update(environment=environment, session=made, clients={})
        return _SHARED["session"]


def client(
    service: str, region: str | None = None, *, attempts: int = 5, mode: str = "adaptive"
) -> Any:
    """A boto3 client for ``service`` with bounded retries and timeouts.

    ``attempts`` counts every try, the first included (1 = no retry); ``mode`` is
    botocore's retry mode (``adaptive`` also slows down after throttling; ``standard``
    does not). The standard ``AWS_MAX_ATTEMPTS`` / ``AWS_RETRY_MODE`` variables override
    both, as they do for the AWS CLI. ``region`` defaults to the usual chain
    (``AWS_DEFAULT_REGION``, profile), then us-east-1.
    """
    shared = session()
    from_env = os.environ.get("AWS_MAX_ATTEMPTS", "").strip()
    retries = {
        "total_max_attempts": int(from_env) if from_env.isdigit() else attempts,
        "mode": os.environ.get("AWS_RETRY_MODE", mode),
    }
    region = region or shared.region_name or "us-east-1"
    key = (service, region, retries["total_max_attempts"], retries["mode"])
    with _LOCK:  # a boto3 session is not thread-safe; its clients are
        clients: dict[tuple[Any, ...], Any] = _SHARED["clients"]
        if key not in clients:
            config = require("botocore.config", EXTRA).Config(
                retries=retries,
                connect_timeout=CONNECT_TIMEOUT_S,
                read_timeout=READ_TIMEOUT_S,
                user_agent_extra="costguard",
            )
            clients[key] = shared.client(service, region_name=region, config=config)
        return clients[key]


def require_credentials(action: str) -> None:
    """Raise :class:`MissingCredentialsError` (exit 2) when the usual chain finds no AWS
    credentials: asked once, before a command makes its first call, so that it fails in
    a second rather than after a call per region."""
    exceptions = require("botocore.exceptions", EXTRA)
    shared = session()
    try:
        with _LOCK:
            found = shared.get_credentials()
    except exceptions.BotoCoreError as exc:  # a broken profile, an SSO token gone stale
        raise translate(exc, action) from None
    if found is None:
        raise translate(exceptions.NoCredentialsError(), action)


#: What a person with boto3 and no credentials can do, whichever way their site works.
CREDENTIALS_HINT = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (an access key), or AWS_PROFILE for a "
    "profile in ~/.aws/config; with IAM Identity Center (SSO) run `aws sso login --profile "
    "NAME` and set AWS_PROFILE=NAME. Give that identity only what costguard needs: "
    "infra/aws/*-policy.json in the costguard repository"
)


def translate(exc: BaseException, action: str) -> CostguardError:
    """A botocore/boto3 exception as a :class:`CostguardError` that says what to do.

    ``action`` says what was being done, e.g. ``"creating the budget"``.
    """
    exceptions = require("botocore.exceptions", EXTRA)
    if isinstance(
        exc,
        exceptions.NoCredentialsError
        | exceptions.PartialCredentialsError
        | exceptions.ProfileNotFound,
    ):
        return MissingCredentialsError(f"no AWS credentials while {action}", hint=CREDENTIALS_HINT)
    if isinstance(exc, exceptions.EndpointConnectionError | exceptions.ConnectTimeoutError):
        return CostguardError(
            f"cannot reach AWS while {action}: {exc}",
            hint="check the network, the region, and AWS_ENDPOINT_URL if you set it",
        )
    if isinstance(exc, exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = error_code(exc) or "Unknown"
        message = str(error.get("Message", "")).strip()
        text = f"AWS refused {action}: {code}" + (f" ({message})" if message else "")
        if code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation"):
            return CostguardError(text, hint="the policies costguard needs are in infra/aws/")
        if code in ("ValidationException", "InvalidParameterValue", "InvalidParameterException"):
            return InputError(text, hint="check the values you passed")
        return CostguardError(text)
    return CostguardError(f"AWS call failed while {action}: {exc}")


#: The longest error code kept (the service's text: EC2's longest is under 60 characters).
MAX_CODE_CHARS = 128


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore ``ClientError`` (``InsufficientInstanceCapacity``,
    ``InvalidInstanceID.NotFound``...), at most :data:`MAX_CODE_CHARS` characters; ``""``
    for any other exception, or a reply without a code.

    >>> from botocore.exceptions import ClientError
    >>> error_code(ClientError({"Error": {"Code": "Throttling"}}, "DescribeInstances"))
    'Throttling'
    >>> error_code(ClientError({}, "DescribeInstances")), error_code(ValueError("x"))
    ('', '')
    """
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    code = error.get("Code") if isinstance(error, dict) else None
    return "" if code is None else str(code)[:MAX_CODE_CHARS]


_UNSUPPORTED_CODES = ("500", "501", "NotImplemented", "InternalFailure")


def is_unsupported(exc: BaseException) -> bool:
    """Whether an endpoint answered that it does not implement the operation.

    S3-compatible stores, LocalStack and moto answer an unknown action with HTTP 500/501;
    callers then fall back to an equivalent sequence of calls that is supported.
    """
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status in (500, 501) and error_code(exc) in _UNSUPPORTED_CODES


def errors() -> tuple[type[BaseException], ...]:
    """The botocore exception classes :func:`translate` understands (for ``except``)."""
    exceptions = require("botocore.exceptions", EXTRA)
    return (exceptions.BotoCoreError, exceptions.ClientError)


def paginate(aws_client: Any, operation: str, key: str, **kwargs: Any) -> Iterator[Any]:
    """Every item under ``key`` across all pages of ``operation``."""
    for page in aws_client.get_paginator(operation).paginate(**kwargs):
        yield from page.get(key, [])
