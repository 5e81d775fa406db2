"""What differs between the stores behind a checkpoint URL: which fsspec implementation
serves a scheme, the options and retry settings that make it safe for checkpoints, which
of its errors are worth a retry, and how its listings say when an object was written.

:class:`~costguard.checkpoint.store.Store` is written once against fsspec; everything it
must know about one backend is here, so adding a store is one entry per table below.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import re
from collections.abc import Mapping
from typing import Any

from costguard.clouds import aws as aws_clouds
from costguard.clouds import gcp as gcp_clouds
from costguard.clouds import require
from costguard.errors import InputError, MissingCredentialsError
from costguard.secrets import redact_url

EXTRA = "stores"  # the fsspec backends; torch is not needed to reach a store

#: Which fsspec implementation serves each URL scheme, and the package that provides it.
PROTOCOLS = {
    "file": None,
    "local": None,
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
}
#: What to check when a store cannot be reached, per backend.
REACH_HINTS = {
    "s3": "check the bucket name, the AWS credentials (AWS_PROFILE, access keys or the "
    "instance role) and AWS_ENDPOINT_URL if you use one",
    "gcs": "check the bucket name, the Google credentials (gcloud auth application-default "
    "login, or the VM's service account) and STORAGE_EMULATOR_HOST if you use one",
    "azure": "check the container name and the Azure credentials "
    "(AZURE_STORAGE_CONNECTION_STRING, or account_name and a managed identity)",
    "local": "check that the folder exists and that you may write to it",
}
#: How a large object is written in parts, per backend: (at most this many parts, this
#: many bytes an object). S3: 10,000 parts, 5 TiB (the multipart upload limits); Azure
#: block blobs: 50,000 blocks, 190.7 TiB; GCS: a resumable upload has no part count, an
#: object is at most 5 TiB.
PART_LIMITS: Mapping[str, tuple[int | None, int]] = {
    "s3": (10_000, 5 * 2**40),
    "azure": (50_000, 50_000 * 4000 * 2**20),
    "gcs": (None, 5 * 2**40),
}
#: Per backend: whose credentials it needs, and how a person provides them.
CREDENTIALS = {
    "s3": ("AWS", aws_clouds.CREDENTIALS_HINT),
    "gcs": (
        "Google Cloud",
        "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS "
        "to a service account's key file; on a VM, give it a service account",
    ),
    "azure": (
        "Azure Storage",
        "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with `az login` "
        "or the VM's managed identity",
    ),
}
#: The SDKs' ways of saying that no credentials were found (by class name: no SDK import).
_NO_CREDENTIALS = frozenset(
    {
        "NoCredentialsError",  # botocore
        "PartialCredentialsError",
        "ProfileNotFound",  # botocore: AWS_PROFILE or the profile option names none
        "DefaultCredentialsError",  # google.auth
        "CredentialUnavailableError",  # azure.identity
    }
)
#: Errors that no retry can fix: the object or bucket is not there, or we may not touch it.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def backend_name(url: str) -> str:
    """``s3``, ``gcs``, ``azure`` or ``local``: which kind of store ``url`` names.

    >>> backend_name("gs://b/p"), backend_name("abfs://c/p"), backend_name("/tmp/x")
    ('gcs', 'azure', 'local')
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
    return {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}.get(
        scheme, "azure" if scheme in ("az", "abfs", "abfss") else "local"
    )


#: A scheme and a broken separator: ``s3:/b``, ``s3:b``, ``s3//b``, ``gs:/``.
_SCHEME_LIKE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)(:/*|//+)(.*)", re.DOTALL)
_WEB = ("http", "https")
#: Web addresses of the stores' objects, and the store URL each one means.
_WEB_ADDRESSES = (
    (re.compile(r"([a-z0-9.-]+)\.s3(?:[.-][a-z0-9-]+)?\.amazonaws\.com(/.*)?", re.I), "s3"),
    (re.compile(r"s3(?:[.-][a-z0-9-]+)?\.amazonaws\.com/([^/]+)(/.*)?", re.I), "s3"),
    (re.compile(r"storage\.(?:googleapis|cloud\.google)\.com/([^/]+)(/.*)?", re.I), "gs"),
    (re.compile(r"[a-z0-9]+\.(?:blob|dfs)\.core\.windows\.net/([^/]+)(/.*)?", re.I), "az"),
)


def check_url(text: str) -> None:
    """Refuse what looks like a store URL and is not one, naming the URL it probably meant.

    A mistyped URL (``s3:/b/run1``, ``S3://b``, ``s3//b``, an ``https://`` address of a
    bucket, an unknown scheme) would otherwise be a local folder of that name, and the
    checkpoints of a spot instance would die with its disk. A plain folder passes, and so
    does a URL of a known scheme (its bucket and credentials are checked when it opens).

    >>> check_url("s3://b/run1"), check_url("runs/s3-copy"), check_url("./s3:b")
    (None, None, None)
    >>> check_url("s3:/b/run1")
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: 's3:/b/run1' looks like a store URL but is not one
    """
    scheme, sep, rest = text.partition("://")
    if sep and scheme in PROTOCOLS and not (PROTOCOLS[scheme] and rest.startswith("/")):
        check_key_parts(text)
        return
    if not sep:
        typo = _SCHEME_LIKE.fullmatch(text)
        if typo is None or typo[1].lower() not in (*PROTOCOLS, *_WEB):
            return  # a folder, maybe with a colon in its name
        scheme, rest = typo[1], typo[3]
    meant = _probable(scheme, rest)
    shown = redact_url(text)[:200]
    msg = f"{shown!r} looks like a store URL but is not one"
    local = f"for a local folder of that name: ./{shown}" if not sep else None
    if meant is not None:
        # (no "?" after the URL: it would read as a query string, and be masked)
        hint = f"it probably means {redact_url(meant)[:200]}" + (f"; {local}" if local else "")
    elif PROTOCOLS.get(scheme.lower()):
        hint = f"it names no bucket: e.g. {scheme.lower()}://my-bucket/run1"
    else:
        hint = "a store is a folder, s3://bucket/prefix, gs://bucket/prefix or " + (
            "az://container/prefix; an S3-compatible server's address goes in AWS_ENDPOINT_URL"
        )
    raise InputError(msg, hint=hint)


def check_key_parts(text: str) -> None:
    """Refuse an object-store URL with a ``.`` or ``..`` part after its bucket: a store
    keeps it as part of the object's name (``s3://b/../x`` is the key ``../x``, which an
    HTTP client may also resolve to another path), never "the folder above".

    >>> check_key_parts("s3://b/runs/run1"), check_key_parts("runs/../run1")
    (None, None)
    >>> check_key_parts("s3://b/../run1")
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: 's3://b/../run1' has a '..' part, which a store keeps as a name
    """
    scheme, sep, rest = text.partition("://")
    if not sep or not PROTOCOLS.get(scheme):
        return  # a local folder: resolved as a path
    for part in rest.split("?", 1)[0].split("/")[1:]:
        if part in (".", ".."):
            msg = f"{redact_url(text)[:200]!r} has a {part!r} part, which a store keeps as a name"
            raise InputError(msg, hint="write the prefix without . and .. parts")


def _probable(scheme: str, rest: str) -> str | None:
    """The store URL ``scheme`` and ``rest`` probably meant, if one can be told."""
    import difflib  # on error paths only

    lower = scheme.lower()
    if lower in _WEB:
        address = rest.lstrip("/").split("?", 1)[0]
        for pattern, store in _WEB_ADDRESSES:
            if found := pattern.fullmatch(address):
                return f"{store}://{found[1]}{found[2] or ''}"
        return None
    if lower not in PROTOCOLS:
        close = difflib.get_close_matches(lower, list(PROTOCOLS), n=1, cutoff=0.5)
        if not close:
            return None
        lower = close[0]
    if PROTOCOLS[lower] is None:
        return f"{lower}:///{rest.lstrip('/')}"
    return f"{lower}://{rest.lstrip('/')}" if rest.strip("/") else None


def no_credentials(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says that no credentials were found: never
    worth a retry.

    >>> class NoCredentialsError(Exception): ...
    >>> no_credentials(RuntimeError("upload failed")), no_credentials(NoCredentialsError())
    (False, True)
    """
    seen: BaseException | None = exc
    for _ in range(8):  # a bounded walk down the chain of causes
        if seen is None:
            return False
        names = {cls.__name__ for cls in type(seen).__mro__}
        if names & _NO_CREDENTIALS or (
            # DefaultAzureCredential: none of its sources had a credential
            "ClientAuthenticationError" in names and "failed to retrieve a token" in str(seen)
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` may go away on retry (5xx, throttling, timeouts, dropped connections).

    >>> is_transient(TimeoutError()), is_transient(FileNotFoundError()), is_transient(KeyError())
    (True, False, False)
    >>> try:
    ...     raise RuntimeError("Failed to upload block") from ConnectionResetError()
    ... except RuntimeError as wrapped:
    ...     is_transient(wrapped)
    True
    """
    if isinstance(exc, _PERMANENT) or no_credentials(exc):
        return False
    if isinstance(exc, OSError | TimeoutError | ConnectionError):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "ParamValidationError" in names:
        return False  # botocore refused the request itself (a bad bucket name): no retry helps
    if isinstance(exc, RuntimeError) and exc.__cause__ is not None:
        # adlfs wraps a failed block upload: RuntimeError("Failed to upload block") from it.
        return is_transient(exc.__cause__)
    # aiohttp/botocore/azure errors that fsspec backends let through unwrapped: decide by
    # their class names so this module imports no SDK.
    return bool(
        names
        & {
            "ClientError",  # aiohttp.ClientError (connection reset, payload errors)
            "BotoCoreError",
            "HttpResponseError",  # azure.core: 5xx after its own retries
            "ServiceRequestError",
            "ServiceResponseError",
            "HttpError",  # gcsfs: 5xx/429
            "TransportError",
        }
    )


def default_options(scheme: str) -> Mapping[str, Any]:
    """fsspec options that make a store safe for checkpoints (no stale listings)."""
    common: dict[str, Any] = {"skip_instance_cache": True}
    if scheme in ("s3", "s3a"):
        # Bounded timeouts: a dead endpoint must fail fast, not hang a training job.
        return {
            **common,
            "config_kwargs": {
                "connect_timeout": 10,
                "read_timeout": 120,
                "retries": {"max_attempts": 3, "mode": "standard"},
            },
        }
    if scheme in ("az", "abfs", "abfss"):
        # adlfs passes these to every blob call; without them a dead endpoint hangs.
        return {**common, "connection_timeout": 10, "read_timeout": 120}
    return common


#: Options fsspec itself takes from any filesystem's arguments (its instance and listings
#: caches), besides those of s3fs's own signature.
_FSSPEC_OPTIONS = ("skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths")


def s3_session_options(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``options`` with an aiobotocore session of the store's own for s3fs, which reads
    botocore's service models through the process's data loader
    (:func:`~costguard.clouds.aws.share_models`): a process that opens several stores (a
    restore that checks, then saves) no longer reads them for each. The session itself is
    new: it reads the credentials, the profile and the endpoint when the store opens, as
    s3fs's own would.

    Options that bring a session, or arguments that s3fs hands to the session it makes
    other than ``profile``, are returned as they are.
    """
    s3fs = importlib.import_module("s3fs")
    own = {*inspect.signature(s3fs.S3FileSystem.__init__).parameters, *_FSSPEC_OPTIONS}
    if "session" in options or set(options) - own - {"profile"}:
        return options
    session = importlib.import_module("aiobotocore.session").AioSession(
        profile=options.get("profile")
    )
    aws_clouds.share_models(session)
    return {**{k: v for k, v in options.items() if k != "profile"}, "session": session}


def check_azure_account(options: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """:class:`MissingCredentialsError` (exit 2) when neither the storage options nor the
    environment name an Azure Storage account, before adlfs is asked (it would say only
    "unable to connect to account").

    >>> check_azure_account({}, {"AZURE_STORAGE_ACCOUNT_NAME": "lab"})
    >>> check_azure_account({}, {})
    Traceback (most recent call last):
    ...
    costguard.errors.MissingCredentialsError: no Azure Storage account or credentials
    """
    if any(options.get(k) for k in ("account_name", "connection_string")) or any(
        environ.get(k) for k in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME")
    ):
        return
    msg = "no Azure Storage account or credentials"
    raise MissingCredentialsError(msg, hint=CREDENTIALS["azure"][1])


def check_google_credentials(options: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """:class:`MissingCredentialsError` (exit 2) when Google's Application Default
    Credentials find none and neither a ``token`` storage option nor STORAGE_EMULATOR_HOST
    says how to reach the bucket: gcsfs would go on anonymously, and every write would be
    retried until it failed on something else (a launch took 19 s to end on a DNS error).
    """
    if options.get("token") is not None or environ.get("STORAGE_EMULATOR_HOST"):
        return
    gcp_clouds.default_credentials()


def one_retry_layer_azure(fs: Any) -> None:
    """Turn off the Azure SDK's own retries, so that ours (jittered, bounded) are the only ones.

    The storage SDK's default waits 15 s, then 18 s, then 24 s between attempts: one
    throttled request would eat most of the 30 s an Azure Spot eviction gives. Best
    effort: an SDK that keeps the policy elsewhere keeps its own retries.
    """
    with contextlib.suppress(AttributeError):
        fs.service_client._config.retry_policy.total_retries = 0


def one_retry_layer_gcs(fs: Any) -> None:
    """Turn off gcsfs's own retries on this filesystem (ours are the only layer), and
    bound each request's connect and read time.

    gcsfs retries each request 6 times with waits up to 32 s and logs a traceback for each
    failure; stacked on ours, an unreachable store took minutes to report. Its retrying
    ``_request`` keeps the plain one as ``__wrapped__``; this instance gets that one (other
    users of gcsfs in the process keep theirs). Every call we make goes through it. Best
    effort, like :func:`one_retry_layer_azure`.
    """
    plain = getattr(getattr(type(fs), "_request", None), "__wrapped__", None)
    if plain is not None:
        fs._request = plain.__get__(fs)
    if getattr(fs, "requests_timeout", None) is None:
        aiohttp = require("aiohttp", EXTRA)
        fs.requests_timeout = aiohttp.ClientTimeout(sock_connect=10, sock_read=120)


def content_md5(info: Mapping[str, Any]) -> str | None:
    """The MD5 of an fsspec listing entry's content, in hex, where its store says it:
    s3fs's ``ETag`` of an object written in one part (a multipart or KMS-encrypted
    object's ETag is no MD5 of its bytes: ``None``), gcsfs's ``md5Hash``, adlfs's
    ``content_settings.content_md5`` (Azure Blob's ``Content-MD5``: the service's MD5 of
    a blob written in one Put Blob, as costguard's records are; after a Put Block List or
    Set Blob Properties, what the writer said, or nothing). Read from the listing, so it
    is as trustworthy as the object itself: only one who may write the object sets it.

    >>> content_md5({"ETag": '"D41D8CD98F00B204E9800998ECF8427E"'})
    'd41d8cd98f00b204e9800998ecf8427e'
    >>> content_md5({"ETag": '"9b2cf535f27731c974343645a3985328-2"'}) is None  # multipart
    True
    >>> content_md5({"md5Hash": "1B2M2Y8AsgTpgAmY7PhCfg=="}), content_md5({"md5Hash": "x"})
    ('d41d8cd98f00b204e9800998ecf8427e', None)
    >>> empty = bytearray.fromhex("d41d8cd98f00b204e9800998ecf8427e")
    >>> content_md5({"etag": '"0x8DC"', "content_settings": {"content_md5": empty}})
    'd41d8cd98f00b204e9800998ecf8427e'
    >>> content_md5({"content_settings": {"content_md5": None}}) is None  # none was set
    True
    """
    import base64
    import binascii

    etag = str(info.get("ETag") or "").strip('"').lower()
    if len(etag) == 32 and all(c in "0123456789abcdef" for c in etag):
        return etag
    settings = info.get("content_settings")
    if isinstance(settings, Mapping):
        said = settings.get("content_md5")
    else:  # the SDK's ContentSettings, where adlfs leaves it as it is
        said = getattr(settings, "content_md5", None)
    if isinstance(said, bytes | bytearray) and len(said) == 16:
        return bytes(said).hex()
    md5 = info.get("md5Hash")
    if isinstance(md5, str):
        try:
            raw = base64.b64decode(md5, validate=True)
        except binascii.Error:
            return None
        return raw.hex() if len(raw) == 16 else None
    return None


def modified_unix(info: Mapping[str, Any]) -> float | None:
    """When an fsspec listing entry was last written: ``mtime`` (local, gcsfs),
    ``LastModified`` (s3fs) or ``last_modified`` (adlfs), as unix time."""
    for key in ("mtime", "LastModified", "last_modified", "updated"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, int | float):
            return float(value)
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        with contextlib.suppress(ValueError):
            from datetime import datetime

            return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    return None
