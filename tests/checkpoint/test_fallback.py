"""One rule for every restore path (replicated, incremental with its pool, sharded): each
checkpoint skipped is named in a warning with why and how many steps it costs; when
checkpoints exist and none can be used, the restore refuses (exit 2 under ``costguard
run``) instead of starting from step 0; a checkpoint found incomplete stays incomplete,
even after a later run writes the missing pool object again."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from costguard.checkpoint import Checkpointer
from costguard.checkpoint.inventory import inventory
from costguard.checkpoint.manifest import CONDEMNED_FILE, MANIFEST_FILE, parse_manifest
from costguard.checkpoint.restoring import NoUsableCheckpointError
from costguard.checkpoint.store import Store
from tests.checkpoint.test_incremental import FAST, adapted, pool, train, two_versions
from tests.checkpoint.test_sharded import restore_full, save_steps
from tests.helpers.training import SCRIPTS, costguard_command


def shared_blob(url: str) -> str:
    """The pool object every checkpoint at ``url`` refers to (the frozen base)."""
    store = Store.open(url)
    needed = [
        parse_manifest(store.get(f"{m}/{MANIFEST_FILE}"), m).pool_digests
        for m in sorted({p.split("/")[0] for p in store.listing() if p.startswith("ckpt-")})
    ]
    (digest, *_) = sorted(frozenset.intersection(*needed))
    return digest


def saved_run(url: str, steps: int, first: int = 0) -> None:
    """Checkpoints of steps ``first + 1`` .. ``first + steps``, sharing the frozen base."""
    model, opt = adapted()
    with Checkpointer(url, keep_last=10, retry=FAST) as ckpt:
        for step in range(first, first + steps):
            train(model, opt)
            ckpt.save(step, model=model, optimizer=opt, block=True)


def test_a_fallback_past_a_missing_pool_object_names_it_and_its_cost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt, new, _ = two_versions(str(tmp_path))
    (tmp_path / "blobs" / new).unlink()
    model, opt = adapted()
    with caplog.at_level(logging.WARNING), Checkpointer(tmp_path, retry=FAST) as again:
        assert again.restore(model=model, optimizer=opt) == 1
    newest = ckpt.results[1].name
    (line,) = [r.getMessage() for r in caplog.records if newest in r.getMessage()]
    assert f"blobs/{new} is missing" in line
    assert "repeats 1 steps" in line


def test_a_fallback_past_a_missing_shard_names_it_and_its_cost(
    one_rank: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = str(tmp_path / "ckpt")
    names, _ = save_steps(url, 3)
    (Path(url) / names[2] / "shard-00000.distcp").unlink()
    with caplog.at_level(logging.WARNING):
        step, _ = restore_full(url)
    assert step == 2
    (line,) = [r.getMessage() for r in caplog.records if names[2] in r.getMessage()]
    assert "shard-00000.distcp is missing" in line
    assert "repeats 1 steps" in line


def test_every_checkpoint_broken_refuses_and_start_fresh_starts_over_for_good(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = str(tmp_path)
    saved_run(url, 4, first=2)
    digest = shared_blob(url)
    (tmp_path / "blobs" / digest).unlink()
    model, opt = adapted()
    with Checkpointer(url, retry=FAST) as refused, pytest.raises(NoUsableCheckpointError) as info:
        refused.restore(model=model, optimizer=opt)
    assert info.value.exit_code == 2
    assert "4 checkpoints" in info.value.message
    assert "checkpoint verify" in (info.value.hint or "")
    assert "--start-fresh" in (info.value.hint or "")
    with caplog.at_level(logging.WARNING), Checkpointer(url, start_fresh=True) as fresh:
        assert fresh.restore(model=model, optimizer=opt) == 0
        train(model, opt)
        # The first save of the new run writes the shared pool object again.
        fresh.save(0, model=model, optimizer=opt, block=True)
    assert "starting from step 0, as start_fresh asks" in caplog.text
    assert digest in pool(Store.open(url))
    # The old checkpoints stay condemned: the next resume is the new run's step 1, not 6.
    model2, opt2 = adapted()
    with Checkpointer(url) as again:
        assert again.restore(model=model2, optimizer=opt2) == 1
    entries = inventory(Store.open(url))
    assert {e.step: e.status for e in entries} == {
        1: "complete",
        **dict.fromkeys(range(3, 7), "corrupt"),
    }
    assert all((tmp_path / e.name / CONDEMNED_FILE).exists() for e in entries if e.step > 1)


def test_a_store_that_cannot_be_read_now_refuses_too(tmp_path: Path) -> None:
    """Every checkpoint merely unreadable now (a newer costguard wrote them): kept, never
    condemned, and still no silent start from step 0."""
    url = str(tmp_path)
    saved_run(url, 2)
    for manifest in tmp_path.glob(f"ckpt-*/{MANIFEST_FILE}"):
        manifest.write_text(
            manifest.read_text().replace('"format_version": 2', '"format_version": 99')
        )
    model, opt = adapted()
    with Checkpointer(url) as ckpt, pytest.raises(NoUsableCheckpointError, match="newer"):
        ckpt.restore(model=model, optimizer=opt)
    assert not list(tmp_path.glob(f"ckpt-*/{CONDEMNED_FILE}"))


def test_every_sharded_checkpoint_broken_refuses(one_rank: None, tmp_path: Path) -> None:
    url = str(tmp_path / "ckpt")
    names, _ = save_steps(url, 2)
    for name in names:
        (Path(url) / name / "dcp.metadata").unlink()
    with pytest.raises(NoUsableCheckpointError, match="2 checkpoints"):
        restore_full(url)
    assert restore_full(url, start_fresh=True)[0] == 0


@pytest.mark.slow
def test_costguard_run_exits_2_with_a_hint_then_start_fresh_starts_over(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    url, env = str(tmp_path / "ckpt"), train_env()

    def run(steps: int, *flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *costguard_command(), "run", "--checkpoint", url, "--every-steps", "4", *flags,
                "--", sys.executable, str(SCRIPTS / "lora_train.py"), "--steps", str(steps),
                "--out", str(tmp_path / "out.pt"),
            ],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    assert run(12).returncode == 0
    (Path(url) / "blobs" / shared_blob(url)).unlink()
    refused = run(12)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "READY" not in refused.stdout
    assert "Error: 3 checkpoints" in refused.stderr
    assert "Hint:" in refused.stderr
    assert "--start-fresh" in refused.stderr
    fresh = run(8, "--start-fresh")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert "READY 0" in fresh.stdout
    resumed = run(10)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "READY 8" in resumed.stdout
