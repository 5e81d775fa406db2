"""Sharded state across real processes: a 4-rank FSDP2 run (``fully_shard`` on a CPU device
mesh, gloo, torchrun) with the README's Checkpointer calls, under ``costguard run``.

* Preempted twice (SIGTERM to one rank's worker; a GCP preemption notice from the metadata
  server), resumed, and bitwise equal to an uninterrupted 4-rank run: weights, optimizer,
  scheduler, and every rank's RNG states and loader position.
* The final checkpoint restored on 2 ranks and on 1: the same full state (DCP reshards);
  one saved on 2 ranks restored on 4 likewise.
* kill -9 of one rank at a random moment of a run that saves at every step (once rank 0
  has taken 3 to 5 steps), then a restore: every trial loads the newest complete, verified
  checkpoint, later than the last trial's, and every folder with a manifest holds every
  object it lists, hashes equal. The suite runs
  ``COSTGUARD_SHARDED_CRASH_TRIALS`` trials (default 10), in batches of five on their own
  stores, so that pytest-xdist's workers share them.

The runs under ``costguard run`` start their ranks with torchrun; the others (the
uninterrupted reference, the restores, the kill trials) fork them from one interpreter
(tests/helpers/ranks.py), which spares each rank torch's imports.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from costguard.checkpoint import Checkpointer
from costguard.checkpoint.manifest import MANIFEST_FILE, SHARDED_FORMAT_VERSION, scan
from tests.checkpoint.fsdp_train import build
from tests.helpers.metadata import MetadataState
from tests.helpers.training import (
    RANKS,
    READY,
    SCRIPTS,
    STEP,
    RankedJob,
    SharedRuns,
    assert_bitwise_equal,
    batches,
    newest_manifest,
    ranks_reference,
    reached,
)
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.slow

SCRIPT = SCRIPTS / "fsdp_train.py"
STEPS = 14
TIMEOUT_S = 300
TRIALS = int(os.environ.get("COSTGUARD_SHARDED_CRASH_TRIALS", "10"))


def run_ranks(ranks: int, url: str, out: Path, env: dict[str, str], *args: str) -> None:
    """An uninterrupted run (or a restore only, with ``--steps`` at the checkpoint's step)."""
    done = subprocess.run(
        [*RANKS, str(ranks), str(SCRIPT), "--out", str(out), *args],
        env={**env, "COSTGUARD_CHECKPOINT_URL": url},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    # gloo's teardown sometimes aborts a rank after the work is done and written (2 runs in
    # 10 of a plain 4-rank FSDP2 script, no costguard, torch 2.13): that alone is no failure.
    wrote = len(set(re.findall(r"WROTE (\d+)", done.stdout))) == ranks
    aborted = "terminate called without an active exception" in done.stderr
    assert done.returncode == 0 or (wrote and aborted), done.stdout[-2000:] + done.stderr[-4000:]


def fsdp_job(url: str, out: Path, env: dict[str, str]) -> RankedJob:
    """`costguard run -- torchrun --nproc-per-node 4 fsdp_train.py`, its stdout followed."""
    return RankedJob(SCRIPT, 4, STEPS, url, out, env, timeout_s=TIMEOUT_S)


def final(out: Path, ranks: int) -> dict[str, Any]:
    return {
        "state": torch.load(out, weights_only=True),
        "ranks": [torch.load(f"{out}.rank{r}", weights_only=True) for r in range(ranks)],
    }


@pytest.mark.timeout(900)  # six 4-rank runs on a machine of two cores
def test_fsdp2_on_4_ranks_preempted_twice_resumes_bitwise_then_reshards_to_2_and_1(
    tmp_path: Path,
    shared_runs: SharedRuns,
    train_env: Callable[..., dict[str, str]],
    metadata_server: tuple[str, MetadataState],
    watched_env: Callable[[str], dict[str, str]],
) -> None:
    _, state = metadata_server
    env = watched_env("gcp")
    reference_out = ranks_reference(shared_runs, SCRIPT, 4, train_env(), "--steps", str(STEPS))

    seed = random.randrange(10**6)
    rng = random.Random(seed)
    url, out = str(tmp_path / "ckpt"), tmp_path / "resumed.pt"
    done = 0
    for attempt, reason in (
        ("sigterm-to-rank-2", "notice:signal-signal"),
        ("gcp-metadata", "notice:gcp-preempt"),
    ):
        job = fsdp_job(url, out, env)
        job.read_until(functools.partial(reached, step=done + rng.randint(2, 5)))
        ready = job.ready()
        assert {r: s for r, (_, s) in ready.items()} == dict.fromkeys(range(4), done), seed
        if attempt == "sigterm-to-rank-2":
            os.kill(ready[2][0], signal.SIGTERM)  # one worker alone: every rank must save
        else:
            state.gcp_preempted = True
        code, err = job.finish(), job.stderr()
        state.gcp_preempted = False
        assert code == 75, (seed, attempt, job.lines[-6:], err[-4000:])
        newest = newest_manifest(url)
        # Zero lost steps, and every rank's shard in the emergency checkpoint.
        assert newest["step"] >= job.last_step(), (seed, attempt)
        assert newest["reason"] == reason, (seed, attempt, newest)
        assert newest["format_version"] == SHARDED_FORMAT_VERSION
        assert {o["name"] for o in newest["objects"]} >= {
            "dcp.metadata",
            "train.pt",
            *(f"shard-{r:05d}.distcp" for r in range(4)),
        }
        done = newest["step"]
    final_job = fsdp_job(url, out, {**env, "COSTGUARD_CLOUD": "none"})
    code, err = final_job.finish(), final_job.stderr()
    assert code == 0, err[-4000:]
    assert {r: s for r, (_, s) in final_job.ready().items()} == dict.fromkeys(range(4), done)
    reference = final(reference_out, 4)
    assert_bitwise_equal(final(out, 4), reference)

    # The final checkpoint (step STEPS) on fewer ranks: the same full state.
    for ranks in (2, 1):
        restored_out = tmp_path / f"restored-on-{ranks}.pt"
        run_ranks(ranks, url, restored_out, train_env(), "--steps", str(STEPS))
        assert_bitwise_equal(torch.load(restored_out, weights_only=True), reference["state"])


def test_saved_on_2_ranks_restored_on_4_has_the_same_full_state(
    tmp_path: Path, train_env: Callable[..., dict[str, str]]
) -> None:
    url, steps = str(tmp_path / "ckpt"), 6
    run_ranks(2, url, tmp_path / "two.pt", train_env(), "--steps", str(steps))
    run_ranks(4, url, tmp_path / "four.pt", train_env(), "--steps", str(steps))
    assert_bitwise_equal(
        torch.load(tmp_path / "four.pt", weights_only=True),
        torch.load(tmp_path / "two.pt", weights_only=True),
    )


# -- kill -9 -------------------------------------------------------------------------


def complete_folders(root: Path) -> dict[str, int]:
    """Folders whose manifest lists objects all present with their size: name -> step."""
    sizes = {str(p.relative_to(root)): p.stat().st_size for p in root.glob("ckpt-*/*")}
    out = {}
    for folder in scan(sizes):
        if folder.has_manifest:
            manifest = json.loads((root / folder.name / MANIFEST_FILE).read_text())
            if all(
                sizes.get(f"{folder.name}/{o['name']}") == o["size_bytes"]
                for o in manifest["objects"]
            ):
                out[folder.name] = folder.step
    return out


def assert_hashes_match(root: Path, name: str) -> None:
    manifest = json.loads((root / name / MANIFEST_FILE).read_text())
    for entry in manifest["objects"]:
        digest = hashlib.sha256((root / name / entry["name"]).read_bytes()).hexdigest()
        assert digest == entry["sha256"], (name, entry["name"])


def kill_trial(url: Path, env: dict[str, str], rng: random.Random, log: Path) -> str:
    """Run 4 ranks saving at every step; kill -9 one rank at a random moment after rank 0
    has taken 3 to 5 steps (so a save has committed: the moment is drawn by count, not by a
    time that the machine's load decides); what of it."""
    command = [*RANKS, "4", str(SCRIPT), "--steps", "400", "--out", str(url / "x.pt")]
    command += ["--every-steps", "1"]
    with log.open("w") as err:
        proc = subprocess.Popen(
            command,
            env={**env, "COSTGUARD_CHECKPOINT_URL": str(url)},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    assert proc.stdout is not None
    try:
        pids: dict[int, int] = {}
        targets: list[int] = []

        def rank_0_past_its_target() -> bool:
            """One more line of the ranks' output (read as it comes, ``poll_s=0``)."""
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"the ranks ended: {log.read_text()[-4000:]}")
            pids.update({int(r): int(p) for r, p, _ in READY.findall(line)})
            starts = [int(s) for r, _, s in READY.findall(line) if r == "0"]
            if starts:  # rank 0's step after each save waits for the one before
                targets[:] = [starts[0] + rng.randint(3, 5)]
            steps = [int(n) for r, n in STEP.findall(line) if r == "0"]
            return bool(targets and steps and steps[0] >= targets[0])

        wait_for(rank_0_past_its_target, "rank 0 past its target step", timeout_s=TIMEOUT_S,
                 poll_s=0)  # fmt: skip
        assert len(pids) == 4, f"the ranks did not start: {log.read_text()[-4000:]}"
        victim = rng.randrange(4)
        time.sleep(rng.uniform(0.0, 1.0))  # saves take most of each step: most kills hit one
        os.kill(pids[victim], signal.SIGKILL)
        proc.wait(timeout=60)  # ranks.py ends the other ranks when one dies
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        proc.stdout.close()
    return f"rank {victim}"


@pytest.mark.timeout(120 + 120 * max(batches(TRIALS, 5)))  # a 4-rank start per trial
@pytest.mark.parametrize("batch", batches(TRIALS, 5))
def test_kill_9_of_one_rank_during_sharded_saves_never_breaks_a_restore(
    tmp_path: Path, train_env: Callable[..., dict[str, str]], one_rank: None, batch: int
) -> None:
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    url = tmp_path / "ckpt"
    env = train_env()
    restored_steps = []
    for trial in range(batch):
        what = kill_trial(url, env, rng, tmp_path / f"trial-{trial}.err")
        complete = complete_folders(url)
        for name in complete:  # a manifest is only ever written over whole objects
            assert_hashes_match(url, name)
        model, optimizer, scheduler, _ = build(0, 1)
        with Checkpointer(url, keep_last=3) as ckpt:
            step = ckpt.restore(model=model, optimizer=optimizer, scheduler=scheduler)
            assert ckpt.restored is not None or not complete, (seed, trial, what)
        assert step == max(complete.values(), default=0), (seed, trial, what, complete)
        restored_steps.append(step)
    print(f"kill -9 trials: {batch}, restores that loaded the newest complete: {batch}")
    # Each trial committed a save past the step it resumed at before its kill.
    assert restored_steps == sorted(set(restored_steps)), (seed, restored_steps)
    assert restored_steps[0] > 0, (seed, restored_steps)
