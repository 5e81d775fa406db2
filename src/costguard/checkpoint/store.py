"""Where checkpoints live: a local folder, ``s3://``, ``gs://`` or ``az://``, through fsspec.

:class:`Store` is the only module here that does storage I/O. It reads and writes whole
objects under one root (``put``, ``get``, ``listing``, ``delete``), retries transient
errors with jittered exponential backoff, and translates what fsspec raises into
:class:`~costguard.errors.CostguardError`: :class:`~costguard.errors.InputError` for a
URL that cannot be used at all (a missing bucket, no permission, nothing answering),
:class:`StoreError` for a failure after the retries.

Local folders get atomic writes (a temporary name, fsync, rename); object stores make
each PUT atomic themselves. On S3 a large object goes up as a multipart upload whose parts
are sent concurrently (bounded), each part retried on its own and checked by the store
(CRC32), the sha256 of the whole computed in the same pass; a failed upload is aborted, and
:meth:`Store.abort_stale_uploads` aborts those a killed writer left behind, so they stop
holding (and billing) bytes. On GCS and Azure a large object goes up through the backend's
chunked upload (resumable upload, staged blocks), one block copied at a time.

It is long because it is the one place where bytes cross to a store, and each backend
needs its own care there (S3 multipart, GCS and Azure blocks, atomic local files, streamed
and verified reads, one retry layer per backend, deadlines); everything above it speaks
only ``put``/``get``/``upload``/``verified_file``/``objects``/``delete``.

>>> import tempfile
>>> store = Store.open(tempfile.mkdtemp())
>>> store.put("a/b.txt", b"hello")
>>> store.get("a/b.txt"), store.listing()
(b'hello', {'a/b.txt': 5})
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import io
import json
import logging
import os
import random
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from costguard.checkpoint.manifest import ManifestError
from costguard.clouds import require
from costguard.errors import CostguardError, InputError
from costguard.secrets import redact, redact_url, url_has_credentials

logger = logging.getLogger(__name__)
EXTRA = "train"
T = TypeVar("T")
#: ``progress(done, total)``: bytes of a long read, for a progress bar.
Progress = Callable[[int, int], None]

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
#: S3 multipart: objects larger than one part go up in parts of this size (or larger,
#: so that no object needs more than S3's 10,000 parts), this many in flight at once.
PART_BYTES = 16 * 2**20
PARTS_IN_FLIGHT = 8
MAX_PARTS = 10_000
#: How long a writer waits for a free part slot before giving up (parts have timeouts).
PART_WAIT_S = 900.0
#: An incomplete multipart upload older than this belongs to a writer that is gone.
UPLOAD_GRACE_S = 900.0
#: Restores read an object in chunks of this size (hashing as they go), S3 in this many
#: concurrent ranged GETs of twice that.
READ_CHUNK = 4 * 2**20
READ_STREAMS = 4
#: A retry that would start less than this before the deadline is not started.
DEADLINE_MARGIN_S = 1.0
#: The environment variable that holds fsspec options for the store, as a JSON object.
ENV_STORAGE_OPTIONS = "COSTGUARD_STORAGE_OPTIONS"
#: What to check when a store cannot be reached, per backend.
_REACH_HINTS = {
    "s3": "check the bucket name, the AWS credentials (AWS_PROFILE, access keys or the "
    "instance role) and AWS_ENDPOINT_URL if you use one",
    "gcs": "check the bucket name, the Google credentials (gcloud auth application-default "
    "login, or the VM's service account) and STORAGE_EMULATOR_HOST if you use one",
    "azure": "check the container name and the Azure credentials "
    "(AZURE_STORAGE_CONNECTION_STRING, or account_name and a managed identity)",
    "local": "check that the folder exists and that you may write to it",
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


def storage_options_from_env(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The fsspec options in ``COSTGUARD_STORAGE_OPTIONS`` (a JSON object), or ``None``.

    >>> storage_options_from_env({"COSTGUARD_STORAGE_OPTIONS": '{"anon": true}'})
    {'anon': True}
    >>> storage_options_from_env({"COSTGUARD_STORAGE_OPTIONS": "{anon"})
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: COSTGUARD_STORAGE_OPTIONS must be a JSON object, not '{anon'
    """
    env = os.environ if env is None else env
    text = env.get(ENV_STORAGE_OPTIONS, "").strip()
    if not text:
        return None
    try:
        options = json.loads(text)
    except (ValueError, RecursionError):
        options = None
    if not isinstance(options, dict):
        shown = text if len(text) <= 40 else f"{text[:40]}..."
        msg = f"{ENV_STORAGE_OPTIONS} must be a JSON object, not {shown!r}"
        raise InputError(msg, hint=f"e.g. {ENV_STORAGE_OPTIONS}='{{\"anon\": false}}'")
    return options


def backend_name(url: str) -> str:
    """``s3``, ``gcs``, ``azure`` or ``local``: which kind of store ``url`` names.

    >>> backend_name("gs://b/p"), backend_name("abfs://c/p"), backend_name("/tmp/x")
    ('gcs', 'azure', 'local')
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
    return {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}.get(
        scheme, "azure" if scheme in ("az", "abfs", "abfss") else "local"
    )


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
    if isinstance(exc, _PERMANENT):
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
        #: The URL as it may be shown: userinfo and query string masked.
        self.url = redact_url(url)
        self.backend = backend_name(url)
        self.retry = retry or RetryPolicy()
        #: When set (unix time), no retry starts that could not end before it: the save
        #: of a preemption notice must commit, or say it could not, while the machine lives.
        self.deadline_unix: float | None = None
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
        create: bool = True,
    ) -> Store:
        """The store at ``url``; a plain path is a local folder (created if missing, with
        ``create``; without it a missing folder is a :class:`StoreError`).

        Raises :class:`InputError` for an unknown scheme or a URL that carries credentials
        (they belong in the environment, not in a URL that is logged and passed on), and
        :class:`~costguard.errors.MissingDependencyError` when its fsspec backend is not
        installed. Nothing touches the store before these checks.
        """
        text = os.fspath(url)
        scheme = text.split("://", 1)[0].lower() if "://" in text else "file"
        if scheme not in PROTOCOLS:
            msg = f"unsupported checkpoint URL scheme {scheme[:20]!r} in {redact_url(text)[:200]!r}"
            raise InputError(
                msg, hint="use a local folder, s3://bucket/prefix, gs://bucket/prefix or az://"
            )
        if "://" in text and url_has_credentials(text):
            msg = (
                f"the checkpoint URL {redact_url(text)[:200]!r} carries a user name, password "
                "or query string"
            )
            raise InputError(
                msg,
                hint="give credentials through the environment (AWS_PROFILE, "
                "GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_CONNECTION_STRING) or the "
                "machine's role, never in the URL",
            )
        if PROTOCOLS[scheme] is not None and not text.split("://", 1)[1].split("/", 1)[0]:
            msg = f"the checkpoint URL {text[:200]!r} names no bucket or container"
            raise InputError(msg, hint=f"e.g. {scheme}://my-bucket/run1")
        backend = PROTOCOLS[scheme]
        if backend is not None:
            require(backend, EXTRA)
        fsspec_core = require("fsspec.core", EXTRA)
        options = dict(_default_options(scheme))
        options.update(storage_options or {})
        try:
            if scheme in ("gs", "gcs"):
                # gcsfs's default class probes every bucket's layout over gRPC (zonal and
                # HNS buckets) with a retrying 60 s timeout of its own, and probes again
                # after each failure: minutes before an unreachable store is reported. A
                # checkpoint needs plain object calls, which the core class makes.
                fs = require("gcsfs.core", EXTRA).GCSFileSystem(**options)
                root = fs._strip_protocol(text)
            else:
                fs, root = fsspec_core.url_to_fs(text, **options)
        except (ValueError, TypeError, ImportError) as exc:
            msg = f"cannot use the checkpoint URL {redact_url(text)[:200]!r}: {redact(str(exc))}"
            raise InputError(msg, hint="check the URL and its storage options") from None
        if scheme in ("s3", "s3a"):
            # One retry layer, ours (jittered, bounded): s3fs's own 5 attempts per call
            # multiplied with ours would stall a failing save for minutes.
            fs.retries = 1
        if scheme in ("az", "abfs", "abfss"):
            _one_retry_layer_azure(fs)
        if scheme in ("gs", "gcs"):
            _one_retry_layer_gcs(fs)
        if backend is None:
            if create:
                # A missing local root is created; if that fails, check_writable says why.
                with contextlib.suppress(OSError):
                    Path(root).mkdir(parents=True, exist_ok=True)
            elif not Path(root).is_dir():
                msg = f"no checkpoint store at {text[:200]}: the folder does not exist"
                raise StoreError(msg, hint="check the path (nothing was created)")
        return cls(fs, root, text, retry=retry)

    def full(self, path: str) -> str:
        """The absolute path (in the filesystem's terms) of a relative ``path``."""
        return f"{self.root}/{path.lstrip('/')}" if path else self.root

    def _delays(self) -> list[float]:
        return self.retry.delays(self._rng)

    def _may_retry(self, delay_s: float) -> bool:
        """Whether a retry after ``delay_s`` could still end before the deadline."""
        if self.deadline_unix is None:
            return True
        return time.time() + delay_s + DEADLINE_MARGIN_S < self.deadline_unix

    def _with_retries(self, action: str, func: Callable[[], T]) -> T:
        delays = self._delays()
        for attempt in range(len(delays) + 1):
            try:
                return func()
            except Exception as exc:
                if (
                    not is_transient(exc)
                    or attempt == len(delays)
                    or not self._may_retry(delays[attempt])
                ):
                    raise
                self._log_retry(action, exc, attempt, delays)
                self._sleep(delays[attempt])
        msg = "unreachable"  # the loop always returns or raises
        raise AssertionError(msg)

    def _log_retry(self, action: str, exc: Exception, attempt: int, delays: list[float]) -> None:
        logger.warning(
            "%s on %s failed (%s: %s); retry %d of %d in %.1f s",
            action,
            self.url,
            type(exc).__name__,
            redact(str(exc))[:300],
            attempt + 1,
            len(delays),
            delays[attempt],
        )

    def _call(self, action: str, func: Callable[[], T]) -> T:
        return self._translate(action, lambda: self._with_retries(action, func))

    def _translate(self, action: str, func: Callable[[], T]) -> T:
        """Run ``func``; what it raises becomes a :class:`StoreError` that names ``action``."""
        try:
            return func()
        except CostguardError:
            raise
        except Exception as exc:
            raise self._store_error(action, exc) from exc

    def _store_error(self, action: str, exc: Exception) -> StoreError:
        detail = redact(str(exc))[:300]
        if isinstance(exc, FileNotFoundError):
            return StoreError(f"{action} on {self.url}: not found ({detail})")
        if isinstance(exc, PermissionError):
            return StoreError(f"{action} on {self.url}: permission denied ({detail})")
        return StoreError(f"{action} on {self.url} failed: {type(exc).__name__}: {detail}")

    async def _with_retries_async(self, action: str, func: Callable[[], Awaitable[T]]) -> T:
        """:meth:`_with_retries` for a coroutine (one S3 call on fsspec's event loop); after
        the last attempt the error is a :class:`StoreError` that names ``action``."""
        delays = self._delays()
        for attempt in range(len(delays) + 1):
            try:
                return await func()
            except Exception as exc:
                if (
                    not is_transient(exc)
                    or attempt == len(delays)
                    or not self._may_retry(delays[attempt])
                ):
                    raise self._store_error(action, exc) from exc
                self._log_retry(action, exc, attempt, delays)
                await asyncio.sleep(delays[attempt])
        msg = "unreachable"  # the loop always returns or raises
        raise AssertionError(msg)

    @property
    def is_s3(self) -> bool:
        """Whether this store is S3 (or an S3-compatible endpoint) through s3fs."""
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return protocol in ("s3", "s3a")

    def put(self, path: str, data: bytes | memoryview) -> None:
        """Write one whole object; a reader sees the old object, or the complete new one."""
        self._put(path, data, None)

    def put_hashed(self, path: str, data: bytes | memoryview) -> str:
        """:meth:`put`, returning the sha256 (hex) of ``data``, computed in the same pass.

        On S3 each part is hashed while the parts before it are on the wire, so the hash
        costs no time of its own; elsewhere the data is hashed, then written.
        """
        digest = hashlib.sha256()
        self._put(path, data, digest)
        return digest.hexdigest()

    @contextlib.contextmanager
    def upload(self, path: str) -> Iterator[Upload]:
        """Write one object from a stream: ``torch.save(state, upload)`` inside the block.

        On S3 the bytes go up while they are produced: each full part is hashed (in a
        worker thread, in order) and sent while the producer goes on, at most
        ``PARTS_IN_FLIGHT`` parts held in memory. In a local folder they go straight into
        a temporary file, hashed on the way, which is synced and renamed at the end: no
        copy of the whole object is held in memory. Elsewhere they collect in memory and
        are written at the end of the block. The object exists (complete) only once the block
        has ended without an error; on an error nothing is written and a started multipart
        upload is aborted. Afterwards ``upload.size`` and ``upload.sha256`` describe it.
        """
        streamed: _S3Upload | _LocalUpload | None = None
        if self.is_s3:
            streamed = _S3Upload(self, path, hashlib.sha256())
        elif self.is_local:
            streamed = self._translate(f"writing {path}", lambda: _LocalUpload(self.full(path)))
        if streamed is not None:
            try:
                yield streamed
                self._translate(f"writing {path}", streamed.finish)
            except BaseException:
                streamed.abort()
                if streamed.failure is not None:
                    # torch.save reports a failed write as its own RuntimeError ("unexpected
                    # pos"): the store's error is the one that says what went wrong.
                    raise streamed.failure from None
                raise
            return
        buffered = Upload()
        yield buffered
        buffered.sha256 = self.put_hashed(path, buffered.buffer.getbuffer())

    def write_stream(self, path: str, produce: Callable[[Upload], None]) -> tuple[int, str]:
        """Write one object from what ``produce(file)`` writes; its size and sha256.

        :meth:`upload` with a retry that fits each store: S3 retries each part alone;
        a local write that fails transiently is produced again from the start (into a
        fresh temporary file); elsewhere the bytes are buffered, then put with retries.
        """

        def once() -> tuple[int, str]:
            with self.upload(path) as upload:
                produce(upload)
            return upload.size, upload.sha256

        if self.is_local:
            return self._call(f"writing {path}", once)
        return once()

    def _put(self, path: str, data: bytes | memoryview, digest: Any) -> None:
        target = self.full(path)
        view = memoryview(data).cast("B")
        if self.is_s3 and view.nbytes > PART_BYTES:
            upload = _S3Upload(self, path, digest)
            try:
                # No outer retry: every call of the upload retries on its own.
                self._translate(f"writing {path}", lambda: upload.write(view))
                self._translate(f"writing {path}", upload.finish)
            except BaseException:
                upload.abort()
                raise
            return
        if digest is not None:
            digest.update(view)
        if self.is_local:
            self._call(f"writing {path}", lambda: _atomic_local_write(target, view))
        elif view.nbytes > PART_BYTES:
            self._call(f"writing {path}", lambda: self._write_in_blocks(target, view))
        else:
            self._call(f"writing {path}", lambda: self.fs.pipe_file(target, bytes(view)))

    def _write_in_blocks(self, target: str, view: memoryview) -> None:
        """Write a large object through the backend's own chunked upload (GCS: a resumable
        upload; Azure: staged blocks committed at the end), ``PART_BYTES`` at a time.

        ``pipe_file`` wants one ``bytes``: a copy of the whole object made with the GIL
        held, which would stop the training thread for as long as it takes and double the
        memory. Here only one block at a time is copied. The object appears only when the
        upload completes; on an error the upload is cancelled where the backend can
        (gcsfs), and never completed.
        """
        file = self.fs.open(target, "wb", block_size=PART_BYTES)
        try:
            for start in range(0, view.nbytes, PART_BYTES):
                file.write(view[start : start + PART_BYTES])
        except BaseException:
            with contextlib.suppress(Exception):
                file.discard()
            file.closed = True  # so that garbage collection does not complete it
            raise
        file.close()

    async def _abort_upload(self, bucket: str, key: str, upload_id: str) -> bool:
        """Abort one multipart upload, best effort: a failure here is logged, not raised
        (:meth:`abort_stale_uploads` gets another go later). Whether it was aborted."""
        try:
            await self._with_retries_async(
                f"aborting the upload of {key}",
                lambda: self.fs._call_s3(
                    "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id
                ),
            )
        except Exception as exc:
            logger.warning(
                "could not abort the upload of %s on %s: %s", key, self.url, redact(str(exc))
            )
            return False
        return True

    def abort_stale_uploads(
        self, grace_s: float = UPLOAD_GRACE_S, *, now_unix: float | None = None
    ) -> list[str]:
        """Abort incomplete S3 multipart uploads under the root older than ``grace_s``.

        A writer killed mid-upload leaves its parts on S3, invisible to a listing but
        stored and billed, until someone aborts the upload. The grace period spares an
        upload another live writer may still be sending. Returns the keys aborted; does
        nothing on other stores (local writes are atomic; Azure drops uncommitted blocks
        and GCS its unfinished resumable uploads after about a week by itself).
        """
        if not self.is_s3:
            return []
        fs = self.fs
        bucket, prefix, _ = fs.split_path(self.full(""))
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        cutoff = (time.time() if now_unix is None else now_unix) - grace_s

        async def sweep() -> list[str]:
            aborted: list[str] = []
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}

            async def page() -> dict[str, Any]:
                answer: dict[str, Any] = await fs._call_s3("list_multipart_uploads", **kwargs)
                return answer

            for _page in range(1000):  # bounded: 1000 pages of 1000 uploads
                answer = await self._with_retries_async("listing incomplete uploads", page)
                for upload in answer.get("Uploads", []):
                    initiated = upload.get("Initiated")
                    started = initiated.timestamp() if initiated is not None else 0.0
                    if started <= cutoff and await self._abort_upload(
                        bucket, upload["Key"], upload["UploadId"]
                    ):
                        aborted.append(upload["Key"])
                if not answer.get("IsTruncated"):
                    break
                kwargs["KeyMarker"] = answer.get("NextKeyMarker", "")
                kwargs["UploadIdMarker"] = answer.get("NextUploadIdMarker", "")
            return aborted

        aborted = self._translate("listing incomplete uploads", lambda: _sync(fs, sweep()))
        for key in aborted:
            logger.info("aborted an incomplete upload of %s on %s", key, self.url)
        return aborted

    def get(self, path: str) -> bytes:
        """Read one whole object (one GET: faster than ranged reads on most stores)."""
        return self._call(f"reading {path}", lambda: bytes(self.fs.cat_file(self.full(path))))

    @contextlib.contextmanager
    def verified_file(
        self, path: str, size: int, sha256: str, progress: Progress | None = None
    ) -> Iterator[str]:
        """A local file holding object ``path``, checked against ``size`` and ``sha256``.

        In a local folder that is the object itself, hashed in place; elsewhere the object
        streams into a temporary file (``TMPDIR``) a chunk at a time, hashed as it is
        read back, and removed at the end of the block. Either way no copy of the object is
        held in memory, so a caller can map it (``torch.load(mmap=True)``).

        A size or hash that does not match is :class:`ManifestError` (proof that the
        object is bad); a read that fails is :class:`StoreError` (the object may be fine).
        ``progress(done, total)`` hears of the bytes read (downloaded, then hashed).
        """
        report = progress or (lambda done, total: None)
        if self.is_local:
            local = self.full(path)
            self._call(
                f"reading {path}",
                lambda: self._check_file(
                    path, local, size, sha256, opener=self.fs.open, progress=report
                ),
            )
            yield local
            return
        fd, tmp = tempfile.mkstemp(prefix="costguard-restore-", suffix=".pt")
        os.close(fd)
        try:
            self._download(path, tmp, size, lambda done, _: report(done, 2 * size))
            self._check_file(
                path, tmp, size, sha256, progress=lambda done, _: report(size + done, 2 * size)
            )
            yield tmp
        finally:
            Path(tmp).unlink(missing_ok=True)

    def _download(self, path: str, local: str, size: int, progress: Progress) -> None:
        """Stream object ``path`` into the file ``local``, with this store's retries.

        S3: ``get_file`` in ``READ_STREAMS`` concurrent ranged GETs at a time; Azure: its
        streamed download; either is started again on an error. GCS: ranged reads of
        ``READ_CHUNK`` bytes, each retried alone (gcsfs's whole-file download
        retries on its own, a second layer that would outlive a preemption notice).
        """
        full = self.full(path)
        callback = require("fsspec.callbacks", EXTRA).Callback(
            hooks={"progress": lambda size, value, **_: progress(value, size or 0)}
        )
        if self.backend == "s3":
            # s3fs reads a big object as batches of concurrent ranged GETs, each batch held
            # in memory (twice, while a body is joined): its defaults (10 x 50 MB) held
            # about 1 GB at a time. Memory a process has touched is rarely given back, so
            # this peak would stay for the whole run.
            self._call(
                f"reading {path}",
                lambda: self.fs.get_file(
                    full,
                    local,
                    callback=callback,
                    chunksize=READ_CHUNK * 2,
                    max_concurrency=READ_STREAMS,
                ),
            )
            return
        if self.backend != "gcs":
            self._call(f"reading {path}", lambda: self.fs.get_file(full, local, callback=callback))
            return
        with Path(local).open("wb") as file:
            for start in range(0, size, READ_CHUNK):
                end = min(size, start + READ_CHUNK)
                file.write(self._read_range(path, full, start, end))
                progress(end, size)

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of object ``path``, with retries."""
        return self._read_range(path, self.full(path), start, end)

    def _read_range(self, path: str, full: str, start: int, end: int) -> bytes:
        return self._call(
            f"reading {path}", lambda: bytes(self.fs.cat_file(full, start=start, end=end))
        )

    def _check_file(
        self,
        path: str,
        local: str,
        size: int,
        sha256: str,
        *,
        opener: Callable[..., Any] = io.open,
        progress: Progress | None = None,
    ) -> None:
        digest, got = hashlib.sha256(), 0
        with opener(local, "rb") as file:
            while chunk := file.read(READ_CHUNK):
                digest.update(chunk)
                got += len(chunk)
                if progress is not None:
                    progress(got, size)
        if got != size:
            # Read whole, yet not the size the listing and the manifest agree on: a read
            # cut short (the caller checked the listed size) is not proof of corruption.
            msg = f"reading {path} on {self.url} gave {got} bytes, the manifest says {size}"
            raise StoreError(msg)
        if digest.hexdigest() != sha256:
            msg = (
                f"{path} on {self.url}: sha256 {digest.hexdigest()[:12]}... does not match "
                f"the manifest's {sha256[:12]}..."
            )
            raise ManifestError(msg)

    def listing(self) -> dict[str, int]:
        """Every object under the root: relative path -> size in bytes."""
        return self.objects()[0]

    def objects(self) -> tuple[dict[str, int], dict[str, float]]:
        """Every object under the root: relative path -> size in bytes, and relative path
        -> when it was last written (unix time), for the objects whose store says."""

        def find() -> tuple[dict[str, int], dict[str, float]]:
            self.fs.invalidate_cache()
            try:
                found = self.fs.find(self.root, detail=True)
            except FileNotFoundError:
                return {}, {}
            prefix = self.fs._strip_protocol(self.root).rstrip("/") + "/"
            sizes, modified = {}, {}
            for path, info in found.items():
                stripped = self.fs._strip_protocol(path)
                if stripped.startswith(prefix) and info.get("type", "file") == "file":
                    relative = stripped[len(prefix) :]
                    sizes[relative] = int(info.get("size") or 0)
                    when = _modified_unix(info)
                    if when is not None:
                        modified[relative] = when
            return sizes, modified

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

    def check_exists(self) -> None:
        """:class:`StoreError` unless the folder (local) or the bucket/container exists;
        for commands that only read, and must not create what they look at."""
        if self.is_local:
            found = Path(self.root).is_dir()
        else:
            bucket = self.fs._strip_protocol(self.root).split("/", 1)[0]
            found = self._call("looking for the bucket", lambda: self.fs.exists(bucket))
        if not found:
            msg = f"no checkpoint store at {self.url}: it does not exist"
            raise StoreError(msg, hint="check the URL (nothing was created)")

    def check_writable(self, *, within_s: float = 30.0) -> None:
        """Write, read back and delete a probe object; :class:`InputError` if that fails.

        Called before training starts, so a wrong URL, a missing bucket or a missing
        permission shows up at once instead of at the first save. Retries stop after
        ``within_s``, so an unreachable store is reported in about that long.
        """
        probe = f".costguard-probe-{uuid.uuid4().hex[:12]}"
        payload = json.dumps({"written_unix": time.time()}).encode()
        saved_deadline = self.deadline_unix
        self.deadline_unix = time.time() + within_s
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
                msg = f"the checkpoint location {self.url} does not exist"
            elif isinstance(cause, PermissionError):
                hint = "give this identity write and delete access to it, or pick another URL"
                msg = f"cannot write checkpoints to {self.url}: permission denied"
            else:
                hint = _REACH_HINTS[self.backend]
                msg = f"cannot write checkpoints to {self.url}: {exc.message}"
            raise InputError(msg, hint=hint) from exc
        finally:
            self.deadline_unix = saved_deadline


class Upload:
    """The object being written in :meth:`Store.upload` (a write-only file)."""

    def __init__(self) -> None:
        self.buffer = io.BytesIO()
        self.size = 0
        #: The sha256 (hex) of the object, once the upload has ended.
        self.sha256 = ""
        #: The first error a write raised (a writer such as torch.save may replace it).
        self.failure: BaseException | None = None

    def write(self, data: Any) -> int:
        """Append ``data``; returns its length in bytes."""
        try:
            n = self._write(data)
        except BaseException as exc:
            if self.failure is None:
                self.failure = exc
            raise
        self.size += n
        return n

    def _write(self, data: Any) -> int:
        return self.buffer.write(data)

    def writable(self) -> bool:
        """A file-like object for ``torch.save``."""
        return True

    def flush(self) -> None:
        """Nothing to flush: the bytes go out in parts, or at the end."""


class _LocalUpload(Upload):
    """One local file written from a stream: hashed as written, atomic at :meth:`finish`.

    The bytes go to a temporary file beside the target, unbuffered; big writes are
    hashed and written a chunk at a time, so each chunk is still in the CPU cache when it
    is written, and both the hash and the write run without the GIL.
    """

    CHUNK = 1 << 20

    def __init__(self, target: str) -> None:
        super().__init__()
        self.path = Path(target)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{uuid.uuid4().hex[:8]}")
        self.digest = hashlib.sha256()
        self.file = self.tmp.open("wb", buffering=0)

    def _write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, view.nbytes, self.CHUNK):
            chunk = view[start : start + self.CHUNK]
            self.digest.update(chunk)
            written = 0
            while written < chunk.nbytes:  # a raw write may take fewer bytes
                written += self.file.write(chunk[written:]) or 0
        return view.nbytes

    def finish(self) -> None:
        """Make the file durable, then visible under its name (and the rename durable)."""
        os.fsync(self.file.fileno())
        self.file.close()
        self.tmp.replace(self.path)
        _fsync_dir(self.path.parent)
        self.sha256 = self.digest.hexdigest()

    def abort(self) -> None:
        """Drop the temporary file (never raises)."""
        with contextlib.suppress(OSError):
            self.file.close()
        self.tmp.unlink(missing_ok=True)


class _S3Upload(Upload):
    """One S3 multipart upload fed by writes: full parts go up concurrently, each retried
    alone and checked by S3 (CRC32), while the writer produces the next.

    Threads: the writer's thread fills parts; fsspec's event loop sends them; one worker
    hashes them in order. The multipart upload starts with the first full part, so an
    object smaller than a part is one plain PUT.
    """

    def __init__(self, store: Store, path: str, digest: Any) -> None:
        super().__init__()
        self.store = store
        self.path = path
        self.target = store.full(path)
        self.bucket, self.key, _ = store.fs.split_path(self.target)
        self.digest = digest
        self._part = bytearray()
        self._number = 0
        self._upload_id: str | None = None
        self._slots = threading.BoundedSemaphore(PARTS_IN_FLIGHT)
        self._sent: list[concurrent.futures.Future[dict[str, Any]]] = []
        self._hasher = concurrent.futures.ThreadPoolExecutor(1, "costguard-sha256")
        self._hashed: list[concurrent.futures.Future[None]] = []

    def _write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n, offset = view.nbytes, 0
        while offset < n:
            take = view[offset : offset + PART_BYTES - len(self._part)]
            self._part += take
            offset += take.nbytes
            if len(self._part) >= PART_BYTES:
                self._send_part()
        return n

    def _call(self, action: str, method: str, **kwargs: Any) -> Any:
        """One S3 call (with retries) on the event loop, from the writer's thread."""
        fs = self.store.fs

        async def call() -> Any:
            return await fs._call_s3(method, Bucket=self.bucket, Key=self.key, **kwargs)

        return _sync(fs, self.store._with_retries_async(f"{action} {self.path}", call))

    def _raise_failed(self) -> None:
        for future in self._sent:
            if future.done() and future.exception() is not None:
                future.result()  # raises the part's StoreError

    def _send_part(self) -> None:
        body, self._part = self._part, bytearray()
        self._number += 1
        if self._number > MAX_PARTS:
            msg = f"{self.path} is larger than {MAX_PARTS} parts of {PART_BYTES} bytes"
            raise StoreError(msg)
        if self.digest is not None:
            self._hashed.append(self._hasher.submit(self.digest.update, body))
        if self._upload_id is None:
            created = self._call(
                "starting the upload of", "create_multipart_upload", ChecksumAlgorithm="CRC32"
            )
            self._upload_id = str(created["UploadId"])
        self._raise_failed()
        if not self._slots.acquire(timeout=PART_WAIT_S):
            msg = f"uploading {self.path}: no part finished in {PART_WAIT_S:.0f} s"
            raise StoreError(msg)
        self._raise_failed()
        future = asyncio.run_coroutine_threadsafe(
            self._send(self._number, body), self.store.fs.loop
        )
        future.add_done_callback(lambda _: self._slots.release())
        self._sent.append(future)

    async def _send(self, number: int, body: bytearray) -> dict[str, Any]:
        fs = self.store.fs

        async def call() -> dict[str, Any]:
            answer: dict[str, Any] = await fs._call_s3(
                "upload_part",
                Bucket=self.bucket,
                Key=self.key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=body,
                ChecksumAlgorithm="CRC32",
            )
            return answer

        answer = await self.store._with_retries_async(
            f"uploading part {number} of {self.path}", call
        )
        part = {"PartNumber": number, "ETag": answer["ETag"]}
        if answer.get("ChecksumCRC32"):
            part["ChecksumCRC32"] = answer["ChecksumCRC32"]
        return part

    def finish(self) -> None:
        """Send the last part and complete the upload (or PUT a small object whole)."""
        if self._upload_id is None:
            body, self._part = bytes(self._part), bytearray()
            if self.digest is not None:
                self.digest.update(body)
            self.store._call(
                f"writing {self.path}", lambda: self.store.fs.pipe_file(self.target, body)
            )
        else:
            if self._part:
                self._send_part()
            parts = [future.result() for future in self._sent]
            for hashed in self._hashed:
                hashed.result()
            self._call(
                "completing the upload of",
                "complete_multipart_upload",
                UploadId=self._upload_id,
                MultipartUpload={"Parts": parts},
            )
            self.store.fs.invalidate_cache(self.target)
        self._hasher.shutdown(wait=True)
        if self.digest is not None:
            self.sha256 = self.digest.hexdigest()

    def abort(self) -> None:
        """Stop sending, and abort the multipart upload (best effort, never raises)."""
        for future in self._sent:
            future.cancel()
        concurrent.futures.wait(self._sent, timeout=PART_WAIT_S)
        self._hasher.shutdown(wait=True, cancel_futures=True)
        if self._upload_id is not None:
            with contextlib.suppress(Exception):
                _sync(
                    self.store.fs,
                    self.store._abort_upload(self.bucket, self.key, self._upload_id),
                )
        self._upload_id = None


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
    if scheme in ("az", "abfs", "abfss"):
        # adlfs passes these to every blob call; without them a dead endpoint hangs.
        return {**common, "connection_timeout": 10, "read_timeout": 120}
    return common


def _one_retry_layer_azure(fs: Any) -> None:
    """Turn off the Azure SDK's own retries, so that ours (jittered, bounded) are the only ones.

    The storage SDK's default waits 15 s, then 18 s, then 24 s between attempts: one
    throttled request would eat most of the 30 s an Azure Spot eviction gives. Best
    effort: an SDK that keeps the policy elsewhere keeps its own retries.
    """
    with contextlib.suppress(AttributeError):
        fs.service_client._config.retry_policy.total_retries = 0


def _one_retry_layer_gcs(fs: Any) -> None:
    """Turn off gcsfs's own retries on this filesystem (ours are the only layer), and
    bound each request's connect and read time.

    gcsfs retries each request 6 times with waits up to 32 s and logs a traceback for each
    failure; stacked on ours, an unreachable store took minutes to report. Its retrying
    ``_request`` keeps the plain one as ``__wrapped__``; this instance gets that one (other
    users of gcsfs in the process keep theirs). Every call we make goes through it. Best
    effort, like :func:`_one_retry_layer_azure`.
    """
    plain = getattr(getattr(type(fs), "_request", None), "__wrapped__", None)
    if plain is not None:
        fs._request = plain.__get__(fs)
    if getattr(fs, "requests_timeout", None) is None:
        aiohttp = require("aiohttp", EXTRA)
        fs.requests_timeout = aiohttp.ClientTimeout(sock_connect=10, sock_read=120)


def _modified_unix(info: Mapping[str, Any]) -> float | None:
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


def _sync(fs: Any, coroutine: Awaitable[T]) -> T:
    """Run ``coroutine`` on the fsspec filesystem's event loop and wait for it."""
    fsspec_asyn = require("fsspec.asyn", EXTRA)

    async def run() -> T:
        return await coroutine

    result: T = fsspec_asyn.sync(fs.loop, run)
    return result


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
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable."""
    dir_fd = os.open(folder, os.O_RDONLY)
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
