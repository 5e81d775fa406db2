"""Training state: capture it to CPU memory, serialise it, put it back. Uses torch.

Everything an exact resume needs goes into one nested dict of tensors and plain values:
model, optimizer, LR scheduler, grad scaler, step/epoch, the Python, NumPy, torch (and
CUDA) RNG states, a resumable data loader's position and the user's ``extra`` dict.
:class:`CpuCopier` copies it into CPU buffers that it keeps warm between saves, so the
training loop is blocked only for a memory copy. Serialisation is ``torch.save`` and
loading uses ``weights_only=True``: a checkpoint from a bucket cannot run code.

torch is imported inside the functions, so ``import costguard.checkpoint`` stays light.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import random
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from costguard.checkpoint import memcopy
from costguard.clouds import require

EXTRA = "train"
STATE_FORMAT = 1


class Stateful(Protocol):
    """Anything with ``state_dict()`` / ``load_state_dict()`` (models, optimizers, ...)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


def _torch() -> Any:
    return require("torch", EXTRA)


def rng_state() -> dict[str, Any]:
    """The Python, NumPy (if installed), torch and CUDA (if initialised) RNG states.

    Values are plain lists and tensors, so they load with ``weights_only=True``.
    """
    torch = _torch()
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "torch": torch.get_rng_state(),
    }
    try:
        import numpy as np  # optional: only when the script uses it
    except ImportError:
        pass
    else:
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = {
            "kind": str(kind),
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Put back what :func:`rng_state` captured (parts that are absent are left alone)."""
    torch = _torch()
    py = state.get("python")
    if py is not None:
        random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        n = state["numpy"]
        keys = np.array(n["keys"], dtype=np.uint32)
        np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass(frozen=True)
class TrainState:
    """What a training loop hands the Checkpointer: the objects whose state is saved and
    restored, the user's ``extra`` values and the epoch. One value for every path (restore,
    step, save, the emergency save, close), so the parts are named in one place."""

    model: Stateful | None = None
    optimizer: Stateful | None = None
    scheduler: Stateful | None = None
    scaler: Stateful | None = None
    loader: Stateful | None = None
    extra: Mapping[str, Any] | None = None
    epoch: int | None = None

    def stateful(self) -> list[tuple[str, Stateful]]:
        """The objects given, with their part names, in a fixed order."""
        parts = (
            ("model", self.model),
            ("optimizer", self.optimizer),
            ("scheduler", self.scheduler),
            ("scaler", self.scaler),
            ("loader", self.loader),
        )
        return [(name, obj) for name, obj in parts if obj is not None]


def capture(step: int, train: TrainState) -> dict[str, Any]:
    """The live training state as one dict (tensors still shared with the live objects).

    Pass it through :meth:`CpuCopier.copy` before training goes on.
    """
    state: dict[str, Any] = {"format": STATE_FORMAT, "step": step, "epoch": train.epoch}
    for key, obj in train.stateful():
        state[key] = obj.state_dict()
    state["rng"] = rng_state()
    state["extra"] = dict(train.extra) if train.extra is not None else None
    return state


def capture_rank(loader: Stateful | None = None) -> dict[str, Any]:
    """This rank's own state under torch.distributed: RNG states and the loader position.

    Replicated state (model, optimizer) is the same on every rank and saved once; these
    differ per rank (each rank seeds dropout and shards data its own way), so each rank's
    copy is gathered to rank 0 and saved under ``"ranks"``.
    """
    return {"rng": rng_state(), "loader": loader.state_dict() if loader is not None else None}


def for_rank(state: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """``state`` with rank ``rank``'s own RNG and loader state in place of rank 0's.

    A checkpoint without per-rank state (saved by one process) is returned unchanged; a
    rank the checkpoint has no entry for (the job now has more ranks) raises ``KeyError``,
    since reusing another rank's RNG stream would not be an exact resume.

    >>> saved = {"rng": "r0", "loader": "l0", "ranks": [{"rng": "r0", "loader": "l0"},
    ...                                                 {"rng": "r1", "loader": None}]}
    >>> mine = for_rank(saved, 1)
    >>> mine["rng"], "loader" in mine
    ('r1', False)
    """
    ranks = state.get("ranks")
    if ranks is None:
        return dict(state)
    if not 0 <= rank < len(ranks):
        msg = f"the checkpoint holds the state of {len(ranks)} ranks, not of rank {rank}"
        raise KeyError(msg)
    own = ranks[rank]
    mine = {**state, "rng": own["rng"], "loader": own["loader"]}
    if own["loader"] is None:
        del mine["loader"]
    return mine


def apply(state: Mapping[str, Any], train: TrainState) -> None:
    """Load a captured state into the live objects; ``train.extra`` is updated in place.

    A missing part (e.g. no scheduler was saved) raises ``KeyError`` when the caller
    passes an object for it: silently training on with a fresh scheduler would not be an
    exact resume.
    """
    load_parts(state, train.stateful(), train.extra)
    set_rng_state(state["rng"])


def load_parts(
    state: Mapping[str, Any], parts: Iterable[tuple[str, Stateful]], extra: object
) -> None:
    """Load each ``(key, object)`` of ``parts`` from ``state`` (``KeyError`` for a part it
    does not hold), and put the saved ``extra`` into ``extra`` (a mutable mapping) in place.
    """
    for key, obj in parts:
        if key not in state:
            msg = f"the checkpoint has no {key} state"
            raise KeyError(msg)
        obj.load_state_dict(state[key])
    if isinstance(extra, MutableMapping) and state.get("extra") is not None:
        extra.clear()
        extra.update(state["extra"])


#: Tensor classes whose values are split across ranks: no one rank holds the whole.
SHARDED_TENSORS = frozenset({"DTensor", "ShardedTensor"})


def find_sharded(value: Any, path: str = "") -> str | None:
    """Where in ``value`` a sharded tensor (FSDP2/DTensor, ShardedTensor) is, or ``None``.

    By class name, so that torch.distributed is not imported to ask.

    >>> find_sharded({"model": {"w": 1}}) is None
    True
    """
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if SHARDED_TENSORS & {cls.__name__ for cls in type(item).__mro__}:
            return where or "/"
        if isinstance(item, Mapping):
            stack.extend((v, f"{where}/{k}") for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{where}/{i}") for i, v in enumerate(item))
    return None


class CpuCopier:
    """Copies a nested state into CPU buffers that stay allocated between saves.

    The first copy allocates; later copies of the same shapes reuse the buffers with
    ``copy_`` (about 3x faster than ``clone`` for a large state). The caller must not
    copy again while the previous copy is still being serialised (the Checkpointer keeps
    one save in flight).
    """

    def __init__(self) -> None:
        self._buffers: dict[str, Any] = {}
        #: The buffers the last copy dropped (freed when this list goes).
        self.released: list[Any] = []

    def copy(self, state: Any, *, keep: Any = ()) -> Any:
        """A deep copy of ``state`` whose tensors live in (reused) CPU memory; values of
        the types ``keep`` stay as they are (not copied)."""
        seen: set[str] = set()
        out = self._copy(state, "", seen, _torch().Tensor, keep)
        # Drop buffers of tensors that no longer exist (e.g. a parameter group removed, or
        # frozen tensors an incremental save no longer copies); the caller may free them
        # elsewhere (:attr:`released`): giving back hundreds of MB takes a while.
        self.released = [self._buffers.pop(key) for key in set(self._buffers) - seen]
        return out

    def _copy(self, value: Any, path: str, seen: set[str], tensor: Any, keep: Any) -> Any:
        if isinstance(value, int | float | str | None):
            return value  # immutable leaves, first: the RNG states hold over 1,000 ints
        if keep and isinstance(value, keep):
            return value
        if isinstance(value, tensor):
            seen.add(path)
            src = value.detach()
            buf = self._buffers.get(path)
            if (
                buf is None
                or buf.shape != src.shape
                or buf.dtype != src.dtype
                or buf.layout != src.layout
                or not src.is_contiguous()
            ):
                buf = src.to("cpu", copy=True)
                if buf.data_ptr() == src.data_ptr():  # pragma: no cover - defensive
                    buf = src.clone()
                self._buffers[path] = buf
            else:
                buf.copy_(src)
            return buf
        if isinstance(value, Mapping):
            return {k: self._copy(v, f"{path}/{k}", seen, tensor, keep) for k, v in value.items()}
        if isinstance(value, list):
            if all(isinstance(v, int | float | str | None) for v in value):
                return list(value)  # a list of plain values (an RNG state): no walk
            return [self._copy(v, f"{path}/{i}", seen, tensor, keep) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            items = enumerate(value)
            return tuple(self._copy(v, f"{path}/{i}", seen, tensor, keep) for i, v in items)
        return value  # other immutable values


class _Sink(io.RawIOBase):
    """A write-only in-memory file for ``torch.save`` that copies big writes without the GIL.

    ``io.BytesIO`` copies each tensor's bytes (and its own regrowth) while holding the GIL,
    which stalls the training thread for the whole copy of a background save. Here the
    buffer is sized up front from the tensors' sizes, and big writes are copied without
    the GIL (:func:`~costguard.checkpoint.memcopy.copy_into`).
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self._size = 0
        self._allocate(max(capacity, memcopy.BIG))

    def _allocate(self, capacity: int) -> None:
        old = getattr(self, "_buffer", None)
        # Anonymous memory, not a bytearray: a bytearray is zero-filled with the GIL held
        # (a quarter second for a 600 MB state), here the kernel hands out zeroed pages
        # as the GIL-free copies first touch them.
        self._buffer = mmap.mmap(-1, capacity)
        self._address = memcopy.writable_address(self._buffer)
        if old is not None and self._size:
            self._buffer[: self._size] = memoryview(old)[: self._size]

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = view.nbytes
        end = self._size + n
        if end > len(self._buffer):
            self._allocate(max(end, 2 * len(self._buffer)))
        memcopy.copy_into(self._buffer, self._address, self._size, view)
        self._size = end
        return n

    def view(self) -> memoryview:
        """The bytes written so far (no copy)."""
        return memoryview(self._buffer)[: self._size]


def saved_bytes(value: Any) -> int:
    """About the bytes ``torch.save`` writes for ``value`` (a little more: each tensor's
    whole storage and its record, 64 bytes for anything else)."""
    torch = _torch()
    if isinstance(value, torch.Tensor):
        return int(value.untyped_storage().nbytes()) + 4096
    if isinstance(value, Mapping):
        return sum(saved_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(saved_bytes(v) for v in value)
    return 64


@contextlib.contextmanager
def _without_zip_crc32() -> Iterator[None]:
    """Skip the CRC32 that ``torch.save`` computes per zip record (torch >= 2.6).

    That checksum runs in C++ with the GIL held, so a background save would stall a
    Python-bound training loop for its whole length; the manifest's sha256 already covers
    every byte, and ``torch.load`` reads such files. The setting is process-wide: a
    ``torch.save`` elsewhere in the process while a save serialises also skips it (only
    external unzip tools would notice).
    """
    try:
        from torch.utils.serialization import config
    except ImportError:  # torch < 2.6 has no such setting
        yield
        return
    previous = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        yield
    finally:
        config.save.compute_crc32 = previous


def serialise(state: Any) -> memoryview:
    """``torch.save`` into memory (the bytes can be re-sent on a retry).

    The bytes of ``torch.save`` to a file, minus the zip records' CRC32 (see
    :func:`_without_zip_crc32`), made with the GIL released for the bulk copies (see
    :class:`_Sink`), so training in the main thread keeps its pace.
    """
    torch = _torch()
    sink = _Sink(saved_bytes(state) + (1 << 20))
    with _without_zip_crc32():
        torch.save(state, sink)
    return sink.view()


def torch_save(state: Any, file: Any) -> None:
    """``torch.save`` to a writable file-like object (a streamed upload), as :func:`serialise`."""
    torch = _torch()
    with _without_zip_crc32():
        torch.save(state, file)


#: How ``torch.save``'s zip format (its only format since torch 1.6) begins.
ZIP_MAGIC = b"PK\x03\x04"


def require_zip(head: bytes | memoryview, what: str) -> None:
    """Refuse bytes that are not ``torch.save``'s zip format before ``torch.load`` sees
    them: the legacy format is where ``weights_only=True`` was bypassed (CVE-2025-32434),
    and costguard never writes it.

    >>> require_zip(b"PK\\x05\\x06", "state.pt")
    Traceback (most recent call last):
    ...
    ValueError: state.pt is not in torch.save's zip format
    """
    if bytes(head[: len(ZIP_MAGIC)]) != ZIP_MAGIC:
        msg = f"{what} is not in torch.save's zip format"
        raise ValueError(msg)


def deserialise(data: bytes | memoryview) -> Any:
    """``torch.load`` of zip-format bytes with ``weights_only=True`` onto the CPU."""
    require_zip(data, "the state")
    return _torch().load(io.BytesIO(data), map_location="cpu", weights_only=True)


def load_file(path: str) -> Any:
    """``torch.load`` of a local zip-format file with ``weights_only=True``, its tensors
    mapped from the file (``mmap=True``) rather than read into memory: pages are read as
    the live objects copy them, and a tensor nobody copies (optimizer state taken as is)
    costs memory only once it is written (the mapping is private: the file never changes)."""
    with Path(path).open("rb") as file:
        require_zip(file.read(len(ZIP_MAGIC)), Path(path).name)
    return _torch().load(path, map_location="cpu", weights_only=True, mmap=True)


class ResumableLoader:
    """A DataLoader that can stop mid-epoch and resume without repeating or skipping samples.

    Each epoch visits the dataset in the order of a permutation seeded by
    ``(seed, epoch)``; the state is the epoch and how many batches the training loop has
    *taken* (not how many worker processes prefetched). After ``load_state_dict`` the
    next iteration starts at the first batch not yet taken.

    Example, with torch installed::

        loader = ResumableLoader(dataset, batch_size=32, seed=0)
        for epoch in range(loader.epoch, epochs):
            for batch in loader:      # yields the rest of the current epoch
                ...
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        **loader_kwargs: Any,
    ) -> None:
        if batch_size < 1:
            msg = f"batch_size must be at least 1, not {batch_size}"
            raise ValueError(msg)
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.loader_kwargs = loader_kwargs
        self.epoch = 0
        self.batches_taken = 0

    def _order(self) -> list[int]:
        torch = _torch()
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        generator = torch.Generator()
        generator.manual_seed(self.seed * 1_000_003 + self.epoch)
        return [int(i) for i in torch.randperm(n, generator=generator)]

    def _generator(self) -> Any:
        generator = _torch().Generator()
        generator.manual_seed(self.seed * 1_000_003 + self.epoch + 1)
        return generator

    def __len__(self) -> int:
        """Batches per full epoch."""
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        """The batches of the current epoch not yet taken; the epoch advances at its end."""
        torch = _torch()
        order = self._order()
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        remaining = batches[self.batches_taken :]
        if remaining:
            # DataLoader draws a worker base seed from the global torch RNG each time an
            # iterator starts; a resume starts one more than an uninterrupted run, so give
            # it its own generator or the model's RNG stream (dropout) would shift.
            options = {"generator": self._generator(), **self.loader_kwargs}
            loader = torch.utils.data.DataLoader(self.dataset, batch_sampler=remaining, **options)
            for batch in loader:
                self.batches_taken += 1
                yield batch
        self.epoch += 1
        self.batches_taken = 0

    def state_dict(self) -> dict[str, int]:
        """Where the loader stands: ``{"epoch", "batches_taken", "seed"}``."""
        return {"epoch": self.epoch, "batches_taken": self.batches_taken, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume at ``state`` (from :meth:`state_dict`)."""
        if int(state["seed"]) != self.seed:
            msg = f"the checkpoint's loader seed {state['seed']} is not this loader's {self.seed}"
            raise ValueError(msg)
        self.epoch = int(state["epoch"])
        self.batches_taken = int(state["batches_taken"])
