"""DCP's storage layer on a costguard Store: where the shards of a sharded checkpoint go.

:func:`storage_writer` and :func:`storage_reader` are ``torch.distributed.checkpoint``
``StorageWriter`` / ``StorageReader`` implementations that read and write through
:class:`~costguard.checkpoint.store.Store` (local, s3, gs, az, with its retries): each
rank streams its chunks, as raw bytes, into one object hashed on the way
(:func:`shard_object`); the coordinating rank writes DCP's index (:data:`METADATA`, loaded
back with ``weights_only=True``). With a :class:`~costguard.checkpoint.shard_pool.ShardPool`
a rank's frozen chunks go to the shared pool instead (``blobs/<sha256>``, one object per
chunk, written only when changed), and the index says so. The checkpoint logic on top
(the manifest, verification, fallback) is :mod:`costguard.checkpoint.sharded`.

torch is imported inside the functions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
import re
from collections.abc import Mapping
from typing import Any

from costguard.checkpoint import state as state_mod
from costguard.checkpoint.manifest import Manifest, ManifestError, ObjectEntry, UnreadableError
from costguard.checkpoint.shard_pool import ShardPool
from costguard.checkpoint.store import Store
from costguard.text import visible

#: DCP's index of every chunk (written by the coordinating rank).
METADATA = "dcp.metadata"


#: How many comparisons the overlap check of one tensor's chunks may make, per chunk: a
#: genuine index compares each chunk with one (rows or columns of ranks) or a few (a grid
#: of them is swept along its longer side: 32 x 32 ranks, 18 a chunk); a forged one made
#: to compare every pair is refused at this bound.
PAIRS_PER_CHUNK = 64

#: What :func:`shard_object` names: the only objects of a checkpoint (with the pool's)
#: that hold chunks.
_SHARD = re.compile(r"shard-\d{5,}\.distcp", re.ASCII)


def shard_object(rank: int) -> str:
    """The object one rank's shards go into.

    >>> shard_object(3)
    'shard-00003.distcp'
    """
    return f"shard-{rank:05d}.distcp"


def object_entry(manifest: Manifest, name: str) -> ObjectEntry:
    """The manifest's entry for object ``name``; :class:`ManifestError` if it lists none."""
    for entry in manifest.objects:
        if entry.name == name:
            return entry
    msg = f"the manifest of sharded checkpoint {manifest.name} lists no {name}"
    raise ManifestError(msg)


@dataclasses.dataclass(frozen=True)
class Stored:
    """Where one chunk of a DCP checkpoint lies: object (the manifest entry's name: a
    pool object's is its sha256), byte range, and for a tensor its dtype and shape (the
    bytes are raw). Kept in ``dcp.metadata``."""

    object: str
    offset: int
    length: int
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class _Written:
    """What one rank's ``write_data`` reports: the chunk, and its object's manifest entry."""

    stored: Stored
    entry: ObjectEntry


def _tensor_bytes(tensor: Any) -> memoryview:
    """A tensor's bytes, without a copy when it is a contiguous CPU tensor."""
    torch = state_mod._torch()
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


def _described(tensor: Any) -> tuple[str, tuple[int, ...]]:
    """A saved tensor chunk's dtype and shape, as :class:`Stored` keeps them."""
    return str(tensor.dtype), tuple(int(n) for n in tensor.shape)


def _narrow(tensor: Any, offsets: Any, lengths: Any) -> Any:
    """The part of a saved chunk one read asks for."""
    for dim, (start, length) in enumerate(zip(offsets, lengths, strict=True)):
        if tensor.size(dim) != length:
            tensor = tensor.narrow(dim, start, length)
    return tensor


def _dtype(name: str) -> Any:
    torch = state_mod._torch()
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        msg = f"unknown dtype {name[:40]!r}"
        raise ManifestError(msg)
    return dtype


def _safe_globals() -> list[Any]:
    """The classes ``dcp.metadata`` may hold (for ``torch.load(weights_only=True)``)."""
    torch = state_mod._torch()
    from torch.distributed.checkpoint import metadata as md

    return [
        md.Metadata,
        md.TensorStorageMetadata,
        md.BytesStorageMetadata,
        md.ChunkStorageMetadata,
        md.TensorProperties,
        md.MetadataIndex,
        md.StorageMeta,
        md._MEM_FORMAT_ENCODING,
        torch.Size,
        Stored,
    ]


def storage_writer(store: Store, folder: str, pool: ShardPool | None = None) -> Any:
    """A DCP ``StorageWriter`` that writes into checkpoint folder ``folder`` of ``store``.

    Each rank writes one object (:func:`shard_object`), streamed into the store and
    hashed on the way, but for the chunks ``pool`` takes (each a pool object); the
    coordinator writes ``dcp.metadata`` in ``finish``, after DCP has gathered every rank's
    results, and then knows every object's manifest entry (:attr:`objects`). Each rank's
    :attr:`written_bytes` counts what it wrote.
    """
    from torch.distributed.checkpoint import StorageWriter
    from torch.distributed.checkpoint.planner import WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future

    class _Writer(StorageWriter):
        def __init__(self) -> None:
            super().__init__()
            self.is_coordinator = False
            #: Every object of the checkpoint but the manifest (on the coordinator, after
            #: ``finish``).
            self.objects: list[ObjectEntry] = []
            self.written_bytes = 0

        def reset(self, checkpoint_id: Any = None) -> None:
            self.objects = []
            self.written_bytes = 0

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
            return True

        def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
            self.is_coordinator = is_coordinator

        def prepare_local_plan(self, plan: Any) -> Any:
            return plan

        def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
            return [
                dataclasses.replace(plan, storage_data=shard_object(rank))
                for rank, plan in enumerate(plans)
            ]

        def write_data(self, plan: Any, planner: Any) -> Any:
            future: Any = Future()
            future.set_result(self._write(plan, planner))
            return future

        def _write(self, plan: Any, planner: Any) -> list[Any]:
            results, rest = [], []
            for item in plan.items:
                if pool is not None and item.type != WriteItemType.BYTE_IO:
                    data = planner.resolve_data(item)
                    chunk = (item.index.fqn, tuple(int(n) for n in item.index.offset or ()))
                    entry = pool.place(store, chunk, data, hash_aside=True)
                    if entry is not None:
                        stored = Stored(entry.name, 0, entry.size_bytes, *_described(data))
                        results.append(
                            WriteResult(item.index, entry.size_bytes, _Written(stored, entry))
                        )
                        continue
                rest.append(item)
            if pool is not None:
                self.written_bytes += pool.written_bytes
            if not rest:
                return results
            name: str = plan.storage_data
            chunks: list[tuple[Any, Stored]] = []

            def produce(upload: Any) -> None:
                chunks.clear()  # a local write that is retried starts again
                for item in rest:
                    data = planner.resolve_data(item)
                    offset = upload.size
                    if item.type == WriteItemType.BYTE_IO:
                        upload.write(data.getbuffer())
                        stored = Stored(name, offset, upload.size - offset)
                    else:
                        # What is written (a copy staged for this save, or the live
                        # state of a save training waits for) stays unchanged until the
                        # save ends, so the hash may run on past this write.
                        upload.write_held(_tensor_bytes(data))
                        stored = Stored(name, offset, upload.size - offset, *_described(data))
                    chunks.append((item.index, stored))

            size, digest = store.write_stream(f"{folder}/{name}", produce)
            self.written_bytes += size
            entry = ObjectEntry(name, size, digest)
            return results + [
                WriteResult(index, stored.length, _Written(stored, entry))
                for index, stored in chunks
            ]

        def finish(self, metadata: Any, results: list[list[Any]]) -> None:
            torch = state_mod._torch()
            storage: dict[Any, Stored] = {}
            objects: dict[str, ObjectEntry] = {}
            for rank_results in results:
                for result in rank_results:
                    storage[result.index] = result.storage_data.stored
                    objects[result.storage_data.entry.name] = result.storage_data.entry
            metadata.storage_data = storage
            buffer = io.BytesIO()
            torch.save(metadata, buffer)
            data = buffer.getbuffer()
            digest = store.put_hashed(f"{folder}/{METADATA}", data)
            self.objects = [ObjectEntry(METADATA, data.nbytes, digest), *objects.values()]

        def storage_meta(self) -> Any:
            return None

    return _Writer()


def read_metadata_object(store: Store, manifest: Manifest) -> Any:
    """DCP's index of a sharded checkpoint, checked against the manifest, loaded safely."""
    torch = state_mod._torch()
    entry = object_entry(manifest, METADATA)
    data = store.get(manifest.object_path(entry))
    if len(data) != entry.size_bytes or hashlib.sha256(data).hexdigest() != entry.sha256:
        msg = f"{manifest.object_path(entry)} does not match the manifest's size and sha256"
        raise ManifestError(msg)
    try:
        state_mod.require_zip(data, METADATA)
    except ValueError as exc:  # verified bytes: a forged or foreign index
        raise UnreadableError(str(exc)) from exc
    with torch.serialization.safe_globals(_safe_globals()):
        try:
            meta = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:  # verified bytes: a foreign or forged index
            msg = f"{METADATA} cannot be loaded: {type(exc).__name__}: {visible(str(exc))[:200]}"
            raise UnreadableError(msg) from exc
    from torch.distributed.checkpoint.metadata import Metadata

    storage = getattr(meta, "storage_data", None)
    if not (
        isinstance(meta, Metadata)
        and isinstance(meta.state_dict_metadata, dict)
        and isinstance(storage, dict)
        and all(isinstance(where, Stored) for where in storage.values())
    ):
        msg = f"{METADATA} is no index of costguard's sharded checkpoint"
        raise UnreadableError(msg)
    for name, value in meta.state_dict_metadata.items():
        wrong = _covered(value)
        if wrong is not None:
            msg = f"{METADATA}: the chunks of {str(name)[:80]!r} {wrong}"
            raise UnreadableError(visible(msg))
    return meta


def _covered(value: Any) -> str | None:
    """What is wrong with a tensor's chunks in DCP's index, or ``None``: they must lie
    within its size, none may overlap another, and they must add up to it (as DCP's save
    checks): a whole load would otherwise leave part of the tensor unset."""
    size = getattr(value, "size", None)
    chunks = getattr(value, "chunks", None)
    if size is None or chunks is None:  # a value saved as bytes
        return None
    wrong = "do not make up its tensor"
    try:
        total, boxes = 0, []
        for chunk in chunks:
            if len(chunk.offsets) != len(size) or len(chunk.sizes) != len(size):
                return wrong
            if any(
                o < 0 or n < 0 or o + n > s
                for o, n, s in zip(chunk.offsets, chunk.sizes, size, strict=True)
            ):
                return wrong
            volume = math.prod(chunk.sizes)
            total += volume
            if volume:
                boxes.append((tuple(chunk.offsets), tuple(chunk.sizes)))
        if total != math.prod(size):
            return wrong
    except (TypeError, AttributeError):
        return wrong
    apart = _apart(boxes, [PAIRS_PER_CHUNK * len(boxes)])
    if apart is None:
        return (
            f"are {len(boxes)} laid out so that a check for overlaps would compare more "
            f"than {PAIRS_PER_CHUNK} pairs a chunk"
        )
    return None if apart else "overlap one another (part of the tensor would stay unset)"


def _apart(boxes: list[tuple[tuple[int, ...], tuple[int, ...]]], pairs: list[int]) -> bool | None:
    """Whether no two of ``boxes`` (offsets, sizes; none empty) overlap, swept along the
    dimension they are cut most along (a genuine index's chunks then meet one or a few at a
    time): each is compared with those that reach past its start there. ``None`` once
    ``pairs`` comparisons are spent.

    >>> rows = [((0, 0), (2, 3)), ((2, 0), (2, 3))]
    >>> _apart(rows, [10]), _apart([*rows[:1], ((1, 0), (2, 3))], [10])
    (True, False)
    >>> columns = [((0, i), (5, 1)) for i in range(2000)]  # 2,000 ranks' columns
    >>> _apart(columns, [4000]), _apart([*columns, ((4, 1500), (1, 1))], [4000])
    (True, False)
    >>> stairs = [((i, i), (2000 - i, 1)) for i in range(2000)]  # apart, all reaching
    >>> _apart(stairs, [4000]), _apart(stairs, [10**7])  # the bound, then the answer
    (None, True)
    """
    if not boxes or not boxes[0][0]:
        return len(boxes) <= 1  # a scalar: one chunk at most
    dims = range(len(boxes[0][0]))
    axis = max(dims, key=lambda d: len({offsets[d] for offsets, _ in boxes}))
    reaching: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for offsets, sizes in sorted(boxes, key=lambda b: (b[0][axis], b)):
        pairs[0] -= len(reaching) + 1
        if pairs[0] < 0:
            return None
        reaching = [b for b in reaching if b[0][axis] + b[1][axis] > offsets[axis]]
        for other, extent in reaching:
            if all(
                o < p + m and p < o + n
                for o, n, p, m in zip(other, extent, offsets, sizes, strict=True)
            ):
                return False
        reaching.append((offsets, sizes))
    return True


def storage_reader(store: Store, manifest: Manifest) -> Any:
    """A DCP ``StorageReader`` for a verified sharded checkpoint of ``store``."""
    torch = state_mod._torch()
    from torch.distributed.checkpoint import StorageReader
    from torch.distributed.checkpoint.planner import LoadItemType
    from torch.futures import Future

    class _Reader(StorageReader):
        def __init__(self) -> None:
            super().__init__()
            self.storage: Mapping[Any, Stored] = {}
            self._metadata: Any = None

        def reset(self, checkpoint_id: Any = None) -> None:
            pass

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
            return True

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            """The index, read once (its errors raised here, before DCP, which would
            log them with a traceback, asks for it)."""
            if self._metadata is None:
                self._metadata = read_metadata_object(store, manifest)
            return self._metadata

        def set_up_storage_reader(
            self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any
        ) -> None:
            self.storage = metadata.storage_data

        def prepare_local_plan(self, plan: Any) -> Any:
            return plan

        def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
            return plans

        def read_data(self, plan: Any, planner: Any) -> Any:
            listed = {o.name: o for o in manifest.objects}
            for item in sorted(plan.items, key=lambda i: self._where(i, listed).offset):
                where = self._where(item, listed)
                data = store.read_range(
                    manifest.object_path(listed[where.object]),
                    where.offset,
                    where.offset + where.length,
                )
                if item.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(item, io.BytesIO(data))
                    continue
                if where.dtype is None or where.shape is None:
                    msg = f"chunk {item.storage_index.fqn[:80]!r} has no dtype or shape"
                    raise ManifestError(msg)
                target = planner.resolve_tensor(item).detach()
                if _dtype(where.dtype) != target.dtype:
                    # Read as another dtype, the bytes would be converted, not copied.
                    msg = (
                        f"chunk of {item.storage_index.fqn[:80]!r}: {where.dtype[:40]} saved, "
                        f"{target.dtype} wanted"
                    )
                    raise ValueError(msg)
                saved = torch.frombuffer(bytearray(data), dtype=torch.uint8)
                tensor = saved.view(target.dtype).reshape(where.shape)
                tensor = _narrow(tensor, item.storage_offsets, item.lengths)
                if target.size() != tensor.size():
                    msg = (
                        f"chunk of {item.storage_index.fqn[:80]!r}: {tuple(tensor.size())} "
                        f"saved, {tuple(target.size())} wanted"
                    )
                    raise ValueError(msg)
                target.copy_(tensor)
                planner.commit_tensor(item, target)
            future: Any = Future()
            future.set_result(None)
            return future

        def _where(self, item: Any, listed: Mapping[str, ObjectEntry]) -> Stored:
            where = self.storage[item.storage_index]
            if where.object not in listed:
                msg = f"dcp.metadata names {where.object[:80]!r}, which the manifest does not list"
                raise ManifestError(msg)
            if not (listed[where.object].pool or _SHARD.fullmatch(where.object)):
                msg = f"dcp.metadata puts a chunk in {where.object[:80]!r}, which holds none"
                raise ManifestError(msg)
            return where

    return _Reader()


def save_planner(tensors: Mapping[str, Any]) -> Any:
    """DCP's save planner, writing the tensor of each name in ``tensors`` (DCP's
    flattened name -> the local tensor staged for this save) in place of the one in the
    state it plans from (whose DTensors then serve only for their shapes and layout)."""
    from torch.distributed.checkpoint import default_planner

    class _StagedPlanner(default_planner.DefaultSavePlanner):
        def lookup_object(self, index: Any) -> Any:
            staged = tensors.get(index.fqn)
            return staged if staged is not None else super().lookup_object(index)

    return _StagedPlanner()


def load_planner(*, whole: bool = False) -> Any:
    """DCP's load planner, reading non-tensor values with ``weights_only=True``.

    ``whole``: DCP's planner that rebuilds the whole state from ``dcp.metadata`` (full
    tensors, no live objects needed; the one ``dcp_to_torch_save`` uses), for one process.
    """
    torch = state_mod._torch()
    from torch.distributed.checkpoint import default_planner
    from torch.distributed.checkpoint._nested_dict import set_element

    base = (
        default_planner._EmptyStateDictLoadPlanner if whole else default_planner.DefaultLoadPlanner
    )

    class _SafePlanner(base):  # type: ignore[misc,valid-type]
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            start = value.tell()
            state_mod.require_zip(value.read(4), f"the value of {read_item.dest_index.fqn}")
            value.seek(start)
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                fqn = self.mappings[read_item.dest_index.fqn]
                set_element(self.original_state_dict, fqn, loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return _SafePlanner()
