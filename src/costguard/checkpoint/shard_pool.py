"""Incremental saves of a sharded state: each rank's frozen shards go to the pool once.

The sharded counterpart of :mod:`~costguard.checkpoint.incremental`, used by DCP's storage
layer (:func:`~costguard.checkpoint.dcp_storage.storage_writer`). A tensor chunk a rank
writes is **pooled** when it belongs to the model, holds at least
:data:`~costguard.checkpoint.incremental.POOL_MIN_BYTES`, and its storage is not that of a
parameter that trains (``requires_grad``, or in the optimizer's groups): a frozen base
weight's local shard, a constant buffer. A pooled chunk is stored as the pool object
``blobs/<sha256>`` of its raw bytes, and ``dcp.metadata`` says the chunk lies there; the
manifest lists each pool object the checkpoint needs, so verification, retention and a
resharded restore (DCP reads whatever chunks the new layout needs) treat it like any
other object.

**Not written again.** Before a save copies anything, on the training thread,
:meth:`ShardPool.stage` decides for each chunk: one unchanged since this rank's last
committed save (the same storage, address, shape, strides, dtype and version counter, as
:func:`~costguard.checkpoint.incremental.tensor_key` decides) is neither copied nor
written: the save refers to the pool object that save stored, without reading the data;
that object cannot have been deleted, as the newest committed checkpoint refers to it.
Each unchanged chunk is still hashed at one save in
:data:`~costguard.checkpoint.incremental.CONFIRM_EVERY` (staggered, from the live tensor,
on the save thread): a write past the version counter is then caught, stored afresh, and
the chunk is copied at every save from then on. A chunk that did change is copied with
the rest, hashed and written, even when an earlier save wrote the same bytes (another
rank's retention may have deleted that object since). After a restore on as many ranks as
saved, the chunks loaded from pool objects count as unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from costguard.checkpoint.incremental import (
    CONFIRM_EVERY,
    POOL_MIN_BYTES,
    sha256_of,
    tensor_bytes,
    tensor_key,
    write_object,
)
from costguard.checkpoint.manifest import ObjectEntry, pool_path
from costguard.checkpoint.store import Store
from costguard.logs import get_logger

logger = get_logger(__name__)

#: One chunk of a DCP state: its fully qualified name and where it starts (DCP's index).
Chunk = tuple[str, tuple[int, ...]]


@dataclass
class _Record:
    """What this rank's last committed save stored for one pooled chunk."""

    tensor: Any  # the live local tensor: keeps its storage, so its address, in use
    key: tuple[Any, ...]
    sha256: str
    size: int
    saves_left: int  # saves until it is hashed again to confirm it


@dataclass
class _Staged:
    """One pooled chunk of the save in flight, as the training thread found it."""

    tensor: Any  # the live local tensor
    key: tuple[Any, ...]
    unchanged: bool  # since the last committed save: not copied, referred to


def _local(tensor: Any) -> Any:
    """A DTensor's local shard; any other tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


class ShardPool:
    """The pool side of one rank's sharded saves (one per Checkpointer)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        #: Chunk -> its record, as of the last committed save.
        self._records: dict[Chunk, _Record] = {}
        #: The pooled chunks of the save in flight (:meth:`stage`).
        self._staged: dict[Chunk, _Staged] = {}
        #: What the save in flight placed; becomes :attr:`_records` when it commits.
        self._pending: dict[Chunk, _Record] = {}
        #: Chunks found changed past their version counter: copied at every save.
        self._untrusted: set[Chunk] = set()
        self._trainable: set[int] = set()
        #: Whether the save in flight pools (enabled, and the model is a module).
        self._active = False
        #: Bytes this rank wrote to the pool in the save in flight.
        self.written_bytes = 0

    def begin(self, model: Any, optimizer: Any) -> None:
        """A save starts: note which storages train (their chunks are never pooled)."""
        import torch

        self._staged, self._pending, self.written_bytes = {}, {}, 0
        # Only a module can say which of its parameters train.
        self._active = self.enabled and isinstance(model, torch.nn.Module)
        found = set()
        for p in model.parameters() if self._active else ():
            if p.requires_grad:
                found.add(_local(p).untyped_storage().data_ptr())
        for group in getattr(optimizer, "param_groups", None) or ():
            for p in group.get("params", ()):
                found.add(_local(p).untyped_storage().data_ptr())
        self._trainable = found

    def pooled(self, fqn: str, tensor: Any) -> bool:
        """Whether the chunk of ``fqn`` (the local ``tensor`` DCP resolved) is pooled."""
        import torch

        return (
            self._active
            and fqn.startswith("model.")
            and type(tensor) is torch.Tensor
            and tensor.layout == torch.strided
            and not tensor.is_quantized
            and tensor.device.type != "meta"
            and tensor.is_contiguous()
            and tensor.numel() * tensor.element_size() >= POOL_MIN_BYTES
            and tensor.untyped_storage().data_ptr() not in self._trainable
        )

    def stage(self, fqn: str, value: Any, local: Any) -> bool:
        """On the training thread, for each tensor of the state DCP saves (``fqn`` as DCP
        names it, ``value`` a tensor or DTensor, ``local`` its local tensor): note whether
        its chunk is pooled, and say whether it is unchanged since the last committed save
        (then it need not be copied: the save refers to its pool object, or hashes the
        live tensor to confirm)."""
        if not self.pooled(fqn, local):
            return False
        chunk = (fqn, _offsets(value))
        key = tensor_key(local)
        record = self._records.get(chunk)
        unchanged = record is not None and record.key == key and chunk not in self._untrusted
        self._staged[chunk] = _Staged(local.detach(), key, unchanged)
        return unchanged

    def place(
        self, store: Store, chunk: Chunk, tensor: Any, *, hash_aside: bool
    ) -> ObjectEntry | None:
        """The pool object holding this chunk's bytes (``tensor``: what the save writes,
        a copy or the live tensor), written when not known unchanged; ``None`` for a chunk
        :meth:`stage` did not pool."""
        staged = self._staged.get(chunk)
        if staged is None:
            return None
        size = tensor.numel() * tensor.element_size()
        record = self._records.get(chunk)
        if record is not None and staged.unchanged and record.saves_left > 1:
            left, digest = record.saves_left - 1, record.sha256
        else:
            cpu = tensor if tensor.device.type == "cpu" else tensor.cpu()
            # Staggered: about one chunk in CONFIRM_EVERY is confirmed at each save.
            digest, left = sha256_of(cpu), CONFIRM_EVERY - len(self._pending) % CONFIRM_EVERY
            if record is not None and staged.unchanged and digest != record.sha256:
                logger.warning(
                    "costguard: %s changed without its version counter moving (written "
                    "through .data, NumPy or a custom kernel?); it is stored as it is now, "
                    "and copied at every save from now on",
                    chunk[0],
                )
                self._untrusted.add(chunk)
            if record is None or digest != record.sha256:
                self._write(store, digest, tensor_bytes(cpu), hash_aside=hash_aside)
        self._pending[chunk] = _Record(staged.tensor, staged.key, digest, size, left)
        return ObjectEntry(digest, size, digest, pool=True)

    def _write(self, store: Store, digest: str, view: memoryview, *, hash_aside: bool) -> None:
        size, written = write_object(store, pool_path(digest), view, hash_aside=hash_aside)
        if written != digest or size != view.nbytes:
            msg = f"pool object {digest[:12]}... was written with sha256 {written[:12]}..."
            raise OSError(msg)
        self.written_bytes += size

    def committed(self, ok: bool) -> None:
        """The save ended (on every rank alike): its chunks are what the next compares with."""
        if ok:
            self._records = self._pending
        self._staged, self._pending = {}, {}

    def adopt(
        self,
        parts: tuple[Any, Any],
        model_state: Mapping[str, Any],
        chunks: Mapping[Chunk, tuple[ObjectEntry, str | None]],
    ) -> None:
        """After a restore: this rank's chunks of the model (``model_state``, as DCP saves
        it) that were loaded from a verified pool object (``chunks``: (fqn, offsets) ->
        the object and the dtype saved) count as unchanged, when they are that whole chunk
        in that dtype. ``parts``: the model and optimizer (which storages train)."""
        self.begin(*parts)
        records = {}
        for i, (name, value) in enumerate(model_state.items()):
            local = _local(value)
            chunk = (f"model.{name}", _offsets(value))
            entry, dtype = chunks.get(chunk, (None, None))
            if (
                entry is None
                or not self.pooled(chunk[0], local)
                or str(local.dtype) != dtype
                or local.numel() * local.element_size() != entry.size_bytes
            ):
                continue
            records[chunk] = _Record(
                local.detach(),
                tensor_key(local),
                entry.sha256,
                entry.size_bytes,
                CONFIRM_EVERY - i % CONFIRM_EVERY,
            )
        self._records = records


def _offsets(value: Any) -> tuple[int, ...]:
    """Where this rank's chunk of ``value`` starts in the whole tensor (DCP's index)."""
    chunks = getattr(value, "__create_chunk_list__", None)
    if callable(chunks):  # a DTensor: one chunk per rank
        return tuple(int(n) for n in chunks()[0].offsets)
    return tuple(0 for _ in value.shape)
