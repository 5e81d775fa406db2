"""Sharded state (FSDP2 ``fully_shard``, DTensor) through DCP on costguard's Store, in this
process: one gloo rank on a device mesh of one, the real FSDP2 and DCP code paths.

What a rank writes, what the manifest lists, how restore verifies and falls back, and what
retention deletes, on a local folder; a save and restore on S3 (moto server), Azurite and
the GCS emulator too. The multi-process runs
(4 ranks preempted and resumed, resharding, kill -9) are in test_sharded_ranks.py.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from costguard.checkpoint import Checkpointer, export, load_state
from costguard.checkpoint.checkpointer import ShardedStateError
from costguard.checkpoint.manifest import (
    MANIFEST_FILE,
    READ_FORMAT_VERSION,
    SHARDED_FORMAT_VERSION,
    UnreadableError,
    parse_manifest,
)
from costguard.checkpoint.restoring import NoUsableCheckpointError
from costguard.checkpoint.store import Store, StoreError
from tests.checkpoint.test_trust import FAULTS, faulty
from tests.helpers.stores import Backend
from tests.helpers.training import assert_bitwise_equal


def sharded_model(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    mesh = init_device_mesh("cpu", (1,))
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int = 1) -> None:
    for _ in range(steps):
        model(torch.randn(4, 6)).sum().backward()
        opt.step()
        opt.zero_grad()


def full(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Any:
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    # A copy: on one rank the full state may share memory with the live parameters.
    return copy.deepcopy(get_state_dict(model, opt, options=options))


def save_steps(url: str, steps: int, **options: Any) -> tuple[list[str], list[Any]]:
    """One sharded checkpoint per step 1..steps: their names, and the full state at each."""
    model, opt = sharded_model()
    states = []
    with Checkpointer(url, every_steps=1, keep_last=10, **options) as ckpt:
        for step in range(steps):
            train(model, opt)
            ckpt.step(step, model=model, optimizer=opt)
            states.append(full(model, opt))
    return [r.name for r in ckpt.results if r.ok], states


def restore_full(url: str, **options: Any) -> tuple[int, Any]:
    model, opt = sharded_model(seed=99)  # other weights: a restore must replace them all
    with Checkpointer(url, **options) as ckpt:
        step = ckpt.restore(model=model, optimizer=opt)
    return step, full(model, opt)


def test_a_sharded_save_writes_shards_index_and_manifest_last(
    one_rank: None, tmp_path: Path
) -> None:
    url = str(tmp_path / "ckpt")
    names, states = save_steps(url, 2)
    assert len(names) == 2
    folder = Path(url) / names[-1]
    assert sorted(p.name for p in folder.iterdir()) == [
        "dcp.metadata",
        MANIFEST_FILE,
        "shard-00000.distcp",
        "train.pt",
    ]
    manifest = parse_manifest((folder / MANIFEST_FILE).read_text(), names[-1])
    assert manifest.format_version == SHARDED_FORMAT_VERSION
    assert manifest.sharded
    assert manifest.extra == {"layout": "dcp", "world_size": 1}
    for entry in manifest.objects:  # every object is listed with its true size
        assert (folder / entry.name).stat().st_size == entry.size_bytes
    step, state = restore_full(url)
    assert step == 2
    assert_bitwise_equal(state, states[-1])


def test_the_readme_loop_resumes_an_fsdp2_model_exactly(one_rank: None, tmp_path: Path) -> None:
    url = str(tmp_path / "ckpt")
    model, opt = sharded_model()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    extra = {"seen": 0}

    def loop(ckpt: Checkpointer, start: int, stop: int) -> None:
        for step in range(start, stop):
            torch.manual_seed(1000 + step)
            train(model, opt)
            sched.step()
            extra["seen"] += 1
            ckpt.step(step, model=model, optimizer=opt, scheduler=sched, extra=extra)

    with Checkpointer(url, every_steps=3) as ckpt:
        loop(ckpt, 0, 6)
    expected = full(model, opt), sched.state_dict(), dict(extra), torch.get_rng_state()
    with Checkpointer(url, every_steps=3) as ckpt:  # the same objects, back at step 3
        model, opt = sharded_model(seed=5)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        extra = {"seen": -1}
        ckpt.restore(model=model, optimizer=opt, scheduler=sched, extra=extra)
    # close() committed step 6: a restore gets exactly the state at the end of the loop.
    assert_bitwise_equal((full(model, opt), sched.state_dict(), extra), expected[:3])
    assert torch.equal(torch.get_rng_state(), expected[3])


def test_a_corrupt_shard_falls_back_to_the_previous_checkpoint(
    one_rank: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = str(tmp_path / "ckpt")
    names, states = save_steps(url, 3)
    shard = Path(url) / names[-1] / "shard-00000.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the sha256 can tell
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        step, state = restore_full(url, partial_grace_s=0.0)
    assert step == 2
    assert_bitwise_equal(state, states[1])
    assert f"skipped checkpoint {names[-1]} (step 3)" in caplog.text
    assert "does not match the manifest" in caplog.text
    assert "recorded as incomplete or corrupt" in caplog.text


def test_a_missing_shard_or_manifest_is_never_latest(one_rank: None, tmp_path: Path) -> None:
    url = str(tmp_path / "ckpt")
    names, states = save_steps(url, 3)
    (Path(url) / names[2] / MANIFEST_FILE).unlink()  # a save whose commit never came
    (Path(url) / names[1] / "shard-00000.distcp").unlink()  # a shard lost after the commit
    step, state = restore_full(url)
    assert step == 1
    assert_bitwise_equal(state, states[0])


def test_a_sharded_checkpoint_is_skipped_and_kept_by_a_replicated_restore(
    one_rank: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain model cannot take a sharded checkpoint: not proof of corruption, so it is
    kept (as by a costguard that predates the sharded layout: format_version 3 is "newer")."""
    url = str(tmp_path / "ckpt")
    names, _ = save_steps(url, 1)
    plain = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with Checkpointer(url) as refused, pytest.raises(NoUsableCheckpointError):
        refused.restore(model=plain)  # the only checkpoint cannot be used: no silent step 0
    with (
        caplog.at_level(logging.WARNING),
        Checkpointer(url, partial_grace_s=0.0, start_fresh=True) as ckpt,
    ):
        assert ckpt.restore(model=plain) == 0
        ckpt.save(5, model=plain, block=True)  # a newer commit: retention runs, and keeps it
    assert (Path(url) / names[0] / MANIFEST_FILE).exists()
    assert "is a sharded checkpoint" in caplog.text


def test_retention_deletes_whole_sharded_folders_and_abandoned_partials(
    one_rank: None, tmp_path: Path
) -> None:
    url = str(tmp_path / "ckpt")
    names, _ = save_steps(url, 3)
    partial = Path(url) / names[-1]
    (partial / MANIFEST_FILE).unlink()  # the last save never committed
    model, opt = sharded_model()
    with Checkpointer(url, every_steps=1, keep_last=2, partial_grace_s=0.0) as ckpt:
        assert ckpt.restore(model=model, optimizer=opt) == 2
        assert partial.exists()  # newer than any committed one: a writer may be live
        for step in range(2, 4):
            train(model, opt)
            ckpt.step(step, model=model, optimizer=opt)
    assert not partial.exists()  # abandoned and older than a committed one: garbage
    kept = sorted(p.name for p in Path(url).iterdir() if p.name != "job")
    assert len(kept) == 2
    assert [p.name for p in (Path(url) / "job").iterdir()] == ["pace.json"]  # the pace only
    assert not {names[0], names[1]} & set(kept)
    for name in kept:  # each kept one whole: every object its manifest lists
        manifest = json.loads((Path(url) / name / MANIFEST_FILE).read_text())
        assert {o["name"] for o in manifest["objects"]} | {MANIFEST_FILE} == {
            p.name for p in (Path(url) / name).iterdir()
        }


def test_sharded_save_and_restore_on_every_backend(one_rank: None, backend: Backend) -> None:
    """Local, S3 (moto server), Azure (Azurite), GCS (the emulator): shards written with
    their sha256, verified, then read back by byte range."""
    names, states = save_steps(backend.url, 2)
    listing = Store.open(backend.url).listing()
    assert f"{names[-1]}/shard-00000.distcp" in listing
    assert f"{names[-1]}/{MANIFEST_FILE}" in listing
    step, state = restore_full(backend.url)
    assert step == 2
    assert_bitwise_equal(state, states[-1])


def test_sharded_state_outside_the_model_and_optimizer_is_refused(
    one_rank: None, tmp_path: Path
) -> None:
    model, opt = sharded_model()
    weight = next(model.parameters()).detach()  # a DTensor
    with Checkpointer(tmp_path / "ckpt") as ckpt, pytest.raises(ShardedStateError) as refused:
        ckpt.save(0, model=model, optimizer=opt, extra={"ema": weight})
    assert "extra state holds sharded tensors" in refused.value.message
    assert not list((tmp_path / "ckpt").glob("ckpt-*"))


def test_sharded_state_without_a_process_group_is_refused(tmp_path: Path) -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model, opt = sharded_model()
    finally:
        dist.destroy_process_group()  # the shards stay, the other ranks are out of reach
    with Checkpointer(tmp_path / "ckpt") as ckpt, pytest.raises(ShardedStateError) as refused:
        ckpt.save(0, model=model, optimizer=opt)
    assert "no torch.distributed process group is initialised" in refused.value.message
    assert not list((tmp_path / "ckpt").glob("ckpt-*"))


def test_the_sharded_layout_has_its_own_format_and_a_newer_one_is_unreadable() -> None:
    name = "ckpt-000000000004-0a1b2c3d"
    data = {
        "format_version": SHARDED_FORMAT_VERSION,
        "name": name,
        "step": 4,
        "created_unix": 1.0,
        "objects": [{"name": "shard-00000.distcp", "size_bytes": 3, "sha256": "ab" * 32}],
    }
    assert parse_manifest(json.dumps(data), name).sharded
    assert not parse_manifest(json.dumps({**data, "format_version": 1}), name).sharded
    with pytest.raises(UnreadableError, match="newer costguard"):
        parse_manifest(json.dumps({**data, "format_version": READ_FORMAT_VERSION + 1}), name)


@pytest.mark.parametrize("target", ["shard-00000.distcp", "dcp.metadata", MANIFEST_FILE])
def test_a_read_that_fails_skips_the_sharded_checkpoint_and_keeps_it(
    one_rank: None, tmp_path: Path, target: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = str(tmp_path / "ckpt")
    names, states = save_steps(url, 3)
    ckpt = faulty(url, {f"{names[-1]}/{target}": (-1, FAULTS["reset"])})
    model, opt = sharded_model(seed=99)
    with caplog.at_level(logging.WARNING):
        assert ckpt.restore(model=model, optimizer=opt) == 2  # step 3 could not be read
        assert_bitwise_equal(full(model, opt), states[1])
        ckpt.save(2, model=model, optimizer=opt, block=True)  # a newer commit: retention runs
    ckpt.close()
    assert ckpt.store.fs.failed, "the fault was never hit"
    assert (Path(url) / names[-1] / MANIFEST_FILE).exists()  # it could not be judged: kept
    assert names[-1] in caplog.text
    assert "kept" in caplog.text
    assert "corrupt" not in caplog.text


def test_a_shard_that_fails_to_write_commits_nothing(
    one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "ckpt")
    names, _ = save_steps(url, 1)
    write_stream = Store.write_stream

    def failing(self: Store, path: str, produce: Any) -> tuple[int, str]:
        if path.endswith(".distcp"):
            raise StoreError("writing a shard: no space left on device")
        return write_stream(self, path, produce)

    monkeypatch.setattr(Store, "write_stream", failing)
    model, opt = sharded_model()
    with Checkpointer(url) as ckpt:
        future = ckpt.save(5, model=model, optimizer=opt)
        assert future is not None
        result = future.result()
    assert not result.ok
    assert "rank 0: StoreError: writing a shard: no space left" in (result.error or "")
    assert not (Path(url) / result.name / MANIFEST_FILE).exists()  # no commit
    assert (Path(url) / names[0] / MANIFEST_FILE).exists()  # the previous one intact
    monkeypatch.undo()
    step, _ = restore_full(url)
    assert step == 1


def save_steps_alone(url: str, steps: int) -> tuple[list[str], list[Any]]:
    """:func:`save_steps` in a process group of its own, closed after."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return save_steps(url, steps)
    finally:
        dist.destroy_process_group()


def test_a_sharded_checkpoint_exports_whole_without_a_process_group(tmp_path: Path) -> None:
    url = str(tmp_path / "ckpt")
    names, states = save_steps_alone(url, 2)
    model_state, optimizer_state = states[-1]
    whole = load_state(url)  # one process, no model: full tensors by parameter name
    assert whole["step"] == 2
    assert_bitwise_equal(whole["model"], model_state)
    assert_bitwise_equal(whole["optimizer"], optimizer_state)
    manifest = export(url, tmp_path / "model.safetensors")
    assert manifest.name == names[-1]
    plain = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    raw = (tmp_path / "model.safetensors").read_bytes()
    assert raw[8:9] == b"{"  # a safetensors header, then the weights
    plain.load_state_dict(whole["model"])  # the names fit the unsharded model
    assert torch.equal(plain.state_dict()["2.weight"], model_state["2.weight"])


@pytest.mark.parametrize(
    "payload",
    [
        b"not a torch file",
        b"PK\x03\x04 a broken zip",
        "legacy",  # torch.save's pre-1.6 format: refused before torch.load (CVE-2025-32434)
        "list",  # loads, but is no training state
    ],
)
def test_an_unloadable_train_pt_falls_back_to_the_previous_checkpoint(
    tmp_path: Path, payload: bytes | str
) -> None:
    """Verified bytes that do not load (issue 28) skip the checkpoint, kept, as a payload
    that does not load does in a replicated one."""
    url = str(tmp_path / "ckpt")
    names, _ = save_steps_alone(url, 2)
    if payload in ("legacy", "list"):
        buffer = io.BytesIO()
        value = {"step": 2} if payload == "legacy" else [1, 2]
        torch.save(value, buffer, _use_new_zipfile_serialization=payload == "list")
        payload = buffer.getvalue()
    assert isinstance(payload, bytes)
    folder = Path(url) / names[-1]
    (folder / "train.pt").write_bytes(payload)
    manifest = parse_manifest((folder / MANIFEST_FILE).read_bytes(), names[-1])
    entries = tuple(
        replace(o, size_bytes=len(payload), sha256=hashlib.sha256(payload).hexdigest())
        if o.name == "train.pt"
        else o
        for o in manifest.objects
    )
    (folder / MANIFEST_FILE).write_text(replace(manifest, objects=entries).to_json())
    assert load_state(url)["step"] == 1
    assert (folder / "train.pt").exists()  # no proof of corruption: kept


def test_legacy_format_bytes_never_reach_torch_load() -> None:
    """torch.save's pre-zip format is where weights_only was bypassed (CVE-2025-32434):
    costguard never writes it, and refuses it in every in-memory and file load."""
    from types import SimpleNamespace

    from costguard.checkpoint import state as state_mod
    from costguard.checkpoint.dcp_storage import load_planner

    buffer = io.BytesIO()
    torch.save({"a": 1}, buffer, _use_new_zipfile_serialization=False)
    legacy = buffer.getvalue()
    assert torch.load(io.BytesIO(legacy), weights_only=True) == {"a": 1}  # torch would
    with pytest.raises(ValueError, match="zip format"):
        state_mod.deserialise(legacy)
    item = SimpleNamespace(dest_index=SimpleNamespace(fqn="optimizer.param_groups"))
    with pytest.raises(ValueError, match="zip format"):
        load_planner(whole=True).load_bytes(item, io.BytesIO(legacy))
