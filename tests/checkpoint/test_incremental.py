"""Incremental saves: frozen tensors stored once in the pool, referred to by hash, restored
bitwise; what is uploaded per save; the trust rules with pool objects (missing or
corrupt: fall back; unreadable: skip and keep); retention never deletes a pool object a
kept checkpoint needs. A LoRA-shaped run preempted twice by real signals in real
processes ends bitwise equal to an uninterrupted one."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from costguard.checkpoint import Checkpointer, RetryPolicy
from costguard.checkpoint.incremental import CONFIRM_EVERY, POOL_MIN_BYTES
from costguard.checkpoint.inventory import verify
from costguard.checkpoint.manifest import MANIFEST_FILE, parse_manifest, pool_object, scan
from costguard.checkpoint.store import Store
from tests.checkpoint.test_trust import FaultyFS
from tests.helpers.stores import Backend
from tests.helpers.training import SCRIPTS, SharedRuns

FAST = RetryPolicy(attempts=2, base_delay_s=0.01, max_delay_s=0.02)
SIDE = 512  # a 512 x 512 float32 weight: 1 MiB, the pool's threshold
assert SIDE * SIDE * 4 >= POOL_MIN_BYTES


class Adapted(torch.nn.Module):
    """A frozen base weight and buffer (pooled) plus a small trainable adapter."""

    table: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.base = torch.nn.Linear(SIDE, SIDE)
        self.base.requires_grad_(False)
        self.register_buffer("table", torch.randn(SIDE, SIDE))
        self.adapter = torch.nn.Linear(SIDE, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.adapter(self.base(x) @ self.table)


def adapted() -> tuple[Adapted, torch.optim.Optimizer]:
    model = Adapted()
    return model, torch.optim.AdamW(model.adapter.parameters(), lr=1e-2)


def train(model: Adapted, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(4, SIDE)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def pool(store: Store) -> set[str]:
    return {d for d in (pool_object(p) for p in store.listing()) if d is not None}


def manifests(store: Store) -> list[Any]:
    return [
        parse_manifest(store.get(f"{c.name}/{MANIFEST_FILE}"), c.name)
        for c in scan(store.listing())
        if c.has_manifest
    ]


def assert_same(a: Any, b: Any) -> None:
    """Bitwise equal nested states."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def test_unchanged_frozen_tensors_are_stored_once_and_restored_bitwise(tmp_path: Path) -> None:
    model, opt = adapted()
    with Checkpointer(tmp_path, keep_last=2, partial_grace_s=0.0) as ckpt:
        for step in range(4):
            train(model, opt)
            ckpt.save(step, model=model, optimizer=opt, block=True)
            # The frozen tensors are not held in the copier's buffers after the first save.
            assert step == 0 or not any(
                "base.weight" in k or "table" in k for k in ckpt._saver._copier._buffers
            )
    first, *later = ckpt.results
    assert all(r.ok for r in ckpt.results)
    assert first.uploaded_bytes == first.size_bytes  # everything, once
    frozen = 2 * SIDE * SIDE * 4
    for r in later:  # only state.pt: the adapter, its optimizer state, the RNG states
        assert r.size_bytes - r.uploaded_bytes == frozen
    assert len(pool(ckpt.store)) == 2
    assert all(m.uses_pool and len(m.objects) == 3 for m in manifests(ckpt.store))
    fresh, fresh_opt = adapted()
    with torch.no_grad():
        fresh.base.weight.zero_()
        fresh.table.zero_()
    with Checkpointer(tmp_path) as again:
        assert again.restore(model=fresh, optimizer=fresh_opt) == 4
    assert_same(fresh.state_dict(), model.state_dict())
    assert_same(fresh_opt.state_dict(), opt.state_dict())


def test_a_model_with_nothing_frozen_or_incremental_off_saves_as_before(tmp_path: Path) -> None:
    torch.manual_seed(0)
    trained = torch.nn.Linear(SIDE, SIDE)  # a weight over the threshold, but it trains
    trained_opt = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    with Checkpointer(tmp_path / "trained") as ckpt:
        ckpt.save(0, model=trained, optimizer=trained_opt, block=True)
    model, opt = adapted()
    with Checkpointer(tmp_path / "off", incremental=False) as off:
        off.save(0, model=model, optimizer=opt, block=True)
    for store in (ckpt.store, off.store):
        (m,) = manifests(store)
        assert [o.name for o in m.objects] == ["state.pt"]
        assert json.loads(m.to_json())["format_version"] == 1
        assert not pool(store)


def test_a_buffer_a_step_touches_is_stored_again(tmp_path: Path) -> None:
    model, opt = adapted()
    with Checkpointer(tmp_path, keep_last=5) as ckpt:
        ckpt.save(0, model=model, optimizer=opt, block=True)
        with torch.no_grad():
            model.table.mul_(2)  # in place: the version counter moves
        ckpt.save(1, model=model, optimizer=opt, block=True)
        ckpt.save(2, model=model, optimizer=opt, block=True)
    assert ckpt.results[1].uploaded_bytes - ckpt.results[2].uploaded_bytes == SIDE * SIDE * 4
    assert len(pool(ckpt.store)) == 3
    fresh, fresh_opt = adapted()
    Checkpointer(tmp_path).restore(model=fresh, optimizer=fresh_opt)
    assert_same(fresh.state_dict(), model.state_dict())


def test_a_write_past_the_version_counter_is_caught_by_the_confirming_hash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, opt = adapted()
    with Checkpointer(tmp_path, keep_last=1) as ckpt:
        ckpt.save(0, model=model, optimizer=opt, block=True)
        version = model.table._version
        model.table.data.add_(1.0)  # through .data: the counter does not move
        assert model.table._version == version
        with caplog.at_level(logging.WARNING):
            for step in range(1, CONFIRM_EVERY + 1):
                ckpt.save(step, model=model, optimizer=opt, block=True)
    assert "changed without its version counter moving" in caplog.text
    fresh, fresh_opt = adapted()
    Checkpointer(tmp_path).restore(model=fresh, optimizer=fresh_opt)
    assert_same(fresh.state_dict(), model.state_dict())


def two_versions(url: str) -> tuple[Checkpointer, str, torch.Tensor]:
    """Step 1 with the buffer as made, step 2 with it changed; step 2's new pool object
    and step 1's buffer."""
    model, opt = adapted()
    before = model.table.clone()
    ckpt = Checkpointer(url, keep_last=5, retry=FAST, partial_grace_s=0.0)
    ckpt.save(0, model=model, optimizer=opt, block=True)
    old = pool(ckpt.store)
    with torch.no_grad():
        model.table.add_(1.0)
    ckpt.save(1, model=model, optimizer=opt, block=True)
    ckpt.close()
    (new,) = pool(ckpt.store) - old
    return ckpt, new, before


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_missing_or_corrupt_pool_object_falls_back_to_the_checkpoint_before(
    tmp_path: Path, damage: str
) -> None:
    _, new, before = two_versions(str(tmp_path))
    blob = tmp_path / "blobs" / new
    if damage == "missing":
        blob.unlink()
    else:
        data = bytearray(blob.read_bytes())
        data[100] ^= 0xFF
        blob.write_bytes(bytes(data))
    model, opt = adapted()
    with Checkpointer(tmp_path, retry=FAST) as again:
        assert again.restore(model=model, optimizer=opt) == 1
        assert torch.equal(model.table, before)
        bad = [v for v in verify(again.store) if not v.ok]
        assert [v.step for v in bad] == [2]
        # The next save writes the buffer's bytes again (the pool object it had was not
        # verified by this process): that save is complete whatever the pool held.
        again.save(1, model=model, optimizer=opt, block=True)
        assert [v.ok for v in verify(again.store, latest_only=True)] == [True]


def test_an_unreadable_pool_object_is_skipped_and_kept(tmp_path: Path) -> None:
    ckpt, new, before = two_versions(str(tmp_path))
    model, opt = adapted()
    again = Checkpointer(tmp_path, retry=FAST, keep_last=1, partial_grace_s=0.0)
    again.store.fs = FaultyFS(again.store.fs, {new: (-1, lambda: PermissionError(13, "no"))})
    assert again.restore(model=model, optimizer=opt) == 1
    assert torch.equal(model.table, before)
    again.save(1, model=model, optimizer=opt, block=True)  # retention runs, keep_last=1
    again.close()
    assert (tmp_path / "blobs" / new).exists()
    assert (tmp_path / ckpt.results[1].name / MANIFEST_FILE).exists()


def test_an_unreadable_manifest_keeps_every_pool_object(tmp_path: Path) -> None:
    model, opt = adapted()
    with Checkpointer(tmp_path, keep_last=1, partial_grace_s=0.0) as ckpt:
        ckpt.save(0, model=model, optimizer=opt, block=True)
        first = pool(ckpt.store)
        foreign = tmp_path / "ckpt-000000000001-0000ffff"
        foreign.mkdir()
        (foreign / "state.pt").write_bytes(b"x")
        (foreign / MANIFEST_FILE).write_text(
            json.dumps({"format_version": 99, "name": foreign.name, "objects": []})
        )
        with torch.no_grad():
            model.table.add_(1.0)
        ckpt.save(1, model=model, optimizer=opt, block=True)
        assert first <= pool(ckpt.store)  # step 1's old buffer: unneeded, yet kept
        (foreign / MANIFEST_FILE).unlink()
        (foreign / "state.pt").unlink()
        foreign.rmdir()
        ckpt.save(2, model=model, optimizer=opt, block=True)
    assert len(pool(ckpt.store)) == 2  # now it goes: only the kept checkpoint's two remain


@pytest.mark.parametrize(
    ("backend", "keep"),
    [("local", 1), ("local", 2), ("s3", 1), ("s3", 2), ("azure", 1), ("gcs", 2)],
    indirect=["backend"],
)
def test_retention_deletes_no_pool_object_a_kept_checkpoint_needs(
    backend: Backend, keep: int
) -> None:
    model, opt = adapted()
    with Checkpointer(backend.url, keep_last=keep, partial_grace_s=0.0) as ckpt:
        for step in range(7):
            train(model, opt)
            if step in (2, 5):
                with torch.no_grad():
                    model.table.add_(0.5)
            ckpt.save(step, model=model, optimizer=opt, block=True)
            kept = manifests(ckpt.store)
            assert len(kept) == min(step + 1, keep)
            needed = set().union(*(m.pool_digests for m in kept))
            assert pool(ckpt.store) == needed  # nothing needed is gone, nothing unneeded stays
            assert all(v.ok for v in verify(ckpt.store))
    fresh, fresh_opt = adapted()
    Checkpointer(backend.url).restore(model=fresh, optimizer=fresh_opt)
    assert_same(fresh.state_dict(), model.state_dict())


# -- real processes, real signals --------------------------------------------------------


def run_lora(env: dict[str, str], out: Path, stop_after: int | None) -> int:
    """Run lora_train.py; SIGTERM it once it has printed ``STEP stop_after``."""
    command = [sys.executable, str(SCRIPTS / "lora_train.py"), "--out", str(out), "--sleep", "0.02"]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if stop_after is not None and line.strip() == f"STEP {stop_after}":
                proc.send_signal(signal.SIGTERM)
                stop_after = None
        return proc.wait(timeout=120)


@pytest.mark.parametrize("backend", ["local", "s3"], indirect=True)
def test_a_lora_run_preempted_twice_ends_bitwise_equal_to_an_uninterrupted_one(
    backend: Backend,
    tmp_path: Path,
    train_env: Callable[..., dict[str, str]],
    shared_runs: SharedRuns,
) -> None:
    events = tmp_path / "events.jsonl"

    def uninterrupted(folder: Path) -> None:
        whole = train_env(COSTGUARD_CHECKPOINT_URL=str(folder / "ckpt"))
        assert run_lora(whole, folder / "whole.pt", None) == 0

    whole = shared_runs.folder(("lora_train.py", "--sleep", "0.02"), uninterrupted) / "whole.pt"
    env = train_env(
        COSTGUARD_CHECKPOINT_URL=backend.url, COSTGUARD_EVENTS_FILE=str(events), **backend.env
    )
    assert run_lora(env, tmp_path / "x.pt", 6) == 75
    assert run_lora(env, tmp_path / "x.pt", 17) == 75
    assert run_lora(env, tmp_path / "resumed.pt", None) == 0
    assert_same(
        torch.load(tmp_path / "resumed.pt", weights_only=True),
        torch.load(whole, weights_only=True),
    )
    saves = [
        e for e in (json.loads(x) for x in events.read_text().splitlines()) if e["event"] == "save"
    ]
    assert all(s["ok"] for s in saves)
    assert len(saves) >= 8
    assert saves[0]["uploaded_bytes"] == saves[0]["size_bytes"]
    frozen = 2 * 2**20  # the base weight and the buffer: in the pool once
    for s in saves[1:]:  # after a resume too: the restored frozen tensors count as unchanged
        assert s["size_bytes"] - s["uploaded_bytes"] >= frozen, s
        assert s["uploaded_bytes"] < s["size_bytes"] / 10, s
    assert len(pool(Store.open(backend.url))) == 2


def test_a_restore_into_another_dtype_stores_the_converted_tensor_afresh(tmp_path: Path) -> None:
    def model_with(dtype: torch.dtype) -> tuple[Adapted, torch.optim.Optimizer]:
        model, opt = adapted()
        model.table = torch.randn(2 * SIDE, SIDE).to(dtype)  # 1 MiB in either dtype
        return model, opt

    half, half_opt = model_with(torch.float16)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(0, model=half, optimizer=half_opt, block=True)
    brain, brain_opt = model_with(torch.bfloat16)
    with Checkpointer(tmp_path) as again:
        assert again.restore(model=brain, optimizer=brain_opt) == 1  # converted on load
        again.save(1, model=brain, optimizer=brain_opt, block=True)
    fresh, fresh_opt = model_with(torch.bfloat16)
    Checkpointer(tmp_path).restore(model=fresh, optimizer=fresh_opt)
    assert_same(fresh.state_dict(), brain.state_dict())
