"""Fixtures for the spot suite: the environment for real `costguard launch`/`run` children
(local provider, own state folder, no stray settings) and helpers to read their results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.servers.aws import launch_account

REPO = Path(__file__).resolve().parents[2]
TRAIN_SCRIPT = REPO / "tests" / "checkpoint" / "train_script.py"
#: Every child process is bounded by this (the machine may be shared and slow).
TIMEOUT_S = 600


@pytest.fixture
def spot_env(tmp_path: Path) -> Callable[..., dict[str, str]]:
    """The environment of a `costguard launch --provider local` child."""

    def make(**extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("COSTGUARD_", "AWS_", "AZURE_", "STORAGE_EMULATOR"))
        }
        env.update(
            {
                "COSTGUARD_LOCAL_DIR": str(tmp_path / "local-state"),
                "XDG_CONFIG_HOME": str(tmp_path / "no-config"),
                "COSTGUARD_CACHE_DIR": str(tmp_path / "no-cache"),
                "PYTHONPATH": str(REPO),
                "OMP_NUM_THREADS": "1",
            }
        )
        env.update(extra)
        return env

    return make


def launch_argv(*args: str) -> list[str]:
    """``python -m costguard launch ARGS`` with this interpreter."""
    return [sys.executable, "-m", "costguard", "launch", *args]


def train_command(out: Path, steps: int, sleep: float = 0.05) -> list[str]:
    """The seeded torch training script (tests/checkpoint/train_script.py)."""
    return [
        sys.executable,
        str(TRAIN_SCRIPT),
        "--steps",
        str(steps),
        "--sleep",
        str(sleep),
        "--out",
        str(out),
    ]


def reference_run(tmp_path: Path, env: dict[str, str], steps: int) -> Path:
    """The same training, uninterrupted, checkpointing elsewhere: its final state file."""
    out = tmp_path / "reference.pt"
    subprocess.run(
        train_command(out, steps, sleep=0.0),
        env={**env, "COSTGUARD_CHECKPOINT_URL": str(tmp_path / "reference-ckpt")},
        check=True,
        timeout=TIMEOUT_S,
        capture_output=True,
    )
    return out


def read_job(url: Path) -> dict[str, object]:
    """``job/job.json`` of a local checkpoint folder."""
    data: dict[str, object] = json.loads((url / "job" / "job.json").read_text())
    return data


def attempt_lines(state_dir: Path, job_id: str, attempt: int) -> list[str]:
    """The output lines of a local attempt."""
    return (state_dir / job_id / f"attempt-{attempt}.log").read_text().splitlines()


def steps_of(lines: list[str]) -> tuple[int, int]:
    """(READY step, last STEP printed) of a training attempt's output."""
    ready = next(int(line.split()[1]) for line in lines if line.startswith("READY "))
    steps = [int(line.split()[1]) for line in lines if line.startswith("STEP ")]
    return ready, max(steps, default=ready)


# ------------------------------------------------- cloud launchers (moto-backed AWS helpers)


#: Options an AWS launch needs; moto accepts any AMI id.
@pytest.fixture
def aws_launch_options(aws_env: str) -> dict[str, str]:
    """A clean moto account with the launcher's instance profile; the options that launch
    into it (:func:`tests.servers.aws.launch_account`)."""
    return launch_account()
