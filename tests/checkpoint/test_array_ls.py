"""`costguard checkpoint ls` on a job array's parent folder: each task's latest checkpoint,
from two array tasks run by hand with the real batch script and `costguard run`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from costguard.cli import cli
from tests.checkpoint.test_export import trained
from tests.helpers.training import TRAIN_SCRIPT, costguard_command


def test_two_array_tasks_by_hand_then_ls_on_the_parent(tmp_path: Path) -> None:
    parent = tmp_path / "sweep"
    made = CliRunner().invoke(
        cli,
        ["slurm", "script", "--array", "0-1", "--gpus", "0", "--time", "10:00",
         "--checkpoint", str(parent), "--costguard", costguard_command()[0], "--every-steps", "2",
         "--", sys.executable, str(TRAIN_SCRIPT), "--steps", "5",
         "--out", str(tmp_path / "out.pt")],
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COSTGUARD_", "SLURM_"))}
    env.update({"COSTGUARD_CLOUD": "none", "OMP_NUM_THREADS": "1"})
    env["XDG_CONFIG_HOME"] = str(tmp_path / "no-config")
    for task in ("0", "1"):
        slurm = {
            "SLURM_ARRAY_JOB_ID": "40",
            "SLURM_ARRAY_TASK_ID": task,
            "SLURM_JOB_ID": f"4{task}",
        }
        done = subprocess.run(
            ["bash", "-c", made.output], env={**env, **slurm}, cwd=tmp_path,
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in parent.iterdir()) == ["task-0", "task-1"]

    listed = CliRunner().invoke(cli, ["checkpoint", "ls", str(parent)])
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert lines[0].split()[:4] == ["TASK", "LATEST", "CHECKPOINT", "STEP"]
    assert [line.split()[:3] for line in lines[1:3]] == [
        ["task-0", lines[1].split()[1], "5"],
        ["task-1", lines[2].split()[1], "5"],
    ]
    assert all(line.split()[1].startswith("ckpt-000000000005-") for line in lines[1:3]), lines
    assert lines[3].startswith("2 array task(s); ")
    assert all(len(line) <= 80 for line in lines)


def test_ls_marks_each_tasks_resume_point_and_a_plain_run_is_unchanged(tmp_path: Path) -> None:
    parent = tmp_path / "sweep"
    trained(str(parent / "task-10"), steps=4)
    trained(str(parent / "task-2"), steps=7)
    newest = next((parent / "task-2").glob("ckpt-000000000007-*/state.pt"))
    raw = bytearray(newest.read_bytes())
    raw[-100] ^= 0xFF  # task 2's newest does not verify: its resume point is step 6
    newest.write_bytes(bytes(raw))
    (parent / "task-3").mkdir()  # a task that has not saved yet
    (parent / "task-3" / "ckpt-000000000001-aaaaaaaa").mkdir()
    (parent / "task-3" / "ckpt-000000000001-aaaaaaaa" / "state.pt").write_bytes(b"cut off")

    listed = CliRunner().invoke(cli, ["checkpoint", "ls", str(parent), "--format", "json"])
    assert listed.exit_code == 0, listed.output
    doc = json.loads(listed.output)
    summary = [
        (t["task"], t["checkpoints"], t["latest"]["step"] if t["latest"] else None)
        for t in doc["tasks"]
    ]
    assert summary == [("task-2", 3, 6), ("task-3", 1, None), ("task-10", 2, 4)]
    table = CliRunner().invoke(cli, ["checkpoint", "ls", str(parent)])
    assert "task-3       - (none verifies)" in table.output
    assert all(len(line) <= 80 for line in table.output.splitlines())

    # A folder with checkpoints of its own is one run: listed as before, task folders aside.
    trained(str(parent), steps=3)
    plain = CliRunner().invoke(cli, ["checkpoint", "ls", str(parent), "--format", "json"])
    assert "tasks" not in json.loads(plain.output)
    assert [c["step"] for c in json.loads(plain.output)["checkpoints"]][:1] == [3]
