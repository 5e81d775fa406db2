"""`costguard slurm submit --nodes` and `--array` on the real one-node SLURM cluster.

* ``--nodes 1 --procs-per-node 2``: the batch shell starts torchrun through ``srun`` with
  c10d rendezvous at the allocation's first node, under ``costguard run``; SLURM's warning
  (USR1 to the batch shell) reaches it through srun, both ranks save, the job requeues
  itself and resumes; then a preemption (``scontrol requeue``: TERM to every process)
  does the same; the end is bitwise equal to an uninterrupted 2-process run. (More nodes need
  more machines: test_multinode.py runs two torchrun nodes on loopback.)
* ``--array 0-1``: each task checkpoints to its own ``task-<index>`` folder; a warning to
  one task requeues that task alone; ``costguard checkpoint ls`` on the parent lists both.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.checkpoint.test_distributed import DDP_SCRIPT
from tests.helpers.training import (
    TRAIN_SCRIPT,
    SharedRuns,
    assert_bitwise_equal,
    costguard_command,
    ranks_reference,
    repository_path,
)
from tests.slurm.cluster import SlurmCluster
from tests.slurm.test_slurm_jobs import FINISHED, Job, training_env

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


class BigJob(Job):
    """A job whose command and options are given whole."""

    def submit_command(self, *command: str) -> str:
        argv = [*costguard_command(), "slurm", "submit", "--mem", "512M", "--job-name", "cg-big"]
        argv += ["--checkpoint", str(self.checkpoint), "--costguard", costguard_command()[0]]
        argv += [*self.options, "--", *command]
        done = subprocess.run(
            argv, env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        self.id = done.stdout.strip()
        assert self.id.isdigit(), done.stdout
        return self.id

    def log_of(self, name: str) -> str:
        path = self.cwd / name
        return path.read_text() if path.exists() else ""

    def steps_in(self, text: str) -> int:
        """The last step any rank finished (ddp_train.py: ``STEP <rank> <n>``)."""
        steps = [int(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("STEP ")]
        return max(steps, default=-1)

    def steps_in_task(self, name: str) -> int:
        return self.steps_in(self.log_of(name))


def test_multi_node_script_on_one_node_saves_on_the_warning_and_resumes_exactly(
    slurm_cluster: SlurmCluster, tmp_path: Path, shared_runs: SharedRuns
) -> None:
    env = training_env(slurm_cluster, tmp_path)
    env["PYTHONPATH"] = repository_path()
    steps = 24
    reference_out = ranks_reference(shared_runs, DDP_SCRIPT, 2, env, "--steps", str(steps))

    out = tmp_path / "trained.pt"
    job = BigJob(slurm_cluster, tmp_path, env, "--time", "00:10:00", "--requeue",
                 "--nodes", "1", "--gpus-per-node", "0", "--procs-per-node", "2",
                 "--torchrun", TORCHRUN, "--every-steps", "4")  # fmt: skip
    job.submit_command(str(DDP_SCRIPT), "--steps", str(steps), "--out", str(out), "--sleep", "0.2")
    job.wait(lambda: job.steps_in(job.log) >= 5, "trained 5 steps")
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job.id)

    def readies() -> list[str]:
        return [ln for ln in job.log.splitlines() if ln.startswith("READY ")]

    job.wait(lambda: len(readies()) == 4, "resumed")
    job.wait(lambda: job.steps_in(job.log) >= int(readies()[-1].split()[3]) + 3, "trained on")
    # Then a preemption: SLURM's TERM to every process of the job, srun's tasks included.
    slurm_cluster.run("scontrol", "requeue", job.id)
    job.wait(lambda: job.state() in FINISHED, "completed")

    log = job.log
    assert len(readies()) == 6, log  # two ranks, three allocations
    assert "costguard: not requeueing: SLURM has the job" in log, log
    (resumed,) = {int(ln.split()[3]) for ln in readies()[2:4]}  # both ranks at one step
    assert 5 <= resumed < steps, log
    assert "signal notice (SIGUSR1)" in log, log
    assert log.count("costguard: requeueing job") == 1, log
    assert job.exit_code() == "0:0"
    for rank in (0, 1):
        assert_bitwise_equal(
            torch.load(f"{out}.rank{rank}", weights_only=True),
            torch.load(f"{reference_out}.rank{rank}", weights_only=True),
        )
    assert_bitwise_equal(
        torch.load(out, weights_only=True), torch.load(reference_out, weights_only=True)
    )


def test_array_tasks_have_their_own_folders_and_only_the_warned_one_requeues(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    env = training_env(slurm_cluster, tmp_path)
    job = BigJob(slurm_cluster, tmp_path, env, "--time", "00:10:00", "--requeue", "--gpus", "0",
                 "--array", "0-1", "--every-steps", "5")  # fmt: skip
    array_id = job.submit_command(
        sys.executable, str(TRAIN_SCRIPT), "--steps", "40", "--sleep", "0.25",
        "--out", str(tmp_path / "out.pt"),
    )  # fmt: skip
    logs = {task: f"slurm-{array_id}_{task}.out" for task in (0, 1)}
    tasks = {task: f"{array_id}_{task}" for task in (0, 1)}
    job.wait(lambda: all(job.steps_in_task(logs[t]) >= 3 for t in (0, 1)), "both trained")
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", tasks[1])

    def finished() -> bool:
        return all(slurm_cluster.job_state(own)[0] in FINISHED for own in tasks.values())

    for own in tasks.values():
        job.id = own  # follow each task's own job (and release its requeue hold)
        job.wait(lambda: slurm_cluster.job_state(job.id)[0] in FINISHED, "completed")
    assert finished()
    log0, log1 = job.log_of(logs[0]), job.log_of(logs[1])
    assert "costguard: requeueing job" not in log0, log0
    assert log1.count(f"costguard: requeueing job {tasks[1]}") == 1, log1
    starts = [int(ln.split()[1]) for ln in log1.splitlines() if ln.startswith("READY")]
    assert len(starts) == 2, log1
    assert starts[0] == 0 < starts[1], log1  # task 1 resumed from its own checkpoint

    parent = job.checkpoint
    assert sorted(p.name for p in parent.iterdir()) == ["task-0", "task-1"]
    listed = subprocess.run(
        [*costguard_command(), "checkpoint", "ls", str(parent), "--format", "json"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    doc = json.loads(listed.stdout)
    assert [(t["task"], t["latest"]["step"]) for t in doc["tasks"]] == [
        ("task-0", 40),
        ("task-1", 40),
    ]
