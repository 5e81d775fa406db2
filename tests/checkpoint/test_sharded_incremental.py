"""Incremental saves of a sharded state, across real processes: a LoRA-shaped FSDP2 model
(frozen 8 MiB base, small adapters) on 2 gloo ranks (tests/helpers/ranks.py). Each rank's frozen
shards go to the pool once; the saves after the first write a few percent of the state,
after a resume too; the resumed run ends bitwise equal to an uninterrupted one; the
checkpoint restores resharded on 1 rank; retention keeps every pool object a kept
checkpoint refers to."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from costguard.checkpoint import Checkpointer
from costguard.checkpoint.incremental import CONFIRM_EVERY
from costguard.checkpoint.manifest import MANIFEST_FILE, parse_manifest, pool_object, scan
from costguard.checkpoint.saving import SaveResult
from costguard.checkpoint.store import Store
from tests.checkpoint.fsdp_train import lora_model
from tests.checkpoint.test_sharded import full
from tests.checkpoint.test_sharded_ranks import final, run_ranks
from tests.helpers.stores import Backend
from tests.helpers.training import assert_bitwise_equal

FROZEN = 2 * 1024 * 1024 * 4  # the two base weights, sharded over the ranks
STEPS = 8


def lora(ranks: int, url: str, out: Path, env: dict[str, str], steps: int) -> None:
    args = ("--lora", "--steps", str(steps), "--every-steps", "2")
    run_ranks(ranks, url, out, env, *args)


@pytest.mark.slow
@pytest.mark.timeout(900)  # five 2-rank launches on a machine of two cores
def test_a_lora_fsdp2_model_on_2_ranks_saves_increments_resumes_bitwise_and_reshards(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    reference = tmp_path / "whole.pt"
    lora(2, str(tmp_path / "whole"), reference, train_env(), STEPS)
    events = tmp_path / "events.jsonl"
    env = train_env(COSTGUARD_EVENTS_FILE=str(events), COSTGUARD_CHECKPOINT_KEEP="2")
    url, out = str(tmp_path / "ckpt"), tmp_path / "resumed.pt"
    lora(2, url, tmp_path / "half.pt", env, STEPS // 2)
    lora(2, url, out, env, STEPS)
    assert_bitwise_equal(final(out, 2), final(reference, 2))

    saves = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "save"]
    assert [s["step"] for s in saves] == [2, 4, 6, 8]
    assert all(s["ok"] for s in saves)
    first, *later = saves
    assert first["uploaded_bytes"] >= FROZEN
    for s in later:  # after the resume (step 6) too: the restored shards count as unchanged
        assert s["size_bytes"] >= FROZEN
        assert s["uploaded_bytes"] <= 0.05 * s["size_bytes"], s

    # Retention kept the newest 2 checkpoints and every pool object they refer to.
    store = Store.open(url)
    kept = [c for c in scan(store.listing()) if c.has_manifest]
    assert [c.step for c in kept] == [6, 8]
    needed = set().union(
        *(parse_manifest(store.get(f"{c.name}/{MANIFEST_FILE}"), c.name).pool_digests for c in kept)
    )
    pooled = {d for d in map(pool_object, store.listing()) if d is not None}
    assert len(needed) == 4  # each base weight's two shards
    assert needed <= pooled

    # The final checkpoint on 1 rank: DCP assembles the full weights from the pool objects.
    restored = tmp_path / "on-1.pt"
    lora(1, url, restored, train_env(), STEPS)
    assert_bitwise_equal(torch.load(restored, weights_only=True), final(reference, 2)["state"])


def sharded_lora(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The LoRA-shaped model sharded on a mesh of this one rank, and AdamW on its adapters."""
    torch.manual_seed(seed)
    model = lora_model()
    mesh = init_device_mesh("cpu", (1,))
    for layer in (model[1], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)


def test_frozen_shards_go_to_the_pool_and_back_on_every_backend(
    one_rank: None, backend: Backend
) -> None:
    model, opt = sharded_lora()
    with Checkpointer(backend.url) as ckpt:
        for step in range(2):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            ckpt.save(step, model=model, optimizer=opt, block=True)
    first, second = ckpt.results
    assert first.uploaded_bytes >= FROZEN
    assert second.uploaded_bytes <= 0.05 * second.size_bytes
    assert len({d for d in map(pool_object, ckpt.store.listing()) if d is not None}) == 2
    restored, restored_opt = sharded_lora(seed=99)
    with Checkpointer(backend.url) as again:
        assert again.restore(model=restored, optimizer=restored_opt) == 2
    assert_bitwise_equal(full(restored, restored_opt), full(model, opt))


def test_a_frozen_shard_written_past_its_version_counter_is_stored_again(
    one_rank: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, opt = sharded_lora()
    url = str(tmp_path / "ckpt")
    with caplog.at_level(logging.WARNING), Checkpointer(url, keep_last=2) as ckpt:
        ckpt.save(0, model=model, optimizer=opt, block=True)
        weight: Any = model.get_submodule("1.base").weight
        with torch.no_grad():  # past the version counter: .data has one of its own
            weight.data.to_local().add_(1.0)
        for step in range(1, CONFIRM_EVERY + 2):
            ckpt.save(step, model=model, optimizer=opt, block=True)
    assert "model.1.base.weight changed without its version counter moving" in caplog.text
    confirming = [r for r in ckpt.results[1:] if r.uploaded_bytes > 1024 * 1024 * 4]
    assert len(confirming) == 1  # stored again once, at the save that hashed it
    restored, restored_opt = sharded_lora(seed=99)
    with Checkpointer(url) as again:
        assert again.restore(model=restored, optimizer=restored_opt) == CONFIRM_EVERY + 2
    assert_bitwise_equal(full(restored, restored_opt), full(model, opt))


def lora_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def test_an_incremental_sharded_save_returns_before_its_shards_are_written(
    one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32: the training loop waited for DCP's whole save (planning, collectives,
    the index) even when only the adapters had changed. Once the frozen shards are in the
    pool, a save copies what changed and returns; the shards are written on the save
    thread, from that copy: the loop may train on at once, and the checkpoint still holds
    the state of the step saved. A save that would copy most of the state (the first
    one: the frozen shards are new) writes it before it returns, as before."""
    caller = threading.current_thread()
    returned, caller_wrote = threading.Event(), threading.Event()
    writes: list[tuple[str, bool, bool]] = []  # object, on the caller's thread, after return
    write_stream = Store.write_stream

    def watched(self: Store, path: str, produce: Any, **options: Any) -> tuple[int, str]:
        here = threading.current_thread() is caller
        if here:
            caller_wrote.set()
        for _ in range(0 if here else 2400):  # until save() returns (or writes here itself)
            if returned.wait(0.05) or caller_wrote.is_set():
                break
        writes.append((path.rsplit("/", 1)[-1], here, returned.is_set()))
        return write_stream(self, path, produce, **options)

    def save(step: int) -> Future[SaveResult] | None:
        writes.clear()
        returned.clear()
        caller_wrote.clear()
        return ckpt.save(step, model=model, optimizer=opt)

    monkeypatch.setattr(Store, "write_stream", watched)
    model, opt = sharded_lora()
    url = str(tmp_path / "ckpt")
    with Checkpointer(url) as ckpt:
        lora_step(model, opt)
        future = save(0)
        returned.set()
        assert future is not None
        assert future.result().ok
        assert ("shard-00000.distcp", True, False) in writes, writes  # written, then returned
        lora_step(model, opt)
        expected = full(model, opt)
        future = save(1)
        lora_step(model, opt)  # the loop goes on before a byte of the save is written
        returned.set()
        assert future is not None
        result = future.result()
    assert result.ok, result.error
    assert {name for name, _, _ in writes} >= {"shard-00000.distcp", "train.pt"}
    assert not any(here for _, here, _ in writes), writes
    assert result.uploaded_bytes <= 0.05 * result.size_bytes
    restored, restored_opt = sharded_lora(seed=99)
    with Checkpointer(url) as again:
        assert again.restore(model=restored, optimizer=restored_opt) == 2
    assert_bitwise_equal(full(restored, restored_opt), expected)
