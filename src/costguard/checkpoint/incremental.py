"""Incremental saves: a frozen tensor unchanged since the last save is not copied or stored again.

Fine-tuning with frozen weights (LoRA, adapters, a frozen backbone) changes a few MB per
step out of GBs of state. Such tensors go to a content-addressed pool shared by all the
checkpoints of a store, ``blobs/<sha256>`` (the raw bytes of the tensor, hashed with
sha256); the checkpoint's manifest lists each one it needs as a pool object (see
:class:`~costguard.checkpoint.manifest.ObjectEntry`), and ``state.pt`` holds everything
else, with a reference (path, sha256, dtype, shape) where a pooled tensor was. A save
whose frozen tensors did not change refers to the pool objects an earlier save stored:
it copies and uploads only the rest (the adapter, the optimizer, the RNG states).

**Which tensors are pooled.** A tensor of the model's ``state_dict`` (frozen weights and
buffers), of at least :data:`POOL_MIN_BYTES`, contiguous, plain (no subclass, not
quantized, strided), whose storage is not that of a parameter that requires grad or that
the optimizer updates. Everything else (trainable weights, optimizer state, small tensors)
stays in ``state.pt`` as before, so a model with nothing frozen saves exactly as it did.
Only a model that is a ``torch.nn.Module`` (it can say which parameters train) has any.

**"Unchanged since the last save"**, decided in the training thread without reading the
data: the same storage (a reference to it is kept, so its address cannot be reused by
another tensor), the same address, shape, strides and dtype, and the same version counter
(``tensor._version``, which every in-place torch operation on it or a view of it bumps,
``no_grad`` or not). Writes that bypass the counter (through ``.data``, NumPy, a custom
kernel) would go unseen, so each unchanged tensor is still read and hashed in the
background at one save in :data:`CONFIRM_EVERY` (staggered, so each save hashes about
1/16 of the frozen bytes). A mismatch stores the tensor as it is now, logs a warning, and
from then on that tensor is copied at every save.

**What a save does with a pooled tensor that did change** (the first save, a buffer a step
touched): it is copied with the rest of the state, hashed in the background, and uploaded
unless this process already wrote or verified a pool object with that hash (an object
merely listed in the store is not trusted: it may be a corrupt one, and writing the same
name with the right bytes is always safe). So the first save of a run copies and stores
everything, as a full save does (the same stall and peak memory); the saves after it copy
only what changed. A frozen tensor is not read in place instead of copied even then: an
EMA teacher (frozen, updated in place every step) would be stored torn.

**Restore** verifies every pool object's size and sha256 like any other object (a missing
or mismatching one makes the checkpoint corrupt; a failed read makes it doubtful), maps
each from its local file, and puts it where the reference was: the state is bitwise what
was saved. Afterwards the restored frozen tensors count as unchanged, so the first save
after a resume copies and uploads no more than the ones after it.

**Retention** deletes a pool object only when no kept checkpoint's manifest refers to it,
right after a newer checkpoint committed, and never while a manifest could not be read or
a save may be in progress (see :func:`~costguard.checkpoint.manifest.plan_pool_deletions`).

On by default (``Checkpointer(incremental=False)`` turns it off): the training loop and
the restored state are the same either way; only what is copied and uploaded changes.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from costguard.checkpoint.manifest import ObjectEntry, UnreadableError, pool_path
from costguard.checkpoint.store import Store
from costguard.clouds import require
from costguard.logs import get_logger

logger = get_logger(__name__)

#: Tensors smaller than this stay in ``state.pt``: a pool object per bias vector would cost
#: more in requests than it saves in bytes.
POOL_MIN_BYTES = 1 << 20
#: An unchanged tensor is re-read and hashed at one save in this many (see the module doc).
CONFIRM_EVERY = 16
#: The key of ``state.pt``'s list of references to pool objects.
REFS_KEY = "pooled"
#: Bytes hashed or copied per chunk when a live tensor is read in the background.
CHUNK_BYTES = 16 << 20

Path = tuple[Any, ...]


def _torch() -> Any:
    return require("torch", "train")


@dataclass
class _Record:
    """What the last committed save knew of one pooled tensor."""

    tensor: Any  # the live tensor (detached): keeps its storage, so its address, in use
    key: tuple[Any, ...]
    sha256: str
    saves_left: int  # saves until it is hashed again to confirm it


@dataclass
class _Item:
    """One pooled tensor of a save in flight."""

    path: Path
    key: tuple[Any, ...]
    live: Any
    #: The copy taken in the training thread (a changed tensor); ``None``: not copied.
    copy: Any = None
    #: The sha256 of the pool object it is known to equal (an unchanged tensor).
    sha256: str | None = None
    confirm: bool = False


@dataclass
class Snapshot:
    """A save's state, copied: ``state`` for ``state.pt`` (pooled tensors set to ``None``)
    and the pooled tensors to refer to."""

    state: Any
    items: list[_Item] = field(default_factory=list)
    #: The pool objects written by this save (bytes uploaded).
    uploaded_bytes: int = 0
    #: Copy buffers no longer needed, to be freed off the training thread.
    released: list[Any] = field(default_factory=list)
    #: Training waits for this save (a blocking, final or emergency one): a local write
    #: may hash on a second core. A save beside training takes one core, not two.
    hurry: bool = False


def tensor_key(tensor: Any) -> tuple[Any, ...]:
    """What must stay the same for a tensor to count as unchanged (see the module doc)."""
    return (
        tensor.untyped_storage().data_ptr(),
        tensor.data_ptr(),
        tensor._version,
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
        tensor.device,
    )


def trainable_storages(model: Any, optimizer: Any) -> set[int] | None:
    """The storage addresses of every parameter that trains (requires grad, or is in the
    optimizer's groups); ``None`` when ``model`` is not a ``torch.nn.Module``."""
    torch = _torch()
    if not isinstance(model, torch.nn.Module):
        return None
    found = {p.untyped_storage().data_ptr() for p in model.parameters() if p.requires_grad}
    for group in getattr(optimizer, "param_groups", None) or ():
        for p in group.get("params", ()):
            if isinstance(p, torch.Tensor):
                found.add(p.untyped_storage().data_ptr())
    return found


def _poolable(value: Any, trainable: set[int]) -> bool:
    torch = _torch()
    return (
        type(value) is torch.Tensor
        and value.layout == torch.strided
        and not value.is_quantized
        and value.device.type != "meta"
        and value.is_contiguous()
        and value.numel() * value.element_size() >= POOL_MIN_BYTES
        and value.untyped_storage().data_ptr() not in trainable
    )


def _walk(value: Any, path: Path) -> Iterator[tuple[Path, Any]]:
    """Every ``(path, leaf)`` reachable through dicts and lists (tuples are left whole)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, (*path, i))
    else:
        yield path, value


def _replace(state: Any, leaves: Mapping[Path, Any]) -> Any:
    """``state`` with the leaf at each path of ``leaves`` replaced, rebuilding only the
    containers on the way (the caller's dicts and lists are not changed)."""
    if () in leaves:
        return leaves[()]
    heads: dict[Any, dict[Path, Any]] = {}
    for path, value in leaves.items():
        heads.setdefault(path[0], {})[path[1:]] = value
    out: Any = dict(state) if isinstance(state, Mapping) else list(state)
    for head, rest in heads.items():
        out[head] = _replace(state[head], rest)
    return out


def tensor_bytes(tensor: Any) -> memoryview:
    """The bytes of a contiguous CPU tensor, without copying (valid while it lives)."""
    n = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_char * n).from_address(tensor.data_ptr())).cast("B")


def sha256_of(tensor: Any) -> str:
    """The sha256 of a tensor's bytes (a CPU tensor read in place, another copied to the
    CPU a chunk at a time); hashlib releases the GIL for the bulk of it."""
    digest = hashlib.sha256()
    flat = tensor.detach().reshape(-1).view(_torch().uint8)
    for start in range(0, flat.numel(), CHUNK_BYTES):
        chunk = flat[start : start + CHUNK_BYTES]
        digest.update(tensor_bytes(chunk if chunk.device.type == "cpu" else chunk.cpu()))
    return digest.hexdigest()


def write_object(store: Store, path: str, view: memoryview, *, hash_aside: bool) -> tuple[int, str]:
    """Write a pool object from the bytes of a live tensor; its size and sha256 as written.

    Streamed where the store streams (S3 parts, a local file); elsewhere put whole from
    ``view`` (a streamed write there would buffer a second copy).
    """
    if store.is_s3 or store.is_local:

        def produce(file: Any) -> None:
            for start in range(0, view.nbytes, CHUNK_BYTES):
                file.write(view[start : start + CHUNK_BYTES])

        return store.write_stream(path, produce, hash_aside=hash_aside)
    return view.nbytes, store.put_hashed(path, view)


class Pool:
    """The pool side of one writer: which tensors are pooled, what is known stored."""

    def __init__(self, store: Store, *, enabled: bool = True) -> None:
        self.store = store
        self.enabled = enabled
        self._lock = threading.Lock()
        self._records: dict[Path, _Record] = {}
        #: Pooled tensors found changed without their version counter: never trusted again.
        self._untrusted: set[Path] = set()
        #: Pool objects this process wrote or verified (sha256 -> size).
        self.known: dict[str, int] = {}

    # -- the training thread ---------------------------------------------------------

    def split(self, state: Any, trainable: set[int] | None) -> tuple[Any, list[_Item]]:
        """``state`` with its pooled tensors taken out (set to ``None``), and those tensors:
        the changed ones still to be copied, the unchanged ones with their pool object."""
        model = state.get("model") if isinstance(state, Mapping) else None
        if not self.enabled or trainable is None or model is None:
            return state, []
        items = []
        with self._lock:
            for path, value in _walk(model, ("model",)):
                if path in self._untrusted or not _poolable(value, trainable):
                    continue
                key = tensor_key(value)
                item = _Item(path, key, value.detach())
                record = self._records.get(path)
                if record is not None and record.key == key and record.sha256 in self.known:
                    item.sha256 = record.sha256
                    item.confirm = record.saves_left <= 1
                items.append(item)
        if items:
            state = _replace(state, {item.path: None for item in items})
        return state, items

    # -- the background thread -------------------------------------------------------

    def store_objects(self, snapshot: Snapshot) -> list[ObjectEntry]:
        """Hash, and upload where needed, every pooled tensor of ``snapshot``; put their
        references in ``snapshot.state``. The pool entries for the manifest."""
        refs, entries = [], {}
        for item in snapshot.items:
            if item.sha256 is None or item.confirm:
                self._settle(item, snapshot)
            tensor = item.copy if item.copy is not None else item.live
            size = tensor.numel() * tensor.element_size()
            assert item.sha256 is not None  # settled above
            refs.append(
                {
                    "path": list(item.path),
                    "sha256": item.sha256,
                    "dtype": str(tensor.dtype).removeprefix("torch."),
                    "shape": list(tensor.shape),
                }
            )
            entries[item.sha256] = ObjectEntry(item.sha256, size, item.sha256, pool=True)
        if refs:
            snapshot.state = {**snapshot.state, REFS_KEY: refs}
        return list(entries.values())

    def _settle(self, item: _Item, snapshot: Snapshot) -> None:
        """Find the sha256 of a changed or to-be-confirmed tensor; upload it if unknown."""
        if item.copy is None:  # an unchanged one, confirmed by reading the live tensor
            digest = sha256_of(item.live)
            if digest == item.sha256:
                return
            logger.warning(
                "costguard: %s changed without its version counter moving (written through "
                ".data, NumPy or a custom kernel?); it is stored as it is now, and copied at "
                "every save from now on",
                "/".join(map(str, item.path)),
            )
            with self._lock:
                self._untrusted.add(item.path)
            item.copy = item.live.to("cpu", copy=True)
        cpu = item.copy if item.copy.device.type == "cpu" else item.copy.cpu()
        digest = sha256_of(cpu)
        item.sha256 = digest
        with self._lock:
            known = digest in self.known
        if known:
            return
        view = tensor_bytes(cpu)
        size, written = self._write(pool_path(digest), view, hash_aside=snapshot.hurry)
        if written != digest or size != view.nbytes:
            msg = f"pool object {digest[:12]}... was written with sha256 {written[:12]}..."
            raise OSError(msg)
        with self._lock:
            self.known[digest] = size
        snapshot.uploaded_bytes += size

    def _write(self, path: str, view: memoryview, *, hash_aside: bool) -> tuple[int, str]:
        return write_object(self.store, path, view, hash_aside=hash_aside)

    def committed(self, snapshot: Snapshot) -> None:
        """A save committed: its pooled tensors are what the next save compares with."""
        with self._lock:
            records: dict[Path, _Record] = {}
            for item in snapshot.items:
                assert item.sha256 is not None
                old = self._records.get(item.path)
                left = (
                    old.saves_left - 1
                    if old is not None and old.sha256 == item.sha256 and not item.confirm
                    else CONFIRM_EVERY - len(records) % CONFIRM_EVERY
                )
                records[item.path] = _Record(item.live, item.key, item.sha256, left)
            self._records = records

    def forget(self, digests: Iterable[str]) -> None:
        """Pool objects deleted by retention."""
        with self._lock:
            for digest in digests:
                self.known.pop(digest, None)

    def adopt(self, model_state: Mapping[str, Any], refs: Mapping[Path, Placed]) -> None:
        """After a restore: the model's tensors that were just loaded from pool objects
        (``refs``, verified) count as unchanged, when they hold those very bytes (the same
        dtype and shape: ``load_state_dict`` copies them bitwise)."""
        torch = _torch()
        with self._lock:
            for placed in refs.values():
                self.known[placed.sha256] = placed.size
            for i, (name, value) in enumerate(model_state.items()):
                ref = refs.get(("model", name))
                if (
                    ref is None
                    or not isinstance(value, torch.Tensor)
                    or (value.dtype, tuple(value.shape)) != (ref.dtype, ref.shape)
                    or not value.is_contiguous()
                ):
                    continue  # loaded into another dtype or layout: not the pooled bytes
                self._records[("model", name)] = _Record(
                    value.detach(),
                    tensor_key(value),
                    ref.sha256,
                    CONFIRM_EVERY - i % CONFIRM_EVERY,
                )


@dataclass(frozen=True)
class Placed:
    """Where a restored tensor came from: a verified pool object, as what dtype and shape."""

    sha256: str
    size: int
    dtype: Any
    shape: tuple[int, ...]


def assemble(state: Any, files: Mapping[str, tuple[str, int]]) -> tuple[Any, dict[Path, Placed]]:
    """Put the pooled tensors back into a loaded ``state.pt``: ``files`` maps each sha256
    to a local, verified file and its size, mapped (not read) into the tensors. Also
    returns what came from where.

    A reference that does not fit its object (an unknown dtype, another size) is
    :class:`~costguard.checkpoint.manifest.UnreadableError`: both were verified, so this
    is a format this costguard does not know, not proof of corruption."""
    torch = _torch()
    refs = state.pop(REFS_KEY, None) if isinstance(state, dict) else None
    placed: dict[Path, tuple[Placed, Any]] = {}
    for ref in refs or ():
        digest, shape = ref["sha256"], [int(n) for n in ref["shape"]]
        dtype = getattr(torch, str(ref["dtype"]), None)
        if not isinstance(dtype, torch.dtype) or digest not in files:
            msg = f"state.pt refers to pool object {str(digest)[:12]} as {ref['dtype']!r}"
            raise UnreadableError(msg)
        numel = 1
        for n in shape:
            numel *= n
        local, size = files[digest]
        if numel * dtype.itemsize != size or numel < 1:
            msg = f"pool object {digest[:12]} holds {size} bytes, not a {ref['dtype']} {shape}"
            raise UnreadableError(msg)
        tensor = torch.from_file(local, shared=False, size=numel, dtype=dtype)
        placed[tuple(ref["path"])] = (
            Placed(digest, size, dtype, tuple(shape)),
            tensor.reshape(shape),
        )
    if placed:
        state = _replace(state, {path: tensor for path, (_, tensor) in placed.items()})
    return state, {path: where for path, (where, _) in placed.items()}
