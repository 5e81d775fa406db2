"""A sharded (FSDP2, DTensor through DCP) restore on a store a bucket writer has filled
(issue 43): next to one genuine sharded checkpoint (step 10) hypothesis writes newer ones
made from its objects, each with at least one thing no restore may take: a forged
``dcp.metadata`` (a pickle that would run code, the legacy format, no index at all,
chunks of another shape or dtype, past their object's end, in an object the manifest does
not list, chunks that overlap, a key missing, sizes that are not the model's), forged
shards (cut short, empty, an optimizer value that would run code), a forged ``train.pt``
(the forgeries of :mod:`test_hostile_restore`), manifests without the index, and the
hostile manifests of :mod:`test_hostile_manifests`. Most manifests verify (sizes and
sha256 match what was forged); some do not. Forged weights that fit are written beside
some of them, so that a restore that loads part of a forgery before it refuses it leaves
forged tensors behind unless it puts the genuine ones back whole.

Whatever is there, the restore puts back the genuine step, bit for bit (weights,
optimizer, scheduler, ``extra``, the RNG), or refuses with costguard's own error: never
another exception, never code run, never a forged value left. One gloo rank in this
process (the real FSDP2 and DCP paths); a 2-rank run through tests/helpers/ranks.py,
where only one rank's share of a checkpoint is forged, checks that the ranks agree.
``load_state`` (``checkpoint export``), which assembles the whole state in one process,
passes over every forgery that is no whole state. Derandomized, a bounded number of
examples.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import pickle
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from costguard.checkpoint import Checkpointer, load_state
from costguard.checkpoint.dcp_storage import METADATA, Stored, _safe_globals
from costguard.checkpoint.manifest import MANIFEST_FILE, checkpoint_name
from costguard.checkpoint.sharded import TRAIN
from costguard.errors import CostguardError
from tests.checkpoint.test_hostile_manifests import hostile
from tests.checkpoint.test_hostile_restore import RunsCode, saved
from tests.checkpoint.test_sharded import full, sharded_model, train
from tests.checkpoint.test_sharded_ranks import final, run_ranks
from tests.checkpoint.test_trust import FAST
from tests.helpers.training import RANKS, SCRIPTS, assert_bitwise_equal
from tests.spot.test_hostile_records_property import reproducible

SHARD = "shard-00000.distcp"
GENUINE_STEP = 10

#: A checkpoint's objects by name.
Objects = dict[str, bytes]


def index(objects: Objects) -> Any:
    """The genuine ``dcp.metadata``, loaded as costguard loads it."""
    with torch.serialization.safe_globals(_safe_globals()):
        return torch.load(io.BytesIO(objects[METADATA]), weights_only=True)


def reindexed(objects: Objects, change: Callable[[Any], None]) -> Objects:
    """``objects`` with ``dcp.metadata`` loaded, changed in place by ``change``, saved."""
    meta = index(objects)
    change(meta)
    return {**objects, METADATA: saved(meta)}


def stored(change: Callable[[str, Stored], Stored | None], tensors: bool = True) -> Any:
    """A change of every chunk's :class:`Stored` (its tensors', or its values')."""

    def apply(meta: Any) -> None:
        for key, where in list(meta.storage_data.items()):
            if (where.dtype is not None) == tensors:
                new = change(key.fqn, where)
                if new is not None:
                    meta.storage_data[key] = new

    return apply


def first_tensor(change: Callable[[Stored], Stored]) -> Any:
    """A change of the first tensor chunk only (by name, the same every time)."""
    chosen: list[str] = []

    def one(fqn: str, where: Stored) -> Stored | None:
        if not chosen:
            chosen.append(fqn)
        return change(where) if fqn == chosen[0] else None

    return stored(one)


def without_a_key(meta: Any) -> None:
    name = sorted(meta.state_dict_metadata)[0]
    del meta.state_dict_metadata[name]
    for key in [k for k in meta.storage_data if k.fqn == name]:
        del meta.storage_data[key]


def other_sizes(meta: Any) -> None:
    for value in meta.state_dict_metadata.values():
        if hasattr(value, "size") and len(value.size) == 2:
            value.size = torch.Size([value.size[0] + 1, value.size[1]])


def overlapping(meta: Any) -> None:
    """The first tensor of 3 rows or more (one chunk) indexed as two chunks that overlap by
    a row, each pointing at its rows' genuine bytes: their sizes still add up to the
    tensor's, and a whole load leaves its last row as it was."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    for fqn, value in sorted(meta.state_dict_metadata.items()):
        size = getattr(value, "size", None)
        if size is None or len(size) != 2 or size[0] < 3 or len(value.chunks) != 1:
            continue
        rows, columns = size
        (key,) = [k for k in meta.storage_data if k.fqn == fqn]
        where = meta.storage_data.pop(key)
        row = where.length // rows
        half = rows // 2
        value.chunks = [
            ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([half, columns])),
            ChunkStorageMetadata(torch.Size([half - 1, 0]), torch.Size([rows - half, columns])),
        ]
        first, second = value.chunks
        meta.storage_data[MetadataIndex(fqn, first.offsets)] = dataclasses.replace(
            where, length=half * row, shape=(half, columns)
        )
        meta.storage_data[MetadataIndex(fqn, second.offsets)] = dataclasses.replace(
            where,
            offset=where.offset + (half - 1) * row,
            length=(rows - half) * row,
            shape=(rows - half, columns),
        )
        return
    raise AssertionError("no tensor of 3 rows or more in the index")


def value_runs_code(objects: Objects) -> Objects:
    """Every non-tensor value (the optimizer's ``param_groups``) pointed at a pickle that
    would run code, appended to the shard."""
    payload = saved(RunsCode())
    shard = objects[SHARD]
    at = len(shard)
    forged = reindexed(
        objects,
        stored(lambda _, w: dataclasses.replace(w, offset=at, length=len(payload)), False),
    )
    return {**forged, SHARD: shard + payload}


def legacy(value: object) -> bytes:
    """``value`` in torch.save's pre-zip format (where ``weights_only`` was bypassed)."""
    buffer = io.BytesIO()
    torch.save(value, buffer, _use_new_zipfile_serialization=False)
    return buffer.getvalue()


def train_payload(make: Callable[[dict[str, Any]], bytes]) -> Callable[[Objects], Objects]:
    def apply(objects: Objects) -> Objects:
        state = torch.load(io.BytesIO(objects[TRAIN]), weights_only=True)
        return {**objects, TRAIN: make(state)}

    return apply


#: What a forger does to a copy of the genuine checkpoint's objects; none of these is a
#: state this run can take.
FORGERIES: dict[str, Callable[[Objects], Objects]] = {
    "index runs code": lambda o: {**o, METADATA: pickle.dumps(RunsCode())},
    "index zip runs code": lambda o: {**o, METADATA: saved(RunsCode())},
    "index legacy format": lambda o: {**o, METADATA: legacy(index(o))},
    "index is a dict": lambda o: {**o, METADATA: saved({"storage_data": {}})},
    "index is text": lambda o: {**o, METADATA: b"not an index"},
    "chunk of another shape": lambda o: reindexed(
        o, first_tensor(lambda w: dataclasses.replace(w, shape=tuple(reversed(w.shape or ()))))
    ),
    "chunk of more elements": lambda o: reindexed(
        o, first_tensor(lambda w: dataclasses.replace(w, shape=(10**12,)))
    ),
    "chunk of another dtype": lambda o: reindexed(
        o, stored(lambda _, w: dataclasses.replace(w, dtype="torch.int32"))
    ),
    "chunk of a wider dtype": lambda o: reindexed(
        o, first_tensor(lambda w: dataclasses.replace(w, dtype="torch.float64"))
    ),
    "chunk of no dtype": lambda o: reindexed(
        o, first_tensor(lambda w: dataclasses.replace(w, dtype="torch.evil"))
    ),
    "chunk past the end": lambda o: reindexed(
        o, first_tensor(lambda w: dataclasses.replace(w, offset=len(o[SHARD]) + 64))
    ),
    "chunk cut short": lambda o: reindexed(
        o, first_tensor(lambda w: dataclasses.replace(w, length=max(w.length - 4, 0)))
    ),
    "chunk in another object": lambda o: reindexed(
        o, first_tensor(lambda w: dataclasses.replace(w, object="../../outside.distcp"))
    ),
    "chunk in train.pt": lambda o: reindexed(
        o, first_tensor(lambda w: dataclasses.replace(w, object=TRAIN, offset=0))
    ),
    "chunks overlap": lambda o: reindexed(o, overlapping),
    "index lacks a key": lambda o: reindexed(o, without_a_key),
    "index of other sizes": lambda o: reindexed(o, other_sizes),
    "value runs code": value_runs_code,
    "shard cut short": lambda o: {**o, SHARD: o[SHARD][: len(o[SHARD]) // 2]},
    "shard empty": lambda o: {**o, SHARD: b""},
    "no index": lambda o: {k: v for k, v in o.items() if k != METADATA},
    "no train.pt": lambda o: {k: v for k, v in o.items() if k != TRAIN},
    "train.pt a list": train_payload(lambda s: saved([1, 2, 3])),
    "train.pt runs code": train_payload(lambda s: pickle.dumps(RunsCode())),
    "train.pt not a zip": train_payload(lambda s: b"\x80\x04not a torch file"),
    "ranks is text": train_payload(lambda s: saved({**s, "ranks": "x"})),
    "ranks hold text": train_payload(lambda s: saved({**s, "ranks": ["x"]})),
    "rank rng is text": train_payload(lambda s: saved({**s, "ranks": [{"rng": "x"}]})),
    "rng torch wrong": train_payload(
        lambda s: saved({**s, "ranks": [{**s["ranks"][0], "rng": {"torch": torch.zeros(3)}}]})
    ),
    "extra is a list": train_payload(lambda s: saved({**s, "extra": [1]})),
    "scheduler is odd": train_payload(lambda s: saved({**s, "scheduler": 5})),
    "no scheduler": train_payload(
        lambda s: saved({k: v for k, v in s.items() if k != "scheduler"})
    ),
}


def forged_weights(objects: Objects) -> Objects:
    """Every tensor chunk's bytes made 7.0 (float32): weights that fit, and a forged
    ``extra`` key; alone, a checkpoint of the forger's own that a restore would take."""
    meta = index(objects)
    shard = bytearray(objects[SHARD])
    seven = torch.tensor([7.0]).view(torch.uint8).numpy().tobytes()
    for where in meta.storage_data.values():
        if where.object == SHARD and where.dtype == "torch.float32":
            shard[where.offset : where.offset + where.length] = seven * (where.length // 4)
    state = torch.load(io.BytesIO(objects[TRAIN]), weights_only=True)
    state["extra"] = {**(state.get("extra") or {}), "forged": 1, "seen": -7}
    return {**objects, SHARD: bytes(shard), TRAIN: saved(state)}


def genuine(root: Path) -> tuple[Any, ...]:
    """The run's own sharded checkpoint at step 10 in ``root``: what a restore must give."""
    model, opt = sharded_model()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    torch.manual_seed(1)
    for _ in range(GENUINE_STEP):
        train(model, opt)
        sched.step()
    extra = {"seen": GENUINE_STEP}
    with Checkpointer(str(root), every_steps=100, retry=FAST, incremental=False) as ckpt:
        ckpt.save(GENUINE_STEP - 1, model=model, optimizer=opt, scheduler=sched, extra=extra)
        ckpt.flush()
    return full(model, opt), sched.state_dict(), dict(extra), torch.get_rng_state()


def genuine_objects(root: Path) -> tuple[dict[str, Any], Objects]:
    (folder,) = root.glob(f"ckpt-{GENUINE_STEP:012d}-*")
    doc = json.loads((folder / MANIFEST_FILE).read_text())
    return doc, {o["name"]: (folder / o["name"]).read_bytes() for o in doc["objects"]}


def forge(root: Path, step: int, objects: Objects, *, matching: bool = True) -> None:
    """A sharded checkpoint at ``step`` of ``objects``, its manifest the genuine one's
    renamed, listing them with their sizes and sha256 (``matching``), or the genuine
    entries (then some do not verify)."""
    doc, _ = genuine_objects(root)
    name = checkpoint_name(step, f"{step:08x}")
    doc.update(name=name, step=step)
    if matching:
        doc["objects"] = [
            {"name": n, "size_bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}
            for n, b in sorted(objects.items())
        ]
    (root / name).mkdir()
    for n, b in objects.items():
        (root / name / n).write_bytes(b)
    (root / name / MANIFEST_FILE).write_text(json.dumps(doc))


def fill(root: Path, forged: list[tuple[str, bool, bool]], manifests: list[bytes]) -> None:
    """The forgeries at steps 20, 21, ...: one of ``FORGERIES`` (over forged weights, or
    the genuine ones), verifying its manifest or not; then the hostile manifests."""
    _, objects = genuine_objects(root)
    for step, (kind, weights, matching) in enumerate(forged, start=20):
        base = forged_weights(objects) if weights else objects
        forge(root, step, FORGERIES[kind](base), matching=matching)
    for step, text in enumerate(manifests, start=20 + len(forged)):
        name = checkpoint_name(step, f"{step:08x}")
        (root / name).mkdir()
        for n, b in objects.items():
            (root / name / n).write_bytes(b)
        (root / name / MANIFEST_FILE).write_bytes(text)


def restored(root: Path) -> tuple[int | None, tuple[Any, ...]]:
    """A restore into fresh objects (other weights): the step, and what they then hold."""
    model, opt = sharded_model(seed=99)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    extra: dict[str, Any] = {"seen": -1}
    torch.manual_seed(12345)
    ckpt = Checkpointer(str(root), every_steps=100, retry=FAST, check=False)
    try:
        step: int | None = ckpt.restore(model=model, optimizer=opt, scheduler=sched, extra=extra)
    except CostguardError:
        step = None  # refused by name; the Checkpointer's error, never another
    finally:
        ckpt.close(final=False)
    return step, (full(model, opt), sched.state_dict(), dict(extra), torch.get_rng_state())


@pytest.mark.slow
@reproducible(25)
@given(
    forged=st.lists(
        st.tuples(st.sampled_from(sorted(FORGERIES)), st.booleans(), st.booleans()), max_size=4
    ),
    manifests=st.lists(st.integers(40, 45).flatmap(hostile), max_size=1),
)
def test_a_sharded_restore_puts_back_only_the_genuine_checkpoint(
    one_rank: None,
    tmp_path_factory: pytest.TempPathFactory,
    forged: list[tuple[str, bool, bool]],
    manifests: list[bytes],
) -> None:
    root = tmp_path_factory.mktemp("ckpt")
    expected = genuine(root)
    fill(root, forged, manifests)
    step, state = restored(root)
    assert step == GENUINE_STEP, forged
    assert_bitwise_equal(state[:3], expected[:3])
    assert torch.equal(state[3], expected[3]), forged


@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_each_sharded_forgery_over_fitting_weights_is_passed_over(
    one_rank: None, tmp_path: Path, kind: str
) -> None:
    """Every kind once, each over forged weights that fit and verifying its manifest: the
    case where a restore may have loaded part of the forgery before refusing it."""
    expected = genuine(tmp_path)
    fill(tmp_path, [(kind, True, True)], [])
    step, state = restored(tmp_path)
    assert step == GENUINE_STEP
    assert_bitwise_equal(state[:3], expected[:3])
    assert torch.equal(state[3], expected[3])


#: The forgeries that are no whole state by themselves; the others (a rank's RNG that is
#: text, a key missing from the index...) are a whole state that no live objects judge:
#: with weights that fit, a forger's own checkpoint, which ``load_state`` gives as any
#: verified one (docs/threat-model.md: checkpoints are not signed).
NO_WHOLE_STATE = sorted(
    k
    for k in FORGERIES
    if k.startswith(("index ", "chunk", "shard ", "no index", "no train", "train.pt "))
    and k != "index lacks a key"
)


@pytest.mark.parametrize("kind", [*NO_WHOLE_STATE, "value runs code"])
def test_load_state_and_export_pass_over_each_sharded_forgery(
    one_rank: None, tmp_path: Path, kind: str
) -> None:
    """``load_state`` (``checkpoint export``, the notebook) assembles the whole state in one
    process, without the ranks' objects: the genuine step, never a traceback (a forged
    index was a ValueError), never a forgery's tensor."""
    expected = genuine(tmp_path)
    fill(tmp_path, [(kind, True, True)], [])
    state = load_state(str(tmp_path))
    assert state["step"] == GENUINE_STEP
    assert state["extra"] == {"seen": GENUINE_STEP}
    assert_bitwise_equal(state["model"], expected[0][0])


def share_forged(root: Path) -> None:
    """Forgeries newer than the genuine 2-rank checkpoint: two that only one rank finds
    out (``train.pt`` whose rank 1 state is text, rank 1's shard cut short), and an index
    that would run code."""
    _, objects = genuine_objects(root)
    state = torch.load(io.BytesIO(objects[TRAIN]), weights_only=True)
    state["ranks"][1] = {**state["ranks"][1], "rng": "x"}
    forge(root, 20, {**objects, TRAIN: saved(state)})
    shard = "shard-00001.distcp"
    forge(root, 21, {**objects, shard: objects[shard][: len(objects[shard]) // 2]})
    forge(root, 22, FORGERIES["index zip runs code"](objects))  # which DCP logs, traceback and all


@pytest.mark.slow
def test_ranks_agree_to_pass_over_a_forgery_only_one_of_them_can_tell(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    """2 ranks (gloo, forked by tests/helpers/ranks.py): a forged checkpoint that fails on
    one rank only is passed over by both, which put back the genuine step together; no
    rank goes on alone (which would hang the other at its next collective)."""
    root, env = tmp_path / "ckpt", train_env()
    run_ranks(2, str(root), tmp_path / "saved.pt", env, "--steps", str(GENUINE_STEP))
    share_forged(root)
    done = subprocess.run(
        [*RANKS, "2", str(SCRIPTS / "fsdp_train.py"), "--out", str(tmp_path / "back.pt"),
         "--steps", str(GENUINE_STEP)],
        env={**env, "COSTGUARD_CHECKPOINT_URL": str(root)},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out[-3000:]
    assert "PWNED" not in out
    assert "\x1b" not in out  # torch's messages about a forgery carry ANSI codes
    assert sorted(set(re.findall(r"READY (\d) \d+ (\d+)", done.stdout))) == [
        ("0", str(GENUINE_STEP)),
        ("1", str(GENUINE_STEP)),
    ], out[-3000:]
    assert "ckpt-000000000021-00000015" in done.stderr  # each forgery named, and passed over
    assert "ckpt-000000000020-00000014" in done.stderr
    assert "ckpt-000000000022-00000016" in done.stderr
    assert_bitwise_equal(final(tmp_path / "back.pt", 2), final(tmp_path / "saved.pt", 2))
