"""Where checkpoints live: a local folder, ``s3://``, ``gs://`` or ``az://``, through fsspec.

:class:`Store` is the only module here that does storage I/O. It reads and writes whole
objects under one root (``put``, ``get``, ``listing``, ``delete``), retries transient
errors with jittered exponential backoff, and translates what fsspec raises into
:class:`~costguard.errors.CostguardError`: :class:`~costguard.errors.InputError` for a
URL that cannot be used at all (a missing bucket, no permission, nothing answering),
:class:`StoreError` for a failure after the retries.

Local folders get atomic writes (a temporary name, fsync, rename); object stores make
each PUT atomic themselves.

>>> import tempfile
>>> store = Store.open(tempfile.mkdtemp())
>>> store.put("a/b.txt", b"hello")
>>> store.get("a/b.txt"), store.listing()
(b'hello', {'a/b.txt': 5})
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from costguard.clouds import require
from costguard.errors import CostguardError, InputError

logger = logging.getLogger(__name__)
EXTRA = "train"
T = TypeVar("T")

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
#: Errors that no retry can fix: the object or bucket is not there, or we may not touch it.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


class StoreError(CostguardError):
    """A store operation failed after its retries."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a transient store error.

    >>> [round(d, 2) for d in RetryPolicy(attempts=4, base_delay_s=1).delays(random.Random(0))]
    [0.84, 1.52, 1.68]
    """

    attempts: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0

    def delays(self, rng: random.Random) -> list[float]:
        """The sleeps between attempts: "full jitter" exponential backoff.

        Jitter keeps many ranks or many jobs from hammering a throttling store in step.
        """
        return [
            rng.uniform(0, min(self.max_delay_s, self.base_delay_s * 2**i))
            for i in range(self.attempts - 1)
        ]


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` may go away on retry (5xx, throttling, timeouts, dropped connections).

    >>> is_transient(TimeoutError()), is_transient(FileNotFoundError()), is_transient(KeyError())
    (True, False, False)
    """
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, OSError | TimeoutError | ConnectionError):
        return True
    # aiohttp/botocore/azure errors that fsspec backends let through unwrapped: decide by
    # their class names so this module imports no SDK.
    names = {cls.__name__ for cls in type(exc).__mro__}
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


class Store:
    """One checkpoint root in one fsspec filesystem. Paths are relative to the root."""

    def __init__(
        self,
        fs: Any,
        root: str,
        url: str,
        *,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._rng = random.Random()  # noqa: S311 - jitter, not security
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.is_local = protocol in ("file", "local")

    @classmethod
    def open(
        cls,
        url: str | os.PathLike[str],
        storage_options: Mapping[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
    ) -> Store:
        """The store at ``url``; a plain path is a local folder (created if missing).

        Raises :class:`InputError` for an unknown scheme and
        :class:`~costguard.errors.MissingDependencyError` when its fsspec backend is not
        installed.
        """
        text = os.fspath(url)
        scheme = text.split("://", 1)[0].lower() if "://" in text else "file"
        if scheme not in PROTOCOLS:
            msg = f"unsupported checkpoint URL scheme {scheme!r} in {text!r}"
            raise InputError(
                msg, hint="use a local folder, s3://bucket/prefix, gs://bucket/prefix or az://"
            )
        backend = PROTOCOLS[scheme]
        if backend is not None:
            require(backend, EXTRA)
        fsspec_core = require("fsspec.core", EXTRA)
        options = dict(_default_options(scheme))
        options.update(storage_options or {})
        try:
            fs, root = fsspec_core.url_to_fs(text, **options)
        except (ValueError, TypeError, ImportError) as exc:
            msg = f"cannot use the checkpoint URL {text!r}: {exc}"
            raise InputError(msg, hint="check the URL and its storage options") from None
        if scheme in ("s3", "s3a"):
            # One retry layer, ours (jittered, bounded): s3fs's own 5 attempts per call
            # multiplied with ours would stall a failing save for minutes.
            fs.retries = 1
        if backend is None:
            # A missing local root is created; if that fails, check_writable says why.
            with contextlib.suppress(OSError):
                Path(root).mkdir(parents=True, exist_ok=True)
        return cls(fs, root, text, retry=retry)

    def full(self, path: str) -> str:
        """The absolute path (in the filesystem's terms) of a relative ``path``."""
        return f"{self.root}/{path.lstrip('/')}" if path else self.root

    def _with_retries(self, action: str, func: Callable[[], T]) -> T:
        delays = self.retry.delays(self._rng)
        for attempt in range(len(delays) + 1):
            try:
                return func()
            except Exception as exc:
                if not is_transient(exc) or attempt == len(delays):
                    raise
                logger.warning(
                    "%s on %s failed (%s: %s); retry %d of %d in %.1f s",
                    action,
                    self.url,
                    type(exc).__name__,
                    exc,
                    attempt + 1,
                    len(delays),
                    delays[attempt],
                )
                self._sleep(delays[attempt])
        msg = "unreachable"  # the loop always returns or raises
        raise AssertionError(msg)

    def _call(self, action: str, func: Callable[[], T]) -> T:
        try:
            return self._with_retries(action, func)
        except FileNotFoundError as exc:
            msg = f"{action} on {self.url}: not found ({exc})"
            raise StoreError(msg) from exc
        except PermissionError as exc:
            msg = f"{action} on {self.url}: permission denied ({exc})"
            raise StoreError(msg) from exc
        except CostguardError:
            raise
        except Exception as exc:
            msg = f"{action} on {self.url} failed: {type(exc).__name__}: {exc}"
            raise StoreError(msg) from exc

    def put(self, path: str, data: bytes | memoryview) -> None:
        """Write one whole object; a reader sees the old object, or the complete new one."""
        target = self.full(path)
        if self.is_local:
            self._call(f"writing {path}", lambda: _atomic_local_write(target, data))
        else:
            self._call(f"writing {path}", lambda: self.fs.pipe_file(target, bytes(data)))

    def get(self, path: str) -> bytes:
        """Read one whole object (one GET: faster than ranged reads on most stores)."""
        return self._call(f"reading {path}", lambda: bytes(self.fs.cat_file(self.full(path))))

    def listing(self) -> dict[str, int]:
        """Every object under the root: relative path -> size in bytes."""

        def find() -> dict[str, int]:
            self.fs.invalidate_cache()
            try:
                found = self.fs.find(self.root, detail=True)
            except FileNotFoundError:
                return {}
            prefix = self.fs._strip_protocol(self.root).rstrip("/") + "/"
            out = {}
            for path, info in found.items():
                stripped = self.fs._strip_protocol(path)
                if stripped.startswith(prefix) and info.get("type", "file") == "file":
                    out[stripped[len(prefix) :]] = int(info.get("size") or 0)
            return out

        return self._call("listing", find)

    def delete(self, paths: Iterable[str]) -> None:
        """Delete objects, in the order given (missing ones are fine)."""
        for path in paths:
            target = self.full(path)

            def remove(target: str = target) -> None:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(target)

            self._call(f"deleting {path}", remove)
        if self.is_local:
            _prune_empty_local_dirs(self.root)

    def check_writable(self) -> None:
        """Write, read back and delete a probe object; :class:`InputError` if that fails.

        Called before training starts, so a wrong URL, a missing bucket or a missing
        permission shows up in the first second instead of at the first save.
        """
        probe = f".costguard-probe-{uuid.uuid4().hex[:12]}"
        payload = json.dumps({"written_unix": time.time()}).encode()
        try:
            self.put(probe, payload)
            if self.get(probe) != payload:
                msg = f"the checkpoint store {self.url} returned other bytes than were written"
                raise InputError(msg, hint="check that the URL points at a real object store")
            self.delete([probe])
        except StoreError as exc:
            cause = exc.__cause__
            if isinstance(cause, FileNotFoundError):
                hint = "create the bucket or container first, or fix its name"
                msg = f"the checkpoint location {self.url} does not exist ({cause})"
            elif isinstance(cause, PermissionError):
                hint = "give this identity write and delete access to it, or pick another URL"
                msg = f"cannot write checkpoints to {self.url}: permission denied"
            else:
                hint = "check the URL, the network, the credentials and AWS_ENDPOINT_URL"
                msg = f"cannot write checkpoints to {self.url}: {exc.message}"
            raise InputError(msg, hint=hint) from exc


def _default_options(scheme: str) -> Mapping[str, Any]:
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
    return common


def _atomic_local_write(target: str, data: bytes | memoryview) -> None:
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            # Durable on disk before it becomes visible under its name.
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _prune_empty_local_dirs(root: str) -> None:
    base = Path(root)
    for child in base.iterdir() if base.is_dir() else ():
        if child.is_dir():
            with contextlib.suppress(OSError):
                child.rmdir()  # only succeeds when empty
