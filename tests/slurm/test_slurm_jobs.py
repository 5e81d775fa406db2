"""`costguard slurm submit` on a real single-node SLURM cluster, with a real torch job.

* time limit: SLURM's own warning (``--signal=B:USR1@N`` before the time limit, which
  the test brings close once the job trains) reaches the training script through the
  batch shell and ``costguard run``; it saves, the job requeues itself, resumes, and ends
  with the same weights as an uninterrupted run;
* preemption: ``scancel --signal=USR1 --batch`` and then ``scontrol requeue`` (SLURM's
  SIGTERM to every process of the job) interrupt one job twice, with the same result;
* ``scancel`` is still final: a cancelled job saves but does not requeue itself.

A requeued job waits on a BeginTime hold (about two minutes); the tests release it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from tests.helpers.training import (
    TRAIN_SCRIPT,
    SharedRuns,
    assert_bitwise_equal,
    costguard_command,
    train_reference,
)
from tests.helpers.waiting import wait_for
from tests.slurm.cluster import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

JOB_TIMEOUT_S = 300
POLL_S = 0.3
#: How long a requeued job stays held before the test releases it. SLURM's own hold is
#: about two minutes; released at once, the new allocation can race the old batch step's
#: cleanup and be killed ("Job credential revoked").
HOLD_S = 5.0
FINISHED = {"COMPLETED"}
FAILED = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def training_env(cluster: SlurmCluster, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in cluster.env.items() if not k.startswith("COSTGUARD_")}
    env.update(
        {
            "COSTGUARD_CLOUD": "none",
            "XDG_CONFIG_HOME": str(tmp_path / "no-config"),
            "OMP_NUM_THREADS": "1",
        }
    )
    return env


@pytest.fixture(scope="module")
def reference_weights(shared_runs: SharedRuns) -> Callable[[int], dict[str, object]]:
    """The same training, uninterrupted and outside SLURM (once per number of steps).

    Run before a job is submitted, so that it does not slow the job down.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSTGUARD_")}
    env.update({"COSTGUARD_CLOUD": "none", "OMP_NUM_THREADS": "1"})

    def weights(steps: int) -> dict[str, object]:
        final: dict[str, object] = train_reference(shared_runs, steps, env, 300)
        return final

    return weights


class Job:
    """A job submitted with `costguard slurm submit`, followed through its log and state."""

    def __init__(
        self, cluster: SlurmCluster, tmp_path: Path, env: dict[str, str], *options: str
    ) -> None:
        self.cluster = cluster
        self.out = tmp_path / "trained.pt"
        self.checkpoint = tmp_path / "ckpt"
        self.steps = 0
        self.released = 0
        self.deadline = time.monotonic() + JOB_TIMEOUT_S
        self.options = options
        self.env = env
        self.cwd = tmp_path
        self.events: list[str] = []  # state changes, for the failure message

    def submit(self, steps: int, *train_options: str) -> str:
        command = [*costguard_command(), "slurm", "submit", "--gpus", "0", "--mem", "256M"]
        command += ["--checkpoint", str(self.checkpoint), "--job-name", "cg-test"]
        command += ["--costguard", costguard_command()[0], *self.options, "--"]
        command += [sys.executable, str(TRAIN_SCRIPT), "--steps", str(steps)]
        command += ["--out", str(self.out), *train_options]
        done = subprocess.run(
            command, env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        self.id = done.stdout.strip()
        assert self.id.isdigit(), done.stdout
        assert f"Submitted batch job {self.id}" in done.stderr
        return self.id

    @property
    def log(self) -> str:
        path = self.cwd / f"slurm-{self.id}.out"
        return path.read_text() if path.exists() else ""

    def readies(self) -> list[int]:
        return [int(line.split()[1]) for line in self.log.splitlines() if line.startswith("READY")]

    def last_step(self) -> int:
        steps = [int(ln.split()[1]) for ln in self.log.splitlines() if ln.startswith("STEP ")]
        return steps[-1] if steps else -1

    def wait(self, done: Callable[[], bool], what: str, *, release: bool = True) -> None:
        """Poll until ``done()``, releasing BeginTime holds of the requeued job on the way;
        within the job's deadline, and failed at once by a job that failed."""
        held_since: list[float] = []

        def step() -> bool:
            state, reason = self.cluster.job_state(self.id)
            event = f"{state} ({reason})"
            if not self.events or not self.events[-1].endswith(event):
                self.events.append(f"{time.time():.1f} {event}")
            if not (release and state == "PENDING" and reason == "BeginTime"):
                held_since.clear()
            elif not held_since:
                held_since.append(time.monotonic())
            elif time.monotonic() - held_since[0] >= HOLD_S:
                self.cluster.update(self.id, "StartTime=now")
                self.released += 1
                held_since.clear()
            if done():
                return True
            if state in FAILED:
                raise AssertionError(f"it ended {state}")
            return False

        try:
            left_s = max(0.0, self.deadline - time.monotonic())
            wait_for(step, what, timeout_s=left_s, poll_s=POLL_S)
        except AssertionError as exc:
            pytest.fail(
                f"job {self.id} never {what} ({exc}): {self.events}\n{self.log}\n"
                f"{self.cluster.logs()}"
            )

    def state(self) -> str:
        return self.cluster.job_state(self.id)[0]

    def exit_code(self) -> str:
        text = self.cluster.run("scontrol", "-o", "show", "job", self.id)
        return next(f.split("=", 1)[1] for f in text.split() if f.startswith("ExitCode="))


@pytest.fixture
def env(slurm_cluster: SlurmCluster, tmp_path: Path) -> dict[str, str]:
    return training_env(slurm_cluster, tmp_path)


def test_time_limit_warning_saves_requeues_and_resumes_exactly(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    env: dict[str, str],
    reference_weights: Callable[[int], dict[str, object]],
) -> None:
    steps = 200
    reference = reference_weights(steps)
    job = Job(slurm_cluster, tmp_path, env, "--time", "00:10:00", "--signal-lead", "100",
              "--requeue", "--max-requeues", "3")  # fmt: skip
    job.submit(steps, "--sleep-first", "0.5")  # a resumed run is fast
    job.wait(lambda: job.last_step() >= 3, "trained 3 steps")
    # Once the script is training (the time a busy machine needs to start it varies),
    # bring the limit close: 60-120 s away. SLURM checks limits every 30 s and warns
    # when the limit is nearer than the lead + 30 s: USR1 comes at its next check, at
    # least 30 s before the limit.
    elapsed_s = slurm_cluster.run_time_s(job.id)
    limit_min = (elapsed_s + 60) // 60 + 1
    slurm_cluster.update(job.id, f"TimeLimit={limit_min}")
    job.wait(lambda: job.state() == "PENDING", "requeued itself", release=False)
    # The next allocation gets its ten minutes back, so it ends without a warning.
    slurm_cluster.update(job.id, "TimeLimit=10")
    job.wait(lambda: job.state() in FINISHED, "completed")

    readies = job.readies()
    assert len(readies) == 2, job.log
    assert readies[0] == 0 < readies[1] < steps
    assert "signal notice (SIGUSR1)" in job.log
    assert "costguard: checkpoint saved" in job.log
    assert job.log.count("costguard: requeueing job") == 1
    assert job.released >= 1
    assert job.exit_code() == "0:0"
    assert "DONE" in job.log
    assert_bitwise_equal(torch.load(job.out, weights_only=True), reference)


def test_preempted_twice_by_usr1_and_requeue_resumes_exactly(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    env: dict[str, str],
    reference_weights: Callable[[int], dict[str, object]],
) -> None:
    steps = 60
    reference = reference_weights(steps)
    job = Job(slurm_cluster, tmp_path, env, "--time", "00:10:00", "--requeue")
    job.submit(steps, "--sleep", "0.25")

    # First: USR1 to the batch shell only, as `--signal=B:USR1` would send it.
    job.wait(lambda: job.last_step() >= 5, "trained 5 steps")
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job.id)
    job.wait(lambda: len(job.readies()) == 2 and job.last_step() >= job.readies()[1] + 3,
             "resumed and trained 3 more steps")  # fmt: skip
    first_resume = job.readies()[1]
    assert 5 <= first_resume < steps

    # Then: a preemption by requeue, which sends SIGTERM to every process of the job.
    slurm_cluster.run("scontrol", "requeue", job.id)
    job.wait(lambda: job.state() in FINISHED, "completed")

    readies = job.readies()
    assert len(readies) == 3, job.log
    assert readies[0] == 0 < first_resume < readies[2] < steps
    assert job.log.count("costguard: requeueing job") == 1  # the USR1; SLURM did the 2nd
    assert "costguard: not requeueing: SLURM has the job" in job.log
    assert job.exit_code() == "0:0"
    assert_bitwise_equal(torch.load(job.out, weights_only=True), reference)
    # Each resume starts from the checkpoint saved on the signal, not an older periodic
    # one: at most the step in progress is redone.
    lines = job.log.splitlines()
    for resume in readies[1:]:
        at = next(i for i, line in enumerate(lines) if line.startswith(f"READY {resume} "))
        before = lines[:at]
        last = max(int(line.split()[1]) for line in before if line.startswith("STEP "))
        assert resume - 1 <= last <= resume, (resume, last)


def test_scancel_is_final(slurm_cluster: SlurmCluster, tmp_path: Path, env: dict[str, str]) -> None:
    job = Job(slurm_cluster, tmp_path, env, "--time", "00:10:00", "--requeue")
    job.submit(40, "--sleep", "0.25")
    job.wait(lambda: job.last_step() >= 3, "trained 3 steps")
    slurm_cluster.run("scancel", job.id)
    wait_for(lambda: job.state() == "CANCELLED", "the job cancelled", poll_s=POLL_S)
    # The batch script's last word is whether it requeues: a wrongful requeue comes before.
    wait_for(
        lambda: "costguard: not requeueing" in job.log or "costguard: requeueing" in job.log,
        "the batch script's decision on requeueing",
        poll_s=POLL_S,
    )
    assert "costguard: requeueing" not in job.log
    assert job.state() == "CANCELLED", job.log
    assert job.readies() == [0]
    assert "costguard: checkpoint saved" in job.log  # it saved on the TERM...
    assert "costguard: not requeueing: SLURM has the job" in job.log  # ...and stayed down
