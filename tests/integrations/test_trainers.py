"""``costguard run --sync-dir`` with the trainers' own checkpoints: Hugging Face Trainer,
Lightning and an Accelerate loop, real processes, real signals, real stores.

Each trainer is stopped twice by SIGTERM (its preemption callback saves at the next step
boundary, the process exits 75, the folder is committed to the store), the local output
folder is deleted before each restart (a new machine), and the run ends at its last step
with the same weights as an uninterrupted run of the same script. A SIGKILL in the middle
of a trainer's save never leaves a half folder to resume from.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from costguard.checkpoint.pace import read_pace
from costguard.checkpoint.restoring import Restorer
from costguard.checkpoint.store import Store
from costguard.cli.checkpoint import checkpoint_group
from tests.helpers.stores import Backend, make_s3_bucket
from tests.helpers.training import (
    Followed,
    SharedRuns,
    assert_bitwise_equal,
    child_env,
    costguard_command,
)

HERE = Path(__file__).parent
STEPS = 60  # 6 saves of 10 steps; the steps take ~1 s, each process ~10 s of imports
TIMEOUT_S = 400
#: Five trainer processes a test (each imports torch and its trainer: 10 s idle, minutes on
#: two busy cores): a safety net, not a budget.
pytestmark = pytest.mark.timeout(1500)
#: Where each of the two notices is sent: so many steps after the run resumed.
AFTER = (13, 12)
TWICE_SIGTERM = (signal.SIGTERM, signal.SIGTERM)
#: lightning_train.py's batches per epoch (not imported: that would load Lightning here).
LIGHTNING_EPOCH = 24
#: hf_train.py's optimizer steps per epoch: 48 samples in batches of 4.
HF_EPOCH = 12


class Run(Followed):
    """``costguard run --checkpoint URL --sync-dir OUT -- python SCRIPT``."""

    def __init__(self, script: str, url: str, out: Path, env: dict[str, str], *args: str) -> None:
        command = [*costguard_command(), "run", "--checkpoint", url, "--sync-dir", str(out)]
        command += ["--", sys.executable, str(HERE / script), "--out", str(out), *args]
        super().__init__(command, env, TIMEOUT_S)

    def steps(self) -> list[int]:
        return [int(line.split()[1]) for line in self.lines if line.startswith("STEP ")]


def kept(url: str) -> list[tuple[int, str]]:
    """(step, path in the sync dir) of each committed --sync-dir checkpoint in the store."""
    text = os.environ.get("COSTGUARD_STORAGE_OPTIONS")
    survey = Restorer(Store.open(url, json.loads(text) if text else None)).survey()
    return sorted((m.step, m.extra["folder"]["path"]) for m in survey.manifests if m.folder)


def recorded_pace(url: str, *, total: int, per_epoch: int) -> None:
    """The trainer's callback recorded the finishing run's pace in the store (through
    ``costguard run``): its steps, its total, an epoch's steps and its saves apart."""
    text = os.environ.get("COSTGUARD_STORAGE_OPTIONS")
    pace = read_pace(Store.open(url, json.loads(text) if text else None))
    assert pace is not None
    assert (pace.steps_done, pace.total_steps, pace.steps_per_epoch) == (total, total, per_epoch)
    assert pace.steps_measured > 0
    assert pace.seconds_per_step > 0
    assert pace.saves >= 1  # the trainer's saves are stalls counted apart


def export_matches(url: str, tmp_path: Path, final: Path) -> None:
    """``costguard checkpoint ls/verify/export`` on the store: the exported safetensors are
    the final weights (those the trainer saved; a tied copy it leaves out is not there)."""
    runner = CliRunner()
    for args in (["ls", url], ["verify", url]):
        result = runner.invoke(checkpoint_group, args)
        assert result.exit_code == 0, result.output
    target = tmp_path / "model.safetensors"
    result = runner.invoke(checkpoint_group, ["export", url, "--to", str(target)])
    assert result.exit_code == 0, result.output
    exported, weights = load_file(target), torch.load(final, weights_only=True)
    assert exported
    assert set(exported) <= set(weights)
    assert_bitwise_equal(exported, {k: weights[k] for k in exported})


def reference(shared: SharedRuns, script: str, env: dict[str, str], *args: str) -> object:
    """The final weights of an uninterrupted run, without costguard (the callbacks then
    do nothing); made once per test run."""

    def make(folder: Path) -> None:
        command = [sys.executable, str(HERE / script), "--out", str(folder / "out")]
        run = Followed([*command, "--final", str(folder / "final.pt"), *args], env, TIMEOUT_S)
        assert run.finish() == 0, run.stderr()[-3000:]

    folder = shared.folder((script, *args), make)
    return torch.load(folder / "final.pt", weights_only=True)


def store_for(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    if name == "local":
        return Backend(name, str(tmp_path / "store"))
    request.getfixturevalue("aws_env")
    make_s3_bucket(os.environ["AWS_ENDPOINT_URL"], "trainers")
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    return Backend(name, "s3://trainers/run1", env)


def preempted_twice(
    script: str,
    store: Backend,
    tmp_path: Path,
    env: dict[str, str],
    resumed_from: Callable[[str], int],
    *args: str,
    signals: tuple[signal.Signals, signal.Signals] = TWICE_SIGTERM,
) -> tuple[Path, list[int]]:
    """Two notices (``signals`` to costguard run), each on a new machine (``out`` deleted
    first), then a run to the end; the final weights' file and the steps saved on the
    notices."""
    out, final = tmp_path / "out", tmp_path / "final.pt"
    args = ("--final", str(final), "--steps", str(STEPS), "--sleep", "0.05", *args)
    env = {**env, **store.env}
    done, saved = 0, []
    for after, sig in zip(AFTER, signals, strict=True):
        shutil.rmtree(out, ignore_errors=True)
        run = Run(script, store.url, out, env, *args)
        start = resumed_from(run.read_until(lambda line: line.startswith("READY")))
        assert start == done, (start, done, run.lines)  # resumed exactly where it saved
        run.read_until(functools.partial(at_step, step=start + after))
        run.proc.send_signal(sig)
        assert run.finish() == 75, run.stderr()[-3000:]
        done = max(run.steps())
        saved.append(done)
        # Saved at the step boundary after the notice: the newest checkpoint is that step.
        assert max(kept(store.url))[0] == done, (kept(store.url), run.stderr()[-2000:])
    shutil.rmtree(out)
    run = Run(script, store.url, out, env, *args)
    assert resumed_from(run.read_until(lambda line: line.startswith("READY"))) == done
    assert run.finish() == 0, run.stderr()[-3000:]
    assert max(run.steps()) == STEPS
    return final, saved


def at_step(line: str, step: int) -> bool:
    return line == f"STEP {step}"


def hf_step(line: str) -> int:
    name = line.split()[1]
    return 0 if name == "none" else int(name.removeprefix("checkpoint-"))


def ready_step(line: str) -> int:
    return int(line.split()[1])


@pytest.fixture
def train_env(tmp_path: Path) -> dict[str, str]:
    """A training child's environment: no cloud, no stray costguard or cloud settings."""
    return child_env(tmp_path, COSTGUARD_CLOUD="none")


@pytest.fixture
def hf_env(train_env: dict[str, str]) -> dict[str, str]:
    return {
        **train_env,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TOKENIZERS_PARALLELISM": "false",
    }


@pytest.mark.slow
@pytest.mark.parametrize("store_name", ["local", "s3"])
def test_hf_trainer_survives_two_notices_on_new_machines(
    store_name: str,
    tmp_path: Path,
    hf_env: dict[str, str],
    request: pytest.FixtureRequest,
    shared_runs: SharedRuns,
) -> None:
    store = store_for(store_name, tmp_path, request)
    expected = reference(shared_runs, "hf_train.py", hf_env, "--steps", str(STEPS), "--callback")
    final, _ = preempted_twice("hf_train.py", store, tmp_path, hf_env, hf_step, "--callback")
    assert_bitwise_equal(torch.load(final, weights_only=True), expected)
    export_matches(store.url, tmp_path, final)


@pytest.mark.slow
@pytest.mark.parametrize("store_name", ["local", "s3"])
def test_lightning_survives_two_notices_on_new_machines(
    store_name: str,
    tmp_path: Path,
    train_env: dict[str, str],
    shared_runs: SharedRuns,
    request: pytest.FixtureRequest,
) -> None:
    store = store_for(store_name, tmp_path, request)
    env = train_env
    expected = reference(
        shared_runs, "lightning_train.py", env, "--steps", str(STEPS), "--callback"
    )
    final, saved = preempted_twice(
        "lightning_train.py", store, tmp_path, env, ready_step, "--callback"
    )
    # Both saves were mid-epoch: the resumed runs took up the epoch's data where it was.
    assert all(step % LIGHTNING_EPOCH for step in saved), saved
    assert_bitwise_equal(torch.load(final, weights_only=True), expected)
    assert {path for _, path in kept(store.url)} == {"last.ckpt"}
    recorded_pace(store.url, total=STEPS, per_epoch=LIGHTNING_EPOCH)
    export_matches(store.url, tmp_path, final)


@pytest.mark.slow
def test_accelerate_loop_survives_two_notices_on_every_store(
    backend: Backend, tmp_path: Path, train_env: dict[str, str], shared_runs: SharedRuns
) -> None:
    env = train_env
    expected = reference(shared_runs, "accelerate_train.py", env, "--steps", str(STEPS))
    # SIGINT (Ctrl-C) is not forwarded: costguard run relays it through the notice file.
    final, _ = preempted_twice(
        "accelerate_train.py",
        backend,
        tmp_path,
        env,
        ready_step,
        signals=(signal.SIGTERM, signal.SIGINT),
    )
    assert_bitwise_equal(torch.load(final, weights_only=True), expected)
    assert {path for _, path in kept(backend.url)} <= {f"checkpoint_{s}" for s in range(99)}


@pytest.mark.slow
def test_a_kill_during_a_trainer_save_never_restores_a_half_folder(
    tmp_path: Path, hf_env: dict[str, str], shared_runs: SharedRuns
) -> None:
    url, out, final = str(tmp_path / "store"), tmp_path / "out", tmp_path / "final.pt"
    args = ("--final", str(final), "--steps", "30", "--callback")
    dying = Run("hf_train.py", url, out, hf_env, *args, "--die-in-save", "20")
    dying.read_until(lambda line: line == "DYING")
    assert dying.finish() == 137  # the shell's code for SIGKILL
    assert (out / "checkpoint-20").is_dir()  # half written: no trainer_state.json
    assert not (out / "checkpoint-20" / "trainer_state.json").exists()
    assert kept(url) == [(10, "checkpoint-10")]  # the half folder never went up
    # Same machine: the half folder is moved aside, so the Trainer resumes from 10.
    again = Run("hf_train.py", url, out, hf_env, *args)
    assert again.read_until(lambda line: line.startswith("READY")) == "READY checkpoint-10"
    assert again.finish() == 0, again.stderr()[-3000:]
    assert "half written" in again.stderr()
    assert [p.name.split(".")[0] for p in (out / ".costguard-incomplete").iterdir()] == [
        "checkpoint-20"
    ]
    expected = reference(shared_runs, "hf_train.py", hf_env, "--steps", "30")
    assert_bitwise_equal(torch.load(final, weights_only=True), expected)
    assert max(kept(url)) == (30, "checkpoint-30")
    recorded_pace(url, total=30, per_epoch=HF_EPOCH)


@pytest.mark.slow
def test_without_the_callback_a_kill_loses_at_most_save_steps(
    tmp_path: Path, hf_env: dict[str, str]
) -> None:
    url, out, final = str(tmp_path / "store"), tmp_path / "out", tmp_path / "final.pt"
    args = ("--final", str(final), "--steps", "30", "--sleep", "0.05")
    run = Run("hf_train.py", url, out, hf_env, *args)
    run.read_until(lambda line: line == "STEP 23")
    run.proc.send_signal(signal.SIGTERM)  # forwarded: the Trainer dies of it
    # Before max_steps (its trainer_state.json says): preempted, not failed; resumable.
    assert run.finish() == 75, run.stderr()[-3000:]
    killed_at = max(run.steps())
    saved = killed_at // 10 * 10
    assert f"newest checkpoint: step {saved} (checkpoint-{saved} as ckpt-" in run.stderr()
    shutil.rmtree(out)
    again = Run("hf_train.py", url, out, hf_env, *args)
    start = hf_step(again.read_until(lambda line: line.startswith("READY")))
    assert 0 <= killed_at - start <= 10, (killed_at, start)
    assert again.finish() == 0, again.stderr()[-3000:]


@pytest.mark.slow
def test_an_accelerate_save_killed_in_its_registered_object_is_never_restored(
    tmp_path: Path, train_env: dict[str, str]
) -> None:
    """Accelerate writes custom_checkpoint_0.pkl (an EMA given to register_for_checkpointing)
    after random_states_0.pkl: killed in that write, the folder is never kept, and the
    restart resumes from the save before (it had restored the cut one and crashed in
    load_state, every time)."""
    url, out, final = str(tmp_path / "store"), tmp_path / "out", tmp_path / "final.pt"
    args = ("--final", str(final), "--steps", "30", "--ema")
    dying = Run("accelerate_train.py", url, out, train_env, *args, "--die-in-custom", "20")
    dying.read_until(lambda line: line == "DYING")
    assert dying.finish() == 137
    assert (out / "checkpoint_20" / "random_states_0.pkl").is_file()  # its mark is there
    assert kept(url) == [(10, "checkpoint_10")]
    again = Run("accelerate_train.py", url, out, train_env, *args)
    assert again.read_until(lambda line: line.startswith("READY")) == "READY 10"
    assert again.finish() == 0, again.stderr()[-3000:]
    assert "custom_checkpoint_0.pkl" in again.stderr()  # why checkpoint_20 was set aside
    assert max(kept(url)) == (30, "checkpoint_30")


@pytest.mark.slow
@pytest.mark.parametrize("store_name", ["local", "s3"])
def test_lightning_without_the_callback_stopped_by_a_notice_was_preempted(
    store_name: str, tmp_path: Path, train_env: dict[str, str], request: pytest.FixtureRequest
) -> None:
    """Lightning turns SIGTERM into a graceful stop and exit 0: before max_steps that is a
    preemption (75), and the exit line names the newest checkpoint in the store. A loader
    Lightning cannot resume mid-epoch is named at the start (with the callback)."""
    store = store_for(store_name, tmp_path, request)
    env = {**train_env, **store.env}
    out, final = tmp_path / "out", tmp_path / "final.pt"
    args = ("--final", str(final), "--steps", "60", "--sleep", "0.05", "--plain-loader")
    run = Run("lightning_train.py", store.url, out, env, *args)
    run.read_until(functools.partial(at_step, step=13))
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 75, run.stderr()[-3000:]
    assert "newest checkpoint: step 10 (last.ckpt as ckpt-000000000010-" in run.stderr()
    assert "not resumable" not in run.stderr()  # no callback: Lightning says it, later
    again = Run("lightning_train.py", store.url, out, env, *args, "--callback")
    again.read_until(lambda line: line.startswith("STEP "))  # the callback's watch is in
    again.proc.send_signal(signal.SIGTERM)
    assert again.finish() == 75, again.stderr()[-3000:]
    assert "DataLoader is not resumable mid-epoch" in again.stderr(), again.stderr()[-3000:]
