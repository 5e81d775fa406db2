"""Objects written as a stream: a local file synced and renamed at the end, an S3
multipart upload whose parts go up while the writer produces the next, or (elsewhere) a
buffer put whole; and the sweep that aborts the S3 uploads a killed writer left behind.

These are :meth:`Store.upload <costguard.checkpoint.store.Store.upload>`'s tools; only
the store creates them.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import hashlib
import io
import os
import threading
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from costguard.checkpoint import backends, memcopy
from costguard.checkpoint.calls import StoreCalls
from costguard.clouds import require
from costguard.errors import InputError, StoreError
from costguard.files import fsync_dir
from costguard.logs import get_logger
from costguard.secrets import redact

logger = get_logger(__name__)
EXTRA = "stores"  # the fsspec backends; torch is not needed to reach a store
T = TypeVar("T")

#: S3 multipart: objects larger than one part go up in parts of at least this size, this
#: many in flight at once; larger parts where the object needs them (:func:`part_size`,
#: :func:`streamed_part_size`) so that no object needs more than S3's 10,000 parts.
PART_BYTES = 16 * 2**20
PARTS_IN_FLIGHT = 8
MAX_PARTS = 10_000
#: S3's largest part and largest object.
MAX_PART_BYTES = 5 * 2**30
MAX_OBJECT_BYTES = 5 * 2**40
#: How long a writer waits for a free part slot before giving up (parts have timeouts).
PART_WAIT_S = 900.0
#: An incomplete multipart upload older than this belongs to a writer that is gone.
UPLOAD_GRACE_S = 900.0


#: The smallest part S3 takes (every part but the last); GCS wants chunks in 256 KiB steps.
S3_MIN_PART_BYTES = 5 * 2**20
PART_STEP_BYTES = 256 * 2**10


@dataclass(frozen=True)
class PartLimits:
    """How a store cuts a large object into parts: parts of at least ``part_bytes`` (an
    object larger than that goes up in parts), at most ``max_parts`` of them (None: no
    limit) and objects of at most ``max_object_bytes``; ``backend`` names whose limits
    they are in errors. The defaults are S3's (:meth:`of` gives each backend's).

    A store takes lower limits than its backend's (an S3-compatible service with smaller
    ones; a test that wants several parts of a small object), never higher ones:
    :meth:`within`. Bad values are an :class:`InputError` here, before any store is used.

    >>> PartLimits(part_bytes=5 * 2**20, max_parts=4).max_parts
    4
    >>> PartLimits(part_bytes=1000)
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: part_bytes=1000 is not a multiple of 256 KiB
    """

    part_bytes: int = PART_BYTES
    max_parts: int | None = MAX_PARTS
    max_object_bytes: int = MAX_OBJECT_BYTES
    backend: str = "S3"

    def __post_init__(self) -> None:
        hint = "e.g. PartLimits(part_bytes=16 * 2**20, max_parts=10_000)"
        for name in ("part_bytes", "max_parts", "max_object_bytes"):
            value = getattr(self, name)
            if value is None and name == "max_parts":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                msg = f"{name}={value!r} is not a whole number of bytes or parts above 0"
                raise InputError(msg, hint=hint)
        if self.part_bytes % PART_STEP_BYTES:
            msg = f"part_bytes={self.part_bytes} is not a multiple of 256 KiB"
            raise InputError(msg, hint=hint)
        if self.part_bytes > MAX_PART_BYTES:
            msg = f"part_bytes={self.part_bytes} is over the largest part, 5 GiB"
            raise InputError(msg, hint=hint)

    @classmethod
    def of(cls, backend: str) -> PartLimits:
        """The limits of a backend (``s3``, ``gcs``, ``azure``: ``backends.PART_LIMITS``);
        a local folder has none but the defaults' part size.

        >>> PartLimits.of("azure").max_parts, PartLimits.of("gcs").max_parts
        (50000, None)
        """
        if backend not in backends.PART_LIMITS:
            return cls(max_parts=None, backend=backend.upper())
        max_parts, max_object = backends.PART_LIMITS[backend]
        return cls(max_parts=max_parts, max_object_bytes=max_object, backend=backend.upper())

    def within(self, own: PartLimits) -> PartLimits:
        """These limits for the backend whose own limits are ``own``; an
        :class:`InputError` where they ask for more than it allows (parts below S3's
        5 MiB, more parts or a larger object than the backend takes).

        >>> PartLimits(max_parts=20_000).within(PartLimits.of("s3"))
        Traceback (most recent call last):
        ...
        costguard.errors.InputError: max_parts=20000 is more than S3 allows (10000)
        """
        hint = "lower limits than the backend's, or none (its own)"
        if own.max_parts is not None and (self.max_parts is None or self.max_parts > own.max_parts):
            msg = f"max_parts={self.max_parts} is more than {own.backend} allows ({own.max_parts})"
            raise InputError(msg, hint=hint)
        if self.max_object_bytes > own.max_object_bytes:
            msg = (
                f"max_object_bytes={self.max_object_bytes} is more than {own.backend} allows "
                f"({own.max_object_bytes})"
            )
            raise InputError(msg, hint=hint)
        if own.backend == "S3" and self.part_bytes < S3_MIN_PART_BYTES:
            msg = f"part_bytes={self.part_bytes} is below S3's smallest part (5 MiB)"
            raise InputError(msg, hint="part_bytes=5 * 2**20 or more")
        return PartLimits(self.part_bytes, self.max_parts, self.max_object_bytes, own.backend)


#: S3's limits, the default of :func:`part_size` and :func:`streamed_part_size`.
S3_LIMITS = PartLimits()


def part_size(size: int, path: str, limits: PartLimits = S3_LIMITS) -> int:
    """The part size for an object of ``size`` bytes: ``limits.part_bytes``, or the
    smallest whole number of MiB that keeps it within ``limits.max_parts`` parts. A
    :class:`StoreError` before any byte is sent when the object is larger than the
    limits allow (``max_object_bytes``).

    >>> part_size(100 * 2**20, "a"), part_size(208 * 10**9, "b") // 2**20
    (16777216, 20)
    """
    if size > limits.max_object_bytes:
        msg = (
            f"{path} is {size / 2**40:.2f} TiB; {limits.backend} stores objects of at most "
            f"{limits.max_object_bytes / 2**40:.1f} TiB"
        )
        raise StoreError(msg, hint="save the state in several objects (a sharded save)")
    if not limits.max_parts:
        return limits.part_bytes
    mib = -(-size // (limits.max_parts * 2**20))  # ceiling
    return max(limits.part_bytes, mib * 2**20)


def streamed_part_size(number: int, limits: PartLimits = S3_LIMITS) -> int:
    """The size of part ``number`` of an object whose size is not known in advance (a
    stream): ``limits.part_bytes``, doubled every tenth of ``limits.max_parts`` parts, at
    most :data:`MAX_PART_BYTES`; 10,000 such parts of S3 hold about 12.9 TiB, more than
    its 5 TiB.

    >>> [streamed_part_size(n) // 2**20 for n in (1, 1000, 1001, 2001, 9001)]
    [16, 16, 32, 64, 5120]
    """
    doubling = (number - 1) // max(1, (limits.max_parts or MAX_PARTS) // 10)
    return int(min(MAX_PART_BYTES, limits.part_bytes * 2**doubling))


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
        """Append ``data``; returns its length in bytes. The caller may change or reuse
        ``data`` as soon as this returns (torch.save reuses its buffers)."""
        return self._append(data, held=False)

    def write_held(self, data: Any) -> int:
        """Append ``data`` that the caller leaves unchanged until the upload has ended
        (the tensors of a synchronous save): an upload may then hash it in the
        background, past this call, where :meth:`write` must finish first."""
        return self._append(data, held=True)

    def _append(self, data: Any, *, held: bool) -> int:
        try:
            n = self._write(data, held=held)
        except BaseException as exc:
            if self.failure is None:
                self.failure = exc
            raise
        self.size += n
        return n

    def _write(self, data: Any, *, held: bool) -> int:
        return self.buffer.write(data)

    @property
    def stored(self) -> int:
        """Bytes in the store so far (here: in the buffer, or the local file)."""
        return self.size

    def writable(self) -> bool:
        """A file-like object for ``torch.save``."""
        return True

    def flush(self) -> None:
        """Nothing to flush: the bytes go out in parts, or at the end."""


class LocalUpload(Upload):
    """One local file written from a stream: hashed as written, atomic at :meth:`finish`.

    The bytes go to a temporary file beside the target, unbuffered, a chunk at a time.
    With ``hash_aside`` (for a save that training waits for), a big write (a held one
    from :attr:`HELD_BYTES`) is hashed on a second thread while this one writes it (both
    release the GIL). A :meth:`write` returns once its bytes are hashed, so that the
    caller may reuse its buffer; a :meth:`~Upload.write_held` returns once they are
    written, and its hash runs on while the next bytes are written and while
    :meth:`finish` syncs the file: the sha256 then costs the save no wall time of its
    own where a core is free or the disk is the slower part. Without it (a save in the
    background of training) every byte is hashed on this thread: the save takes one
    core, not two, from the training beside it.
    """

    CHUNK = 1 << 20
    #: A :meth:`write` at least this large is hashed on the second thread (in chunks,
    #: each hashed while the next is written); a smaller one here.
    PIPELINE_BYTES = 4 << 20
    #: A held write at least this large is hashed on the second thread (it need not wait
    #: for its hash); a smaller one, not worth the hand-over, here or behind those.
    HELD_BYTES = 64 << 10

    def __init__(self, target: str, *, hash_aside: bool = True) -> None:
        super().__init__()
        self.hash_aside = hash_aside
        self.path = Path(target)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{uuid.uuid4().hex[:8]}")
        self.digest = hashlib.sha256()
        self.file = self.tmp.open("wb", buffering=0)
        self._hasher: concurrent.futures.ThreadPoolExecutor | None = None
        self._hashed: concurrent.futures.Future[None] | None = None

    def _write(self, data: Any, *, held: bool) -> int:
        view = memoryview(data).cast("B")
        aside = view.nbytes >= (self.HELD_BYTES if held else self.PIPELINE_BYTES)
        if self._hashed is not None and not aside:
            # Hashes of held bytes are still running: a small write joins their queue
            # (a copy of it, unless held), rather than this call waiting for all of them.
            if not held:
                view, held = memoryview(bytes(view)), True
            aside = True
        if not (self.hash_aside and aside):
            self.digest.update(view)
            self._write_all(view)
            return view.nbytes
        if self._hasher is None:
            self._hasher = concurrent.futures.ThreadPoolExecutor(1, "costguard-sha256")
        try:
            for start in range(0, view.nbytes, self.CHUNK):
                chunk = view[start : start + self.CHUNK]
                # One worker: chunks are hashed in the order they are submitted.
                self._hashed = self._hasher.submit(self.digest.update, chunk)
                self._write_all(chunk)
        finally:
            if not held:
                self._wait_hashed()
        return view.nbytes

    def _write_all(self, view: memoryview) -> None:
        written = 0
        while written < view.nbytes:  # a raw write may take fewer bytes
            written += self.file.write(view[written:]) or 0

    def _wait_hashed(self) -> None:
        """Wait until every byte written so far is hashed (the last chunk submitted)."""
        if self._hashed is not None:
            self._hashed.result()
            self._hashed = None

    def finish(self) -> None:
        """Make the file durable (its hash completing meanwhile), then visible under its
        name (and the rename durable)."""
        os.fsync(self.file.fileno())
        self._wait_hashed()
        self._stop_hasher()
        self.file.close()
        self.tmp.replace(self.path)
        fsync_dir(self.path.parent)
        self.sha256 = self.digest.hexdigest()

    def abort(self) -> None:
        """Drop the temporary file (never raises)."""
        self._stop_hasher()
        with contextlib.suppress(OSError):
            self.file.close()
        self.tmp.unlink(missing_ok=True)

    def _stop_hasher(self) -> None:
        if self._hasher is not None:
            self._hasher.shutdown(wait=True)
            self._hasher = None


class S3Upload(Upload):
    """One S3 multipart upload fed by writes: full parts go up concurrently, each retried
    alone and checked by S3 (CRC32), while the writer produces the next.

    Threads: the writer's thread fills parts (big writes copied without the GIL, into
    buffers reused once sent); fsspec's event loop sends them; one worker hashes them in
    order, and computes each one's CRC32 (see :func:`part_checksum`). The multipart
    upload starts with the first full part, so an object smaller than a part is one
    plain PUT.
    """

    def __init__(
        self,
        store: StoreCalls,
        path: str,
        digest: Any,
        size: int | None = None,
        *,
        limits: PartLimits = S3_LIMITS,
    ) -> None:
        super().__init__()
        self.limits = limits
        #: The part size when the object's size is known (every part but the last),
        #: else each part's size follows :func:`streamed_part_size`.
        self._fixed = part_size(size, path, limits) if size is not None else None
        self._total = 0
        self.store = store
        self.path = path
        self.target = store.full(path)
        self.bucket, self.key, _ = store.fs.split_path(self.target)
        self.digest = digest
        # The part being filled, its address and how full it is; sent parts come back to
        # ``_free`` once sent and hashed, so an upload allocates (and zero-fills) at most
        # about PARTS_IN_FLIGHT + 2 buffers, whatever its size.
        self._part: bytearray | None = None
        self._address = 0
        self._fill = 0
        self._free: list[bytearray] = []
        self._lock = threading.Lock()
        self._number = 0
        self._upload_id: str | None = None
        self._slots = threading.BoundedSemaphore(PARTS_IN_FLIGHT)
        self._sent: list[concurrent.futures.Future[dict[str, Any]]] = []
        self._hasher = concurrent.futures.ThreadPoolExecutor(1, "costguard-sha256")
        self._hashed: list[concurrent.futures.Future[str]] = []
        self._stored = 0

    @property
    def stored(self) -> int:
        """Bytes S3 has accepted so far (the parts sent; the writes run ahead of them)."""
        return self._stored

    def _write(self, data: Any, *, held: bool) -> int:
        view = memoryview(data).cast("B")
        n, offset = view.nbytes, 0
        while offset < n:
            if self._part is None:
                self._take_buffer()
                assert self._part is not None
            take = view[offset : offset + len(self._part) - self._fill]
            memcopy.copy_into(self._part, self._address, self._fill, take)
            self._fill += take.nbytes
            offset += take.nbytes
            if self._fill == len(self._part):
                self._send_part()
        return n

    def _take_buffer(self) -> None:
        size = self._fixed or streamed_part_size(self._number + 1, self.limits)
        with self._lock:
            # Buffers of a smaller size (a stream's earlier parts) are let go.
            self._free = [b for b in self._free if len(b) == size]
            part = self._free.pop() if self._free else bytearray(size)
        self._part, self._address, self._fill = part, memcopy.writable_address(part), 0

    def _returns(self, part: bytearray, uses: int) -> Callable[[object], None]:
        """A callback that gives ``part`` back to the pool after its ``uses``-th call."""
        left = [uses]

        def done(_: object) -> None:
            with self._lock:
                left[0] -= 1
                if left[0] == 0:
                    self._free.append(part)

        return done

    def _body(self) -> bytes | bytearray:
        """The part filled so far, taken out of the upload: a full part is sent as it is,
        a last, shorter one as a copy of its bytes."""
        part, fill = self._part, self._fill
        self._part, self._fill = None, 0
        if part is None:
            return b""
        return part if fill == len(part) else bytes(memoryview(part)[:fill])

    def _call(self, action: str, method: str, **kwargs: Any) -> Any:
        """One S3 call (with retries) on the event loop, from the writer's thread."""
        fs = self.store.fs

        async def call() -> Any:
            return await fs._call_s3(method, Bucket=self.bucket, Key=self.key, **kwargs)

        return sync(fs, self.store.with_retries_async(f"{action} {self.path}", call))

    def _raise_failed(self) -> None:
        for future in self._sent:
            if future.done() and future.exception() is not None:
                future.result()  # raises the part's StoreError

    def _send_part(self) -> None:
        body = self._body()
        self._number += 1
        self._total += len(body)
        limits = self.limits
        if self._total > limits.max_object_bytes:  # a stream: its size shows only now
            part_size(self._total, self.path, limits)  # raises, naming the object limit
        if limits.max_parts and self._number > limits.max_parts:  # the sizes above keep
            # within the limit: a last guard
            msg = f"{self.path} needs more than {limits.backend}'s {limits.max_parts} parts"
            raise StoreError(msg, hint="save the state in several objects (a sharded save)")
        # A full part's buffer is reused once it has been hashed and sent.
        done = self._returns(body, 2) if isinstance(body, bytearray) else None
        # The part's CRC32 (and its share of the sha256) is computed on the hashing
        # thread, not on the event loop that sends every part.
        hashed = self._hasher.submit(self._checksum, body)
        if done is not None:
            hashed.add_done_callback(done)
        self._hashed.append(hashed)
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
            self._send(self._number, body, hashed), self.store.fs.loop
        )
        future.add_done_callback(lambda _: self._slots.release())
        if done is not None:
            future.add_done_callback(done)
        self._sent.append(future)

    def _checksum(self, body: bytes | bytearray) -> str:
        """Add ``body`` to the sha256 (parts come here in order) and return its CRC32 as
        S3 writes it (base64 of the 4 big-endian bytes)."""
        if self.digest is not None:
            self.digest.update(body)
        return base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()

    async def _send(
        self, number: int, body: bytes | bytearray, checksum: concurrent.futures.Future[str]
    ) -> dict[str, Any]:
        fs = self.store.fs
        crc32 = await asyncio.wrap_future(checksum)
        given = part_checksum(fs.s3.meta.endpoint_url, crc32)

        async def call() -> dict[str, Any]:
            answer: dict[str, Any] = await fs._call_s3(
                "upload_part",
                Bucket=self.bucket,
                Key=self.key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=body,
                **given,
            )
            return answer

        answer = await self.store.with_retries_async(
            f"uploading part {number} of {self.path}", call
        )
        with self._lock:
            self._stored += len(body)
        return {"PartNumber": number, "ETag": answer["ETag"], "ChecksumCRC32": crc32}

    def finish(self) -> None:
        """Send the last part and complete the upload (or PUT a small object whole)."""
        if self._upload_id is None:
            body = bytes(self._body())
            if self.digest is not None:
                self.digest.update(body)
            self.store.call(
                f"writing {self.path}", lambda: self.store.fs.pipe_file(self.target, body)
            )
            self._stored = len(body)
        else:
            if self._fill:
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
                sync(
                    self.store.fs,
                    abort_upload(self.store, self.bucket, self.key, self._upload_id),
                )
        self._upload_id = None


def part_checksum(endpoint_url: str, crc32: str) -> dict[str, str]:
    """How a part's CRC32 goes with it, so that botocore hashes as little of the part as
    it can on the event loop that sends every part.

    Over plain http botocore signs the body with its sha256 whatever else it does, so the
    CRC32 computed on the hashing thread goes along and botocore computes nothing more.
    Over https botocore leaves the body unsigned only when it computes the CRC32 itself,
    as a trailer while it streams the part (a CRC32 given here would make it sign the
    body: a sha256, three times the work)."""
    if endpoint_url.startswith("https:"):
        return {"ChecksumAlgorithm": "CRC32"}
    return {"ChecksumCRC32": crc32}


def sync(fs: Any, coroutine: Awaitable[T]) -> T:
    """Run ``coroutine`` on the fsspec filesystem's event loop and wait for it."""
    fsspec_asyn = require("fsspec.asyn", EXTRA)

    async def run() -> T:
        return await coroutine

    result: T = fsspec_asyn.sync(fs.loop, run)
    return result


async def abort_upload(store: StoreCalls, bucket: str, key: str, upload_id: str) -> bool:
    """Abort one multipart upload, best effort: a failure here is logged, not raised
    (:func:`abort_stale` gets another go later). Whether it was aborted."""
    try:
        await store.with_retries_async(
            f"aborting the upload of {key}",
            lambda: store.fs._call_s3(
                "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id
            ),
        )
    except Exception as exc:
        logger.warning(
            "could not abort the upload of %s on %s: %s", key, store.url, redact(str(exc))
        )
        return False
    return True


def abort_stale(
    store: StoreCalls, grace_s: float = UPLOAD_GRACE_S, *, now_unix: float | None = None
) -> list[str]:
    """Abort incomplete S3 multipart uploads under the root older than ``grace_s``.

    A writer killed mid-upload leaves its parts on S3, invisible to a listing but
    stored and billed, until someone aborts the upload. The grace period spares an
    upload another live writer may still be sending. Returns the keys aborted; does
    nothing on other stores (local writes are atomic; Azure drops uncommitted blocks
    and GCS its unfinished resumable uploads after about a week by itself).
    """
    if not store.is_s3:
        return []
    fs = store.fs
    bucket, prefix, _ = fs.split_path(store.full(""))
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    cutoff = (time.time() if now_unix is None else now_unix) - grace_s

    async def sweep() -> list[str]:
        aborted: list[str] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}

        async def page() -> dict[str, Any]:
            answer: dict[str, Any] = await fs._call_s3("list_multipart_uploads", **kwargs)
            return answer

        for _page in range(1000):  # bounded: 1000 pages of 1000 uploads
            answer = await store.with_retries_async("listing incomplete uploads", page)
            for upload in answer.get("Uploads", []):
                initiated = upload.get("Initiated")
                started = initiated.timestamp() if initiated is not None else 0.0
                if started <= cutoff and await abort_upload(
                    store, bucket, upload["Key"], upload["UploadId"]
                ):
                    aborted.append(upload["Key"])
            if not answer.get("IsTruncated"):
                break
            kwargs["KeyMarker"] = answer.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = answer.get("NextUploadIdMarker", "")
        return aborted

    aborted = store.translate("listing incomplete uploads", lambda: sync(fs, sweep()))
    for key in aborted:
        logger.info("aborted an incomplete upload of %s on %s", key, store.url)
    return aborted
