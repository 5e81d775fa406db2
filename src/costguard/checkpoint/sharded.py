"""Sharded state (FSDP2, DTensor) through torch.distributed.checkpoint (DCP), on a Store.

A model sharded across ranks cannot be saved by one rank: each rank holds its own shards.
Here every rank writes its own shards at once, as one object of the checkpoint folder,
through DCP's planner (which also dedups what the ranks share) and a DCP storage layer on
the Store (:mod:`~costguard.checkpoint.dcp_storage`), and DCP's resharding loads them back
on any number of ranks. costguard's guarantees stay on top:

* **One folder, one manifest.** A sharded checkpoint is ``ckpt-<step>-<id>/`` holding
  ``shard-<rank>.distcp`` (one per rank that had something to write), ``dcp.metadata``
  (DCP's index of every chunk) and ``train.pt`` (step, scheduler, ``extra``, and every
  rank's RNG and loader state). Each object's sha256 is computed while it is written;
  DCP gathers every rank's results to rank 0 only after each rank's object is durable,
  and rank 0 writes ``manifest.json`` last. A rank that fails (or is killed) leaves no
  manifest: the folder stays partial and the restore falls back.
* **A layout older costguards skip.** The manifest has ``format_version``
  :data:`~costguard.checkpoint.manifest.SHARDED_FORMAT_VERSION`: a costguard that reads
  only the replicated layout finds it "written by a newer costguard", unreadable, so it
  is skipped and kept, never taken for corrupt.
* **Verified, then loaded.** The ranks share the verification (object ``i`` is hashed by
  rank ``i % world``) and agree on the verdict before DCP copies a byte into the model:
  a mismatch anywhere makes every rank try the previous checkpoint, so no rank is left
  half-loaded from a corrupt one. The objects are never rewritten (every save has a
  folder of its own), so what was verified is what is then read.
* **Nothing runs code.** Tensors are stored as raw bytes (dtype and shape in the
  index); ``dcp.metadata``, ``train.pt`` and DCP's non-tensor values (an optimizer's
  ``param_groups``) load with ``torch.load(weights_only=True)``.

* **Training waits for a copy, not for the write.** The training thread only stages the
  save (:func:`stage`: no collective): the pooled chunks unchanged since the last save
  are referred to, the rest is copied into warm CPU buffers, and the shards are written
  from that copy on the save thread (:func:`write`), over a process group of the save's
  own, so DCP's collectives never interleave with the training loop's. A save that would
  copy more than :data:`COPY_SHARE` of the rank's state (the first one, a model that
  trains everything) copies nothing and is written before training resumes: sharded
  models are split to fit, and a second copy would double their memory.

``model`` and ``optimizer`` may be sharded; the other parts are
replicated or per rank and go into ``train.pt``. Restoring on another number of ranks
reshards the model and optimizer exactly; each rank's RNG and loader state come back only
on as many ranks as saved (otherwise they start afresh, with a warning).

torch is imported inside the functions: ``import costguard`` stays light.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from costguard.checkpoint import state as state_mod
from costguard.checkpoint.dcp_storage import (
    METADATA,
    load_planner,
    object_entry,
    save_planner,
    storage_reader,
    storage_writer,
)
from costguard.checkpoint.distributed import Group
from costguard.checkpoint.manifest import (
    SHARDED_FORMAT_VERSION,
    Manifest,
    ManifestError,
    ObjectEntry,
    UnreadableError,
    parse_name,
    restore_order,
)
from costguard.checkpoint.restoring import MISFIT, Restorer, Skipped
from costguard.checkpoint.saving import SaveResult, Written, commit
from costguard.checkpoint.shard_pool import ShardPool
from costguard.checkpoint.state import TrainState
from costguard.checkpoint.store import Store
from costguard.errors import CostguardError, InputError
from costguard.logs import get_logger
from costguard.secrets import redact
from costguard.text import visible

logger = get_logger(__name__)

#: Step, epoch, scheduler, scaler, ``extra`` and every rank's RNG and loader state.
TRAIN = "train.pt"
#: The parts that may hold sharded tensors (saved through DCP).
SHARDED_PARTS = ("model", "optimizer")
#: A save copies the state (and returns before it is written) when what it must copy is
#: at most this share of the rank's state (see :func:`stage`).
COPY_SHARE = 0.25


class ShardedStateError(InputError):
    """The state holds sharded tensors (FSDP2, DTensor) that costguard cannot save here."""


def find(parts: TrainState) -> str | None:
    """Where in the training state a sharded tensor is (``/model/...``), or ``None``."""
    state = {name: obj.state_dict() for name, obj in parts.stateful()}
    if parts.extra is not None:
        state["extra"] = dict(parts.extra)
    return state_mod.find_sharded(state)


def detect(parts: TrainState) -> bool:
    """Whether the state is sharded and saved through DCP; raises
    :class:`ShardedStateError` for a sharded state that cannot be (better no save than
    half of one).

    Sharded tensors are handled in the model and the optimizer, under an initialised
    torch.distributed process group (every rank writes its own shards).
    """
    where = find(parts)
    if where is None:
        return False
    part = where.strip("/").split("/", 1)[0]
    if part not in SHARDED_PARTS:
        msg = f"the {part} state holds sharded tensors (FSDP2 / DTensor, at {where[:120]})"
        raise ShardedStateError(
            msg,
            hint="only the model and the optimizer may be sharded; keep plain values "
            f"(or full tensors) in the {part}",
        )
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        msg = (
            f"the training state holds sharded tensors (FSDP2 / DTensor, at {where[:120]}) "
            "but no torch.distributed process group is initialised: the other ranks' "
            "shards cannot be written"
        )
        raise ShardedStateError(
            msg,
            hint="make the Checkpointer calls on every rank while the process group is up "
            "(after init_process_group, before destroy_process_group)",
        )
    return True


def load_whole(store: Store, manifest: Manifest) -> dict[str, Any]:
    """The whole state of a sharded checkpoint in this one process, verified: ``model``
    and ``optimizer`` as full tensors keyed by parameter name (as ``get_state_dict`` gives
    them), plus what ``train.pt`` holds (``step``, ``epoch``, ``extra``, the scheduler).

    For ``costguard checkpoint export`` and :func:`~costguard.checkpoint.load_state`: no
    model, no process group. It holds the whole state in memory.
    """
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    object_entry(manifest, METADATA)  # both must be listed
    object_entry(manifest, TRAIN)
    _verify_share(store, manifest, 0, 1)
    state: dict[str, Any] = {}
    reader = storage_reader(store, manifest)
    reader.read_metadata()  # its errors raised here: DCP would log them with a traceback
    try:
        # What torch's dcp_to_torch_save calls: dcp.load would not fill an empty dict.
        _load_state_dict(
            state,
            storage_reader=reader,
            planner=load_planner(whole=True),
            no_dist=True,
        )
    except dcp.CheckpointException as exc:
        msg = f"{manifest.name} cannot be loaded: {_describe(exc)}"
        raise UnreadableError(msg) from exc
    entry = object_entry(manifest, TRAIN)
    with store.verified_file(manifest.object_path(entry), entry.size_bytes, entry.sha256) as path:
        try:
            train = state_mod.load_file(path)
        except Exception as exc:
            # Verified bytes this torch cannot read (as Restorer.load): no proof of
            # corruption, so the checkpoint is skipped and kept, and the previous one tried.
            msg = f"{TRAIN} cannot be loaded: {type(exc).__name__}: {redact(str(exc))[:200]}"
            raise UnreadableError(msg) from exc
    if not isinstance(train, dict):
        msg = f"{TRAIN} is not a costguard training state"
        raise UnreadableError(msg)
    return {**train, **state}


# -- the state DCP saves -------------------------------------------------------------


def dcp_state(parts: TrainState) -> dict[str, Any]:
    """The sharded parts as DCP state dicts (``get_state_dict`` for a module and its
    optimizer: keys by parameter name, the same on any number of ranks)."""
    torch = state_mod._torch()
    from torch.distributed.checkpoint import state_dict as sd

    model, optimizer = parts.model, parts.optimizer
    state: dict[str, Any] = {}
    if isinstance(model, torch.nn.Module):
        if isinstance(optimizer, torch.optim.Optimizer):
            state["model"], state["optimizer"] = sd.get_state_dict(model, optimizer)
            return state
        state["model"] = sd.get_model_state_dict(model)
    elif model is not None:
        state["model"] = model.state_dict()
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    return state


def apply_dcp_state(parts: TrainState, state: Mapping[str, Any]) -> None:
    """Load what :func:`dcp_state` described (filled in by ``dcp.load``) into the objects."""
    torch = state_mod._torch()
    from torch.distributed.checkpoint import state_dict as sd

    model, optimizer = parts.model, parts.optimizer
    if isinstance(model, torch.nn.Module):
        if isinstance(optimizer, torch.optim.Optimizer):
            sd.set_state_dict(
                model,
                optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optimizer"],
            )
            return
        sd.set_model_state_dict(model, state["model"])
    elif model is not None:
        model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])


def train_state(steps_done: int, parts: TrainState) -> dict[str, Any]:
    """What goes into ``train.pt`` but every rank's own state (``ranks``): everything but
    the sharded parts."""
    state: dict[str, Any] = {
        "format": state_mod.STATE_FORMAT,
        "step": steps_done,
        "epoch": parts.epoch,
        "extra": dict(parts.extra) if parts.extra is not None else None,
    }
    for key in ("scheduler", "scaler"):
        obj = getattr(parts, key)
        if obj is not None:
            state[key] = obj.state_dict()
    return state


# -- save (collective) and restore (collective) --------------------------------------


@dataclass
class Staged:
    """One rank's part of a sharded save, taken on the training thread (:func:`stage`),
    for :func:`write`."""

    steps_done: int
    reason: str
    epoch: int | None
    #: The state DCP plans the save from: with ``copied``, its values copied but for the
    #: DTensors, which serve for their shapes and layout only (see ``tensors``).
    state: dict[str, Any] = field(default_factory=dict)
    #: DCP's name of each DTensor -> the local tensor written: a copy, or the live one
    #: (a pooled chunk unchanged since the last save, or without ``copied``).
    tensors: dict[str, Any] = field(default_factory=dict)
    #: This rank's RNG and loader state; on the coordinator, ``train.pt`` but ``ranks``.
    rank: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] | None = None
    #: Whether the state was copied: training may go on while :func:`write` runs.
    copied: bool = False
    started: float = 0.0
    stall_s: float = 0.0
    #: Why the state could not be staged on this rank (then no rank writes anything).
    error: str | None = None


def stage(
    parts: TrainState,
    steps_done: int,
    reason: str,
    pool: ShardPool,
    copier: state_mod.CpuCopier,
    *,
    coordinator: bool,
) -> Staged:
    """This rank's part of a save, on the training thread; no collective, never raises.

    The pooled chunks unchanged since the last save (see :meth:`ShardPool.stage`) are
    not copied. When what is left to copy is at most :data:`COPY_SHARE` of this rank's
    state (a LoRA fine-tune: the adapters and their optimizer state), it is copied into
    warm CPU buffers and the save can be written while training goes on; otherwise
    (the first save, a model that trains everything) nothing is copied and the save is
    written before training resumes, as without a copy: a second copy of the whole state
    would double the memory a sharded model is split to save.
    """
    staged = Staged(steps_done, reason, parts.epoch, started=time.perf_counter())
    try:
        torch = state_mod._torch()
        from torch.distributed.checkpoint._nested_dict import flatten_state_dict
        from torch.distributed.tensor import DTensor

        pool.begin(parts.model, parts.optimizer)
        staged.state = dcp_state(parts)
        flat, _ = flatten_state_dict(staged.state)
        live: dict[str, Any] = {}
        total = left = 0
        for fqn, value in flat.items():
            if not isinstance(value, torch.Tensor):
                continue
            local = value.to_local() if isinstance(value, DTensor) else value
            size = local.numel() * local.element_size()
            total += size
            # Only a DTensor's local tensor can be left out of the copy (a plain tensor is
            # copied where it lies in the state); a pooled one is still noted.
            if pool.stage(fqn, value, local) and isinstance(value, DTensor):
                staged.tensors[fqn] = local.detach()
                continue
            left += size
            if isinstance(value, DTensor):
                live[fqn] = local
        staged.rank = state_mod.capture_rank(parts.loader)
        staged.train = train_state(steps_done, parts) if coordinator else None
        staged.copied = left <= COPY_SHARE * total
        taken = {"state": staged.state, "tensors": live, "rank": staged.rank}
        # Without a copy, the warm buffers of earlier copies are given back.
        copied = copier.copy(
            {**taken, "train": staged.train} if staged.copied else {}, keep=DTensor
        )
        copier.released = []
        if staged.copied:
            staged.state, staged.rank, staged.train = (
                copied["state"],
                copied["rank"],
                copied["train"],
            )
            staged.tensors.update(copied["tensors"])
        else:
            staged.tensors = {}  # the live state as it lies
    except Exception as exc:
        staged.error, staged.copied = _describe(exc), False
    staged.stall_s = time.perf_counter() - staged.started
    return staged


def write(store: Store, group: Group, name: str, staged: Staged, pool: ShardPool) -> Written:
    """Write the save :func:`stage` took as checkpoint ``name`` (rank 0's name counts);
    every rank calls it, on ``group``, on the save thread when the state was copied.

    Every rank writes its shards (its frozen ones to ``pool`` when not already there),
    rank 0 also ``train.pt``; rank 0 writes the manifest only when every object is
    durable. Every rank gets the same outcome; rank 0 also the committed manifest.
    Errors are reported in the result, never raised.
    """
    from torch.distributed import checkpoint as dcp

    gathered = group.gather((staged.error, staged.rank))
    error: str | None = None
    ranks: list[Any] | None = None
    if gathered is not None:
        error = next((f"rank {r}: {e}" for r, (e, _) in enumerate(gathered) if e), None)
        ranks = [rank for _, rank in gathered]
    name, error = group.broadcast((name, error))
    objects: list[ObjectEntry] = []
    train: Future[tuple[int, str]] | None = None
    writer = storage_writer(store, name, pool)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="costguard-train-pt") as executor:
        if error is None and ranks is not None and staged.train is not None:
            # Rank 0 writes train.pt while its shards go out: both are on its critical path.
            snapshot = {**staged.train, "ranks": ranks}
            train = executor.submit(
                store.write_stream,
                f"{name}/{TRAIN}",
                lambda file: state_mod.torch_save(snapshot, file),
            )
        try:
            if error is None:
                dcp.save(
                    staged.state,
                    storage_writer=writer,
                    planner=save_planner(staged.tensors),
                    process_group=group.pg,
                )
        except (Exception, dcp.CheckpointException) as exc:  # DCP's is a BaseException
            error = _describe(exc)
    if train is not None:
        try:
            objects.append(ObjectEntry(TRAIN, *train.result()))
        except Exception as exc:
            error = error or _describe(exc)
    manifest = None
    if group.rank == 0 and error is None:
        try:
            # The commit: every rank's objects are durable (DCP gathered their results).
            manifest = commit(
                store,
                name,
                staged.steps_done,
                tuple(sorted([*objects, *writer.objects])),
                epoch=staged.epoch,
                reason=staged.reason,
                format_version=SHARDED_FORMAT_VERSION,
                extra={"layout": "dcp", "world_size": group.world_size},
            )
        except Exception as exc:
            error = _describe(exc)
    error = group.broadcast(error)
    pool.committed(error is None)
    written = group.gather(writer.written_bytes)
    size = manifest.size_bytes if manifest is not None else 0
    unique = {o.name: o.size_bytes for o in manifest.objects} if manifest is not None else {}
    save_s = time.perf_counter() - staged.started
    result = SaveResult(
        name,
        staged.steps_done,
        staged.reason,
        ok=error is None,
        size_bytes=size,
        # Training waited for the copy; without one, for all of it.
        stall_s=staged.stall_s if staged.copied else save_s,
        save_s=save_s,
        error=error,
        # The shards and new pool objects every rank wrote, train.pt and dcp.metadata.
        uploaded_bytes=sum(written or ()) + sum(unique.get(n, 0) for n in (TRAIN, METADATA)),
    )
    return result, manifest


def _describe(exc: BaseException) -> str:
    """One line about an error; for DCP's, each failed rank's own error (no traceback)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        text = "; ".join(
            f"rank {rank}: {type(wrapped[0]).__name__}: {wrapped[0]}"
            for rank, wrapped in sorted(failures.items())
        )
    else:
        text = f"{type(exc).__name__}: {exc}"
    return visible(redact(text))[:500]  # torch's own messages carry ANSI codes


def _verify_share(store: Store, manifest: Manifest, rank: int, world: int) -> None:
    """Hash this rank's share of the checkpoint's objects (object ``i`` on rank ``i % world``)."""
    for i, entry in enumerate(sorted(manifest.objects)):
        if i % world == rank:
            with store.verified_file(manifest.object_path(entry), entry.size_bytes, entry.sha256):
                pass


def _verdict(store: Store, restorer: Restorer, name: str, group: Group) -> tuple[str, str, Any]:
    """Every rank's verdict on checkpoint ``name``: ("ok" | "corrupt" | "doubtful", why,
    manifest), the same on every rank."""
    mine: tuple[str, str] = ("ok", "")
    manifest = None
    try:
        manifest = restorer.manifest(name)
        if manifest.format_version != SHARDED_FORMAT_VERSION:
            mine = ("doubtful", "a replicated checkpoint (state.pt): this run's state is sharded")
        else:
            object_entry(manifest, METADATA)
            object_entry(manifest, TRAIN)
            _verify_share(store, manifest, group.rank, group.world_size)
    except ManifestError as exc:
        mine = ("corrupt", exc.message)
    except CostguardError as exc:
        mine = ("doubtful", redact(exc.message))
    except Exception as exc:
        mine = ("doubtful", _describe(exc))
    verdicts = group.all_gather(mine)
    for kind in ("corrupt", "doubtful"):
        for rank, (got, why) in enumerate(verdicts):
            if got == kind:
                return kind, f"{why} (rank {rank})", manifest
    return "ok", "", manifest


def restore(
    store: Store,
    restorer: Restorer,
    group: Group,
    parts: TrainState,
    pool: ShardPool | None = None,
) -> tuple[Manifest | None, list[Skipped]]:
    """Load the newest sharded checkpoint that verifies into ``parts``; collective.

    Rank 0 lists the candidates; every rank verifies its share of each in turn and all
    agree on the verdict before anything is loaded: a corrupt one is recorded (retention
    may delete it), a doubtful one skipped and kept, and the previous one tried; so is one
    that verifies but that some rank cannot take (:func:`_load`: a forger's index, chunks
    or ``train.pt``), whose parts loaded so far the previous one then replaces. Returns
    the manifest loaded, or ``None`` (nothing changed) when none verifies, and (on rank 0)
    every checkpoint that could not be used, for
    :func:`~costguard.checkpoint.restoring.fallback`. The chunks loaded whole from pool
    objects count as unchanged in ``pool`` (the next save does not write them again).
    """
    names: list[str] | None = None
    skipped: list[Skipped] = []
    condemned: set[str] = set()
    if group.rank == 0:
        survey = restorer.survey()
        names = [m.name for m in restore_order(survey.manifests, survey.sizes)]
        skipped, condemned = survey.skipped(), survey.condemned
    names = group.broadcast(names) or []
    chosen: Manifest | None = None
    for name in names:
        kind, why, manifest = _verdict(store, restorer, name, group)
        if kind == "corrupt" or kind == "doubtful" or manifest is None:
            skipped.append(Skipped(name, parse_name(name) or 0, why, kept=kind != "corrupt"))
            continue
        reader = storage_reader(store, manifest)
        misfit = _load(store, manifest, reader, parts, group)
        if misfit:
            # Verified bytes that are no state these objects can take (anyone who can
            # write the store may leave such): kept, and the previous one tried, which
            # puts back every part this one may have loaded before it failed.
            skipped.append(Skipped(name, manifest.step, misfit, kept=True))
            continue
        if pool is not None:
            pool.adopt((parts.model, parts.optimizer), dcp_state(parts).get("model", {}), {
                (index.fqn, tuple(int(n) for n in index.offset or ())): (pooled, where.dtype)
                for index, where in reader.storage.items()
                for pooled in manifest.objects
                if pooled.pool and pooled.name == where.object
            })  # fmt: skip
        chosen = manifest
        break
    if group.rank != 0:
        return chosen, []
    restorer.condemn([s for s in skipped if s.name not in condemned])
    return chosen, skipped


def _load(store: Store, manifest: Manifest, reader: Any, parts: TrainState, group: Group) -> str:
    """Load checkpoint ``manifest`` into ``parts`` on every rank (collective): ``""``, or
    why it does not fit on some rank (:data:`MISFIT`: then every rank says so, and the
    parts may hold some of it). Whatever its verified objects hold (a forger's index,
    chunks, values or ``train.pt``), torch and the objects' errors end here, never in the
    caller: no rank goes on alone to load another while the others wait."""
    from torch.distributed import checkpoint as dcp

    mine = ""
    try:
        reader.read_metadata()  # checked here: DCP would log its errors with a traceback
        state = dcp_state(parts)
        dcp.load(state, storage_reader=reader, planner=load_planner())
        apply_dcp_state(parts, state)
        _apply_train(store, manifest, parts, group)
    except (Exception, dcp.CheckpointException) as exc:  # the latter: a BaseException
        mine = f"{MISFIT}: {_describe(exc)}"[:300]
        logger.debug("costguard: %s %s", manifest.name, mine)
    said = group.all_gather(mine)
    return next((f"{why} (rank {rank})" for rank, why in enumerate(said) if why), "")


def _apply_train(store: Store, manifest: Manifest, parts: TrainState, group: Group) -> None:
    entry = object_entry(manifest, TRAIN)
    with store.verified_file(manifest.object_path(entry), entry.size_bytes, entry.sha256) as path:
        data = state_mod.load_file(path)
    if not isinstance(data, Mapping):
        msg = f"{TRAIN} holds a {type(data).__name__}, not a training state"
        raise TypeError(msg)
    ranks = data.get("ranks") or []
    if not isinstance(ranks, list) or not all(isinstance(r, Mapping) for r in ranks):
        msg = f"{TRAIN} holds no list of every rank's state"
        raise TypeError(msg)
    if len(ranks) == group.world_size:
        own = ranks[group.rank]
        state_mod.set_rng_state(own["rng"])
        if parts.loader is not None:
            if own.get("loader") is None:
                msg = "the checkpoint has no loader state"
                raise KeyError(msg)
            parts.loader.load_state_dict(own["loader"])
    elif group.rank == 0:
        logger.warning(
            "costguard: %s was saved by %d ranks and is restored on %d: the model and "
            "optimizer are resharded exactly; each rank's RNG and data loader position "
            "start afresh",
            manifest.name,
            len(ranks),
            group.world_size,
        )
    unsharded = [(key, obj) for key, obj in parts.stateful() if key in ("scheduler", "scaler")]
    state_mod.load_parts(data, unsharded, parts.extra)
