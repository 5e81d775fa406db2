"""Training children as the checkpoint and SLURM suites run them: the scripts, the
``costguard`` command, a child whose stdout a test follows line by line, and the check
that a resumed run ended in the state of an uninterrupted one (torch loads only there)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.processes import kill_tree

REPO = Path(__file__).resolve().parents[2]
#: The training scripts (tests/checkpoint/*_train.py, train_script.py, ...).
SCRIPTS = REPO / "tests" / "checkpoint"
TRAIN_SCRIPT = SCRIPTS / "train_script.py"
TORCHRUN = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node"]
#: ``[*RANKS, N, SCRIPT, ...]``: N ranks forked from one interpreter (ranks.py), for runs
#: outside ``costguard run``; ``costguard run -- torchrun`` is what the runs under it use.
RANKS = [sys.executable, str(REPO / "tests" / "helpers" / "ranks.py")]
#: What the distributed scripts print: ``READY rank pid step`` once, ``STEP rank step``.
READY = re.compile(r"READY (\d+) (\d+) (\d+)")
STEP = re.compile(r"STEP (\d+) (\d+)")


def batches(trials: int, size: int) -> list[int]:
    """``trials`` split into batches of at least ``size`` (one batch when fewer), summing to
    it: crash trials run as several tests, each on its own store, so xdist's workers share
    them.

    >>> batches(200, 50), batches(25, 50), batches(26, 25), batches(10, 5), batches(3, 5)
    ([50, 50, 50, 50], [25], [26], [5, 5], [3])
    """
    count = max(1, trials // size)
    return [trials // count + (1 if i < trials % count else 0) for i in range(count)]


def costguard_command() -> list[str]:
    """The installed ``costguard`` script of this interpreter's environment."""
    script = Path(sys.executable).with_name("costguard")
    if not script.exists():
        found = shutil.which("costguard")
        assert found, "costguard is not installed in this environment: pip install -e ."
        script = Path(found)
    return [str(script)]


def repository_path() -> str:
    """``PYTHONPATH`` for a child that imports ``tests``: the repository, then this
    environment's own entries."""
    inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return os.pathsep.join([str(REPO), *filter(None, inherited)])


def child_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """The environment of a child process: this one's, less every cloud and costguard
    setting, with no config file, the repository importable (before this environment's
    ``PYTHONPATH``), one OpenMP thread, and ``settings``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("COSTGUARD_", "AWS_", "AZURE_", "STORAGE_EMULATOR"))
    }
    env.update(
        {
            "XDG_CONFIG_HOME": str(tmp_path / "no-config"),
            "PYTHONPATH": repository_path(),
            "OMP_NUM_THREADS": "1",
        }
    )
    env.update(settings)
    return env


def run_python(checkpoint: str | Path, code: str) -> list[str]:
    """``costguard run --checkpoint CHECKPOINT -- python -c CODE``."""
    command = [*costguard_command(), "run", "--checkpoint", str(checkpoint), "--"]
    return [*command, sys.executable, "-c", code]


class Followed:
    """A child process whose stdout lines a test reads as they come, within a deadline."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        timeout_s: float,
        cwd: Path | None = None,
    ) -> None:
        self.proc = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd
        )
        self.command = command
        self.lines: list[str] = []
        self.err: str | None = None
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s

    def read_until(self, predicate: Callable[[str], bool]) -> str:
        """Read lines until one satisfies ``predicate`` (that line); else kill and fail."""
        assert self.proc.stdout is not None
        while time.monotonic() < self.deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.strip())
            if predicate(line.strip()):
                return line.strip()
        kill_tree(self.proc)
        _, self.err = self.proc.communicate(timeout=30)
        raise AssertionError(
            f"child ended or timed out; stdout {self.lines[-6:]}, {self.err[-3000:]}"
        )

    def finish(self) -> int:
        """Wait for the exit (its code); the rest of stdout joins ``lines``, stderr is kept.
        Past the deadline, the process and all below it are killed and the test fails with
        what it printed."""
        try:
            out, self.err = self.proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc)
            out, self.err = self.proc.communicate(timeout=30)
            raise AssertionError(
                f"{self.command[:3]}... did not end within {self.timeout_s} s: stdout "
                f"{out.splitlines()[-6:]}, stderr {self.err[-3000:]}"
            ) from None
        self.lines.extend(line.strip() for line in out.splitlines())
        return self.proc.returncode

    def stderr(self) -> str:
        if self.err is not None:
            return self.err
        return self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""


class RankedJob(Followed):
    """``costguard run -- torchrun --nproc-per-node RANKS SCRIPT``, saving every 4 steps."""

    def __init__(
        self,
        script: Path,
        ranks: int,
        steps: int,
        url: str,
        out: Path,
        env: dict[str, str],
        *,
        timeout_s: float,
    ) -> None:
        command = [*costguard_command(), "run", "--checkpoint", url, "--every-steps", "4", "--"]
        command += [*TORCHRUN, str(ranks), str(script), "--steps", str(steps), "--out", str(out)]
        super().__init__([*command, "--sleep", "0.1"], env, timeout_s)

    def ready(self) -> dict[int, tuple[int, int]]:
        """rank -> (pid, step it resumed at)."""
        text = "\n".join(self.lines)
        return {int(r): (int(p), int(s)) for r, p, s in READY.findall(text)}

    def last_step(self) -> int:
        return max((int(s) for _, s in STEP.findall("\n".join(self.lines))), default=0)


def reached(line: str, step: int) -> bool:
    """A distributed script's ``STEP rank step`` line at ``step`` or later."""
    return any(int(s) >= step for _, s in STEP.findall(line))


def manifests(folder: str | Path) -> list[dict[str, Any]]:
    """The manifests of every committed checkpoint in a local checkpoint folder."""
    return [json.loads(p.read_text()) for p in Path(folder).glob("ckpt-*/manifest.json")]


def newest_manifest(folder: str | Path) -> dict[str, Any]:
    """The manifest of the checkpoint of the highest step in a local checkpoint folder."""
    return max(manifests(folder), key=lambda m: int(m["step"]))


class SharedRuns:
    """Folders of outputs made once per test run, for every test and every pytest-xdist
    worker that asks with the same key: the uninterrupted reference trainings. They are
    seeded and deterministic, so each resumed run compares against the one made first
    (tests of one scenario on several stores share it)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def folder(self, key: Sequence[str], make: Callable[[Path], None]) -> Path:
        """The folder of ``key``'s outputs; ``make(folder)`` fills it if no test has yet."""
        digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]
        folder = self.root / digest
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / f"{digest}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a worker making it: wait for its outputs
            if not (folder / ".made").exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                make(folder)
                (folder / ".made").touch()
        return folder


def train_reference(shared: SharedRuns, steps: int, env: dict[str, str], timeout_s: float) -> Any:
    """An uninterrupted run of the training script for ``steps`` steps, checkpointing in
    its own folder (made once per test run): its final weights."""
    import torch

    def make(folder: Path) -> None:
        subprocess.run(
            [
                sys.executable,
                str(TRAIN_SCRIPT),
                "--steps",
                str(steps),
                "--out",
                str(folder / "out.pt"),
            ],
            env={**env, "COSTGUARD_CHECKPOINT_URL": str(folder / "ckpt")},
            check=True,
            timeout=timeout_s,
            capture_output=True,
        )

    folder = shared.folder((TRAIN_SCRIPT.name, str(steps)), make)
    return torch.load(folder / "out.pt", weights_only=True)


def ranks_reference(
    shared: SharedRuns, script: Path, ranks: int, env: dict[str, str], *args: str
) -> Path:
    """An uninterrupted run of a distributed script on ``ranks`` ranks (made once per test
    run): its ``--out``, rank 0's full state, beside which ``<out>.rank<r>`` holds each
    rank's own."""

    def make(folder: Path) -> None:
        out = folder / "out.pt"
        done = subprocess.run(
            [*RANKS, str(ranks), str(script), "--out", str(out), *args],
            env={**env, "COSTGUARD_CHECKPOINT_URL": str(folder / "ckpt")},
            capture_output=True,
            text=True,
            timeout=300,  # ranks.py ends hung ranks at 230 s, with their stacks
            check=False,
        )
        # gloo's teardown sometimes aborts a rank after the work is done and written (torch's
        # own flake, without costguard): that alone is no failure of the reference.
        aborted = "terminate called without an active exception" in done.stderr
        wrote = out.exists() and all(Path(f"{out}.rank{r}").exists() for r in range(ranks))
        assert done.returncode == 0 or (aborted and wrote), done.stderr[-3000:]

    return shared.folder((script.name, str(ranks), *args), make) / "out.pt"


def assert_same(a: object, b: object, *, close: bool = False) -> None:
    """``a`` and ``b`` hold the same tensors, containers and values: bitwise, or with
    ``close`` tensors and floats within float rounding (atol 1e-6, rel 1e-6)."""
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        if close:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        else:
            assert a.dtype == b.dtype
            assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict)
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key], close=close)
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y, close=close)
    elif close and isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-6)
    else:
        assert a == b


def assert_bitwise_equal(a: object, b: object) -> None:
    assert_same(a, b)
