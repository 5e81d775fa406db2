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
holding (and billing) bytes (the streamed writers are in :mod:`~costguard.checkpoint.uploads`).
On GCS and Azure a large object goes up through the backend's chunked upload (resumable
upload, staged blocks), one block copied at a time. What differs per backend (options,
retry layers, which errors are transient) is in :mod:`~costguard.checkpoint.backends`, the
retry rule in :mod:`costguard.retry`.

It is over 500 lines because it is the one place where bytes cross to a store: each
operation needs its per-backend branch there (streamed and verified reads, chunked writes,
deadlines, the error translation); everything above it speaks only
``put``/``get``/``upload``/``verified_file``/``download``/``objects``/``delete``.

>>> import tempfile
>>> store = Store.open(tempfile.mkdtemp())
>>> store.put("a/b.txt", b"hello")
>>> store.get("a/b.txt"), store.listing()
(b'hello', {'a/b.txt': 5})
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from costguard import contract
from costguard.checkpoint import backends, uploads
from costguard.checkpoint.calls import StoreCalls
from costguard.checkpoint.manifest import ManifestError
from costguard.clouds import azure as azure_clouds
from costguard.clouds import require
from costguard.errors import (
    InputError,
    NoStoreError,
    NotAnObjectError,
    StoreError,
    TooLargeError,
)
from costguard.files import atomic_write
from costguard.logs import get_logger
from costguard.retry import RetryPolicy
from costguard.secrets import redact, redact_url, url_has_credentials

logger = get_logger(__name__)
EXTRA = "stores"  # the fsspec backends; torch is not needed to reach a store
T = TypeVar("T")
#: ``progress(done, total)``: bytes of a long read, for a progress bar.
Progress = Callable[[int, int], None]

#: Restores read an object in chunks of this size (hashing as they go), S3 in this many
#: concurrent ranged GETs of twice that.
READ_CHUNK = 4 * 2**20
READ_STREAMS = 4
#: The environment variable that holds fsspec options for the store, as a JSON object.
ENV_STORAGE_OPTIONS = contract.ENV_STORAGE_OPTIONS


def storage_options_from_env(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The fsspec options in ``COSTGUARD_STORAGE_OPTIONS`` (a JSON object), or ``None``.

    >>> storage_options_from_env({"COSTGUARD_STORAGE_OPTIONS": '{"anon": true}'})
    {'anon': True}
    >>> storage_options_from_env({"COSTGUARD_STORAGE_OPTIONS": "{anon"})
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: COSTGUARD_STORAGE_OPTIONS (5 characters) is not a JSON object
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
        # Not a word of it is shown: these options are where the store's keys are.
        msg = f"{ENV_STORAGE_OPTIONS} ({len(text)} characters) is not a JSON object"
        raise InputError(msg, hint=f"e.g. {ENV_STORAGE_OPTIONS}='{{\"anon\": false}}'")
    return options


def open_filesystem(
    text: str, storage_options: Mapping[str, Any] | None, *, what: str = "checkpoint URL"
) -> tuple[Any, str]:
    """The fsspec filesystem of the URL or path ``text`` and the path in it, opened as
    stores are: bounded timeouts, one retry layer, ``storage_options`` over the defaults
    (``costguard spend`` reads buckets through it too, ``what`` naming the URL's use).

    Raises :class:`InputError` for options the backend refuses and
    :class:`~costguard.errors.MissingDependencyError` when the backend is not installed.
    """
    scheme = text.split("://", 1)[0] if "://" in text else "file"
    backend = backends.PROTOCOLS[scheme]
    backends.check_key_parts(text)  # before anything goes out
    if backend is not None:
        require(backend, EXTRA)
    if backend == "adlfs":
        backends.check_azure_account(storage_options or {}, os.environ)
        azure_clouds.quiet_identity()
    if backend == "gcsfs":
        backends.check_google_credentials(storage_options or {}, os.environ)
    fsspec_core = require("fsspec.core", EXTRA)
    options = dict(backends.default_options(scheme))
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
            if scheme in ("s3", "s3a"):
                options = dict(backends.s3_session_options(options))
            fs, root = fsspec_core.url_to_fs(text, **options)
    except (ValueError, TypeError, ImportError) as exc:
        msg = f"cannot use the {what} {redact_url(text)[:200]!r}: {redact(str(exc))}"
        raise InputError(msg, hint="check the URL and its storage options") from None
    if scheme in ("s3", "s3a"):
        # One retry layer, ours (jittered, bounded): s3fs's own 5 attempts per call
        # multiplied with ours would stall a failing save for minutes.
        fs.retries = 1
    if scheme in ("az", "abfs", "abfss"):
        backends.one_retry_layer_azure(fs)
    if scheme in ("gs", "gcs"):
        backends.one_retry_layer_gcs(fs)
    return fs, root


class Store(StoreCalls):
    """One checkpoint root in one fsspec filesystem. Paths are relative to the root."""

    #: Local folders :meth:`open` created, the deepest first (:meth:`remove_if_unused`).
    made_dirs: tuple[Path, ...] = ()

    def __init__(
        self,
        fs: Any,
        root: str,
        url: str,
        *,
        retry: RetryPolicy | None = None,
        parts: uploads.PartLimits | None = None,
    ) -> None:
        super().__init__(fs, root, url, retry=retry)
        own = uploads.PartLimits.of(self.backend)
        #: How large objects are cut into parts: the backend's own limits, or the lower
        #: ones given (:class:`~costguard.checkpoint.uploads.PartLimits`).
        self.parts = own if parts is None else parts.within(own)

    @classmethod
    def open(
        cls,
        url: str | os.PathLike[str],
        storage_options: Mapping[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
        create: bool = True,
        parts: uploads.PartLimits | None = None,
    ) -> Store:
        """The store at ``url``; a plain path is a local folder (created if missing, with
        ``create``; without it a missing folder is a :class:`StoreError`). ``parts``:
        limits on the parts of large objects lower than the backend's (see
        :class:`~costguard.checkpoint.uploads.PartLimits`); by default its own.

        Raises :class:`InputError` for what looks like a URL but is not one
        (:func:`~costguard.checkpoint.backends.check_url`), a URL that carries credentials
        (they belong in the environment, not in a URL that is logged and passed on), or
        part limits the backend does not allow, and
        :class:`~costguard.errors.MissingDependencyError` when its fsspec backend is not
        installed. Nothing touches the store before these checks.
        """
        text = os.fspath(url)
        backends.check_url(text)  # a mistyped URL is not a local folder
        scheme = text.split("://", 1)[0] if "://" in text else "file"
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
        if backends.PROTOCOLS[scheme] is not None and not text.split("://", 1)[1].split("/", 1)[0]:
            msg = f"the checkpoint URL {text[:200]!r} names no bucket or container"
            raise InputError(msg, hint=f"e.g. {scheme}://my-bucket/run1")
        if parts is not None:
            parts.within(uploads.PartLimits.of(backends.backend_name(text)))
        fs, root = open_filesystem(text, storage_options)
        backend = backends.PROTOCOLS[scheme]
        made: tuple[Path, ...] = ()
        if backend is None:
            if Path(root).exists() and not Path(root).is_dir():
                msg = f"{text[:200]} is a file, not a folder: a local checkpoint store is a folder"
                raise InputError(msg, hint="name a folder (it is made if missing)")
            if create:
                # A missing local root is created; if that fails, check_writable says why.
                made = tuple(p for p in (Path(root), *Path(root).parents) if not p.exists())
                with contextlib.suppress(OSError):
                    Path(root).mkdir(parents=True, exist_ok=True)
            elif not Path(root).is_dir():
                msg = f"no checkpoint store at {text[:200]}: the folder does not exist"
                raise NoStoreError(msg, hint="check the path (nothing was created)")
        store = cls(fs, root, text, retry=retry, parts=parts)
        store.made_dirs = made
        return store

    def child(self, name: str) -> Store:
        """The store at ``name`` under this one, through this one's filesystem (its
        session and connections: an array's thousand task prefixes are one client's, not
        a thousand). ``name`` is one folder name, never ``..``.

        >>> import tempfile
        >>> store = Store.open(tempfile.mkdtemp())
        >>> store.child("task-3").url.endswith("/task-3")
        True
        >>> store.child("../elsewhere")
        Traceback (most recent call last):
        ...
        costguard.errors.InputError: '../elsewhere' is not a folder name under ...
        """
        if not name or name in (".", "..") or "/" in name or "\\" in name:
            msg = f"{name!r} is not a folder name under {self.url}"
            raise InputError(msg, hint="one name, e.g. task-3")
        url = f"{self.url.rstrip('/')}/{name}"
        return type(self)(self.fs, self.full(name), url, retry=self.retry, parts=self.parts)

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
    def upload(self, path: str, *, hash_aside: bool = True) -> Iterator[uploads.Upload]:
        """Write one object from a stream: ``torch.save(state, upload)`` inside the block.

        On S3 the bytes go up while they are produced, in parts as :attr:`parts` says:
        each full part is hashed (in a worker thread, in order) and sent while the producer
        goes on, at most ``PARTS_IN_FLIGHT`` parts held in memory. In a local folder they
        go straight into a temporary file, hashed on the way, which is synced and renamed
        at the end: no copy of the whole object is held in memory. Elsewhere they collect
        in memory and are written at the end of the block. The object exists (complete)
        only once the block has ended without an error; on an error nothing is written
        and a started multipart upload is aborted. Afterwards ``upload.size`` and
        ``upload.sha256`` describe it. ``hash_aside=False`` keeps a local write's hashing
        on the writing thread (see :class:`~costguard.checkpoint.uploads.LocalUpload`).
        """
        streamed: uploads.S3Upload | uploads.LocalUpload | None = None
        if self.is_s3:
            streamed = uploads.S3Upload(self, path, hashlib.sha256(), limits=self.parts)
        elif self.is_local:
            streamed = self.translate(
                f"writing {path}",
                lambda: uploads.LocalUpload(self.full(path), hash_aside=hash_aside),
            )
        if streamed is not None:
            try:
                yield streamed
                self.translate(f"writing {path}", streamed.finish)
            except BaseException:
                streamed.abort()
                if streamed.failure is not None:
                    # torch.save reports a failed write as its own RuntimeError ("unexpected
                    # pos"): the store's error is the one that says what went wrong.
                    raise streamed.failure from None
                raise
            return
        buffered = uploads.Upload()
        yield buffered
        buffered.sha256 = self.put_hashed(path, buffered.buffer.getbuffer())

    def write_stream(
        self, path: str, produce: Callable[[uploads.Upload], None], *, hash_aside: bool = True
    ) -> tuple[int, str]:
        """Write one object from what ``produce(file)`` writes; its size and sha256.

        :meth:`upload` with a retry that fits each store: S3 retries each part alone;
        a local write that fails transiently is produced again from the start (into a
        fresh temporary file); elsewhere the bytes are buffered, then put with retries.
        """

        def once() -> tuple[int, str]:
            with self.upload(path, hash_aside=hash_aside) as upload:
                produce(upload)
            return upload.size, upload.sha256

        if self.is_local:
            return self.call(f"writing {path}", once)
        return once()

    def _put(self, path: str, data: bytes | memoryview, digest: Any) -> None:
        target = self.full(path)
        view = memoryview(data).cast("B")
        if self.is_s3 and view.nbytes > self.parts.part_bytes:
            upload = uploads.S3Upload(self, path, digest, size=view.nbytes, limits=self.parts)
            try:
                # No outer retry: every call of the upload retries on its own.
                self.translate(f"writing {path}", lambda: upload.write(view))
                self.translate(f"writing {path}", upload.finish)
            except BaseException:
                upload.abort()
                raise
            return
        if digest is not None:
            digest.update(view)
        if self.is_local:
            self.call(f"writing {path}", lambda: _write_local(target, view))
        elif view.nbytes > self.parts.part_bytes:
            self.call(f"writing {path}", lambda: self._write_in_blocks(target, view))
        else:
            self.call(f"writing {path}", lambda: self.fs.pipe_file(target, bytes(view)))

    def _write_in_blocks(self, target: str, view: memoryview) -> None:
        """Write a large object through the backend's own chunked upload (GCS: a resumable
        upload; Azure: staged blocks committed at the end), a block at a time: at least
        the store's part size, larger where its block count needs it (:attr:`parts`), and
        an error before any write past its object limit.

        ``pipe_file`` wants one ``bytes``: a copy of the whole object made with the GIL
        held, which would stop the training thread for as long as it takes and double the
        memory. Here only one block at a time is copied. The object appears only when the
        upload completes; on an error the upload is cancelled where the backend can
        (gcsfs), and never completed.
        """
        block = uploads.part_size(view.nbytes, target, self.parts)
        file = self.fs.open(target, "wb", block_size=block)
        try:
            for start in range(0, view.nbytes, block):
                file.write(view[start : start + block])
        except BaseException:
            with contextlib.suppress(Exception):
                file.discard()
            file.closed = True  # so that garbage collection does not complete it
            raise
        file.close()

    def abort_stale_uploads(
        self, grace_s: float = uploads.UPLOAD_GRACE_S, *, now_unix: float | None = None
    ) -> list[str]:
        """Abort incomplete S3 multipart uploads under the root older than ``grace_s``
        (:func:`~costguard.checkpoint.uploads.abort_stale`); the keys aborted."""
        return uploads.abort_stale(self, grace_s, now_unix=now_unix)

    def get(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read one whole object (one GET: faster than ranged reads on most stores).

        ``max_bytes``: the most it may hold; a longer object is refused after that many
        bytes and one more are read (:class:`StoreError`), never read whole."""

        def read() -> bytes:
            full = self.full(path)
            self._regular(path, full)
            if max_bytes is None:
                return bytes(self.fs.cat_file(full))
            try:
                return bytes(self.fs.cat_file(full, start=0, end=max_bytes + 1))
            except FileNotFoundError:
                raise
            except Exception:
                # The first bytes of an empty object are a range S3, GCS and Azure cannot
                # satisfy (HTTP 416, each its own error): that object is empty, not
                # unreadable.
                if self.fs.size(full) == 0:
                    return b""
                raise

        data = self.call(f"reading {path}", read)
        if max_bytes is not None and len(data) > max_bytes:
            msg = f"reading {path} on {self.url}: more than {max_bytes} bytes"
            raise TooLargeError(msg, hint="not what costguard writes; see what else writes there")
        return data

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
        ``progress(done, total)`` hears of the bytes read (downloaded; for a local
        store, hashed), ``total`` being the object's size.
        """
        report = progress or (lambda done, total: None)
        if self.is_local:
            local = self.full(path)
            self._regular(path, local)
            self.call(
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
            # The bar counts the object's bytes as they arrive (the local re-read that
            # hashes them is quick and not counted: a bar out of twice the size misled).
            self._download(path, tmp, size, lambda done, _: report(done, size))
            self._check_file(path, tmp, size, sha256)
            yield tmp
        finally:
            Path(tmp).unlink(missing_ok=True)

    def download(self, path: str, target: str | os.PathLike[str], size: int, sha256: str) -> None:
        """Object ``path`` into the local file ``target``, checked as by
        :meth:`verified_file` (:class:`ManifestError` for a size or hash that does not
        match). From a store elsewhere it streams straight into ``target`` and is hashed
        as it is read back: no temporary copy is written and read again beside it. On an
        error ``target`` may hold part of the object: the caller removes it."""
        if self.is_local:
            with self.verified_file(path, size, sha256) as local:
                shutil.copyfile(local, target)
            return
        self._download(path, os.fspath(target), size, lambda done, total: None)
        self._check_file(path, os.fspath(target), size, sha256)

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
            self.call(
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
            self.call(f"reading {path}", lambda: self.fs.get_file(full, local, callback=callback))
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
        self._regular(path, full)
        return self.call(
            f"reading {path}", lambda: bytes(self.fs.cat_file(full, start=start, end=end))
        )

    def _regular(self, path: str, full: str) -> None:
        """Refuse to read a local store's ``path`` that is no regular file (a link is
        followed): opening a FIFO someone left there waits for a writer forever, a
        device reads without end. A missing path is left to the read that follows."""
        if not self.is_local:
            return
        try:
            mode = Path(full).stat().st_mode
        except OSError:
            return
        if not stat.S_ISREG(mode):
            msg = f"{path} on {self.url} is not a regular file: never read"
            raise NotAnObjectError(msg, hint="see what else writes to the store")

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
            if self.is_local:
                return _local_objects(self.root)
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
                    when = backends.modified_unix(info)
                    if when is not None:
                        modified[relative] = when
            return sizes, modified

        return self.call("listing", find)

    def digests(self) -> dict[str, str]:
        """Every object under the root whose store gives the MD5 of its content in a
        listing (S3, GCS, Azure Blob): relative path -> that MD5 in hex; none on this machine's disk
        (reading a file there costs what hashing it would)."""

        def find() -> dict[str, str]:
            if self.is_local:
                return {}
            self.fs.invalidate_cache()
            try:
                found = self.fs.find(self.root, detail=True)
            except FileNotFoundError:
                return {}
            prefix = self.fs._strip_protocol(self.root).rstrip("/") + "/"
            out = {}
            for path, info in found.items():
                stripped = self.fs._strip_protocol(path)
                md5 = backends.content_md5(info)
                if stripped.startswith(prefix) and md5 is not None:
                    out[stripped[len(prefix) :]] = md5
            return out

        return self.call("listing", find)

    def delete(self, paths: Iterable[str]) -> None:
        """Delete objects, in the order given (missing ones are fine)."""
        for path in paths:
            target = self.full(path)

            def remove(target: str = target) -> None:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(target)

            self.call(f"deleting {path}", remove)
        if self.is_local:
            _prune_empty_local_dirs(self.root)

    def remove_if_unused(self) -> None:
        """Remove the local folders :meth:`open` created, as long as they are empty: a
        launch declined at its confirmation leaves nothing behind."""
        for folder in self.made_dirs:
            try:
                folder.rmdir()  # only an empty folder
            except OSError:
                return

    def check_exists(self) -> None:
        """:class:`StoreError` unless the folder (local), or the bucket/container and
        something under the URL's prefix, exists; for commands that only read, and must not
        create what they look at (a listing of an empty prefix is a missing store, as a
        missing folder is)."""
        if self.is_local:
            found = Path(self.root).is_dir()
        else:
            where = self.fs._strip_protocol(self.root).rstrip("/")
            bucket = where.split("/", 1)[0]

            def probe() -> bool:  # not fs.exists: it answers False for any error
                try:
                    self.fs.info(bucket)
                    if where != bucket:  # a prefix exists while something is stored under it
                        self.fs.info(where)
                except FileNotFoundError:
                    return False
                return True

            found = self.call("looking for the bucket", probe)
        if not found:
            msg = f"no checkpoint store at {self.url}: it does not exist"
            raise NoStoreError(msg, hint="check the URL (nothing was created)")

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
                hint = backends.REACH_HINTS[self.backend]
                msg = f"cannot write checkpoints to {self.url}: {exc.message}"
            raise InputError(msg, hint=hint) from exc
        finally:
            self.deadline_unix = saved_deadline


def _write_local(target: str, data: bytes | memoryview) -> None:
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, data)


def _local_objects(root: str) -> tuple[dict[str, int], dict[str, float]]:
    """What ``fs.find`` lists of a local folder (sizes and mtimes of its files, symlinked
    folders not followed), read with ``os.scandir``: a sixth of fsspec's time on 20,000
    checkpoint folders."""
    sizes: dict[str, int] = {}
    modified: dict[str, float] = {}
    pending = [("", root)]
    while pending:
        relative, folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):  # gone meanwhile, or not a folder
            continue
        for entry in entries:
            name = relative + entry.name
            if entry.is_dir(follow_symlinks=False):
                pending.append((f"{name}/", entry.path))
            elif entry.is_file():
                status = entry.stat()
                sizes[name], modified[name] = status.st_size, status.st_mtime
    return sizes, modified


def _prune_empty_local_dirs(root: str) -> None:
    base = Path(root)
    for child in base.iterdir() if base.is_dir() else ():
        if child.is_dir():
            with contextlib.suppress(OSError):
                child.rmdir()  # only succeeds when empty
