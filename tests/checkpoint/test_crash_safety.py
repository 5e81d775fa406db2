"""Crash safety: a writer killed with SIGKILL at moments of its saves drawn by hypothesis
(inside serialise, upload, manifest write or retention delete, or at a random time) never
leaves a store whose "latest" is incomplete, and every restore loads a valid checkpoint.

The default run does a modest number of trials; CI sets COSTGUARD_CRASH_TRIALS=200. A large
count is split into batches of ``BATCH`` trials or more, each its own test on its own store
and seed, so that pytest-xdist's workers share them; the trials add up to the count asked.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.stores import make_s3_bucket
from tests.helpers.training import SCRIPTS, batches

TRIALS = int(os.environ.get("COSTGUARD_CRASH_TRIALS", "25"))
#: The fewest trials in one batch: enough that kills land in every phase of a save.
BATCH = 25


def trials_timeout_s(trials: int) -> int:
    """A safety net, not a budget: a trial takes about a second on an idle machine, and a
    busy one (four test workers on two cores) may take many times that; the count of trials
    is what the test asks for, never what fits a time."""
    return 120 + trials * 30


def run_trials(url: str, trials: int, env: dict[str, str], *mode: str) -> dict[str, object]:
    seed = random.randrange(10**6)
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "crash_trials.py"), url, str(trials), str(seed), *mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=trials_timeout_s(trials),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["seed"] = seed
    return result


@pytest.mark.slow
@pytest.mark.parametrize("batch", batches(TRIALS, 50))
@pytest.mark.timeout(60 + trials_timeout_s(max(batches(TRIALS, 50))))
def test_kill_9_during_saves_on_a_local_store(
    tmp_path: Path, train_env: Callable[..., dict[str, str]], batch: int
) -> None:
    result = run_trials(str(tmp_path / "ckpt"), batch, train_env())
    assert result["failures"] == [], result
    trials, landed = result["trials"], result["landed"]
    assert isinstance(trials, int)
    assert trials >= batch
    assert isinstance(landed, dict)
    # Kills landed in every phase of a save, not only between saves.
    assert {"serialise", "upload", "manifest", "retention"} <= set(landed), landed
    steps = result["steps"]
    assert isinstance(steps, list)
    assert steps[-1] > steps[0]
    # Garbage is bounded: however the kills fell (a run of them inside retention leaves
    # half-deleted folders, on a busy machine more often), the next save that is not killed
    # deletes every abandoned folder and keeps two checkpoints.
    import torch

    from costguard.checkpoint import Checkpointer

    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Linear(256, 128))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Checkpointer(
        str(tmp_path / "ckpt"), keep_last=2, check=False, partial_grace_s=0.0
    ) as ckpt:
        step = ckpt.restore(model=model, optimizer=optimizer)
        ckpt.save(step, model=model, optimizer=optimizer)
    left = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt-"))
    assert len(left) == 2, left
    assert all((tmp_path / "ckpt" / name / "manifest.json").exists() for name in left), left


@pytest.mark.slow
@pytest.mark.parametrize("batch", batches(max(5, TRIALS // 4), BATCH))
@pytest.mark.timeout(60 + trials_timeout_s(max(batches(max(5, TRIALS // 4), BATCH))))
def test_kill_9_during_saves_on_s3(
    train_env: Callable[..., dict[str, str]], aws_env: str, batch: int
) -> None:
    make_s3_bucket(aws_env, "crash")
    env = train_env(**{k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    result = run_trials("s3://crash/run", batch, env)
    assert result["failures"] == [], result
    landed = result["landed"]
    assert isinstance(landed, dict)
    assert {"serialise", "upload", "manifest", "retention"} <= set(landed), result


#: Trials of incremental saves (``COSTGUARD_CRASH_TRIALS`` scales them too).
POOL_TRIALS = max(10, TRIALS * 2 // 5)


@pytest.mark.slow
@pytest.mark.parametrize("batch", batches(POOL_TRIALS, 40))
@pytest.mark.timeout(60 + trials_timeout_s(max(batches(POOL_TRIALS, 40))))
def test_kill_9_during_incremental_saves_on_a_local_store(
    tmp_path: Path, train_env: Callable[..., dict[str, str]], batch: int
) -> None:
    result = run_trials(str(tmp_path / "ckpt"), batch, train_env(), "lora")
    assert result["failures"] == [], result
    landed = result["landed"]
    assert isinstance(landed, dict)
    assert {"serialise", "upload", "manifest", "retention"} <= set(landed), landed
    steps = result["steps"]
    assert isinstance(steps, list)
    assert steps[-1] > steps[0]
    # Pool objects were written, and unneeded ones deleted: at most those of the two kept
    # checkpoints (two each, one shared) and of a save cut off by the last kill.
    pooled = list((tmp_path / "ckpt" / "blobs").glob("[0-9a-f]*"))
    assert 2 <= len(pooled) <= 5, pooled


@pytest.mark.slow
@pytest.mark.timeout(60 + trials_timeout_s(max(4, POOL_TRIALS // 3)))
def test_kill_9_during_incremental_saves_on_s3(
    train_env: Callable[..., dict[str, str]], aws_env: str
) -> None:
    make_s3_bucket(aws_env, "crash-pool")
    env = train_env(**{k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    result = run_trials("s3://crash-pool/run", max(4, POOL_TRIALS // 3), env, "lora")
    assert result["failures"] == [], result
