"""`costguard slurm script` for big jobs: --nodes (one torchrun per node through srun,
c10d rendezvous), --array (a checkpoint folder per task, only the warned task requeues),
--container (Apptainer) and --index-url (a package mirror), and their bad input.

The scripts run under bash with stand-ins on PATH that record their arguments and run
what they are given: `srun`, `scontrol`, `apptainer`, `torchrun` and `costguard` (through
--costguard). The package mirror is a local HTTP server that real pip asks. A real
one-node cluster runs the --nodes and --array scripts in test_slurm_jobs.py.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

BASE = ("slurm", "script", "--time", "08:00:00", "--checkpoint", "s3://bucket/run1")
#: What pip does on a node that needs a package: it must ask the mirror.
PIP_PROBE = [
    sys.executable, "-m", "pip", "download", "--no-deps", "--dest", "downloads",
    "--retries", "0", "--timeout", "5", "costguard-mirror-probe",
]  # fmt: skip

STAND_IN = """#!{python}
import json, os, subprocess, sys
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(os.environ["CALLS"], "a") as log:
    log.write(json.dumps([name, *args]) + "\\n")
if name == "scontrol":
    if args[:2] == ["show", "hostnames"]:
        print("node-a\\nnode-b")
    elif args[:1] == ["-o"]:
        print("JobId=4242 JobState=RUNNING Reason=None")
    sys.exit(0)
if name == "costguard":
    command = args[args.index("--") + 1 :]
elif name == "apptainer":
    rest = args[1:]
    while rest[0].startswith("--"):
        rest = rest[2:] if rest[0] == "--bind" else rest[1:]
    command = rest[1:]
elif name == "srun":
    command = args
    while command[0].startswith("--"):
        command = command[1:]
else:  # torchrun: the work itself is not needed here
    sys.exit(int(os.environ.get("STATUS", "0")))
sys.exit(subprocess.run(command).returncode)
"""


def script_for(run_cli: Callable[..., Any], *args: str) -> str:
    result = run_cli(*args)
    assert result.exit_code == 0, result.stderr
    return str(result.stdout)


def stand_ins(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("srun", "scontrol", "apptainer", "torchrun", "costguard"):
        path = bin_dir / name
        path.write_text(STAND_IN.format(python=sys.executable))
        path.chmod(0o755)
    return bin_dir


def run_script(
    text: str, tmp_path: Path, *, status: int = 0, slurm: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """Run a batch script under bash with the stand-ins; every call they recorded."""
    bin_dir = stand_ins(tmp_path)
    calls = tmp_path / "calls.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PIP_", "UV_"))}
    env.update({"PATH": f"{bin_dir}:{env['PATH']}", "CALLS": str(calls), "STATUS": str(status)})
    env.update({"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node-[a-b]", **(slurm or {})})
    env["PIP_CONFIG_FILE"] = os.devnull  # this machine's pip settings play no part
    done = subprocess.run(
        ["bash", "-c", text], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    made = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    return done, made


def calls_of(made: list[list[str]], name: str) -> list[list[str]]:
    return [call[1:] for call in made if call[0] == name]


def test_multi_node_script_starts_one_torchrun_per_node_and_requeues_the_job(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    text = script_for(
        run_cli, *BASE, "--nodes", "2", "--gpus-per-node", "4", "--requeue",
        "--costguard", str(tmp_path / "bin" / "costguard"),
        "--", "train.py", "--lr", "3e-4",
    )  # fmt: skip
    lines = text.splitlines()
    assert "#SBATCH --nodes=2" in lines
    assert "#SBATCH --ntasks-per-node=1" in lines
    assert "#SBATCH --gres=gpu:4" in lines
    first_command = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert all(i < first_command for i, ln in enumerate(lines) if ln.startswith("#SBATCH"))
    assert 'rdzv_host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    done, made = run_script(text, tmp_path, status=75)
    assert done.returncode == 0, done.stderr
    (srun,) = calls_of(made, "srun")
    assert srun[:3] == ["--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    (costguard,) = calls_of(made, "costguard")
    assert costguard[:5] == ["run", "--signals", "relay", "--checkpoint", "s3://bucket/run1"]
    (torchrun,) = calls_of(made, "torchrun")
    assert torchrun == [
        "--nnodes", "2", "--nproc-per-node", "4", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"node-a:{29500 + 4242}", "--rdzv-id", "4242",
        "train.py", "--lr", "3e-4",
    ]  # fmt: skip
    # Saved on the warning (75): the whole job requeues, once.
    assert calls_of(made, "scontrol")[-1] == ["requeue", "4242"]
    assert "costguard: requeueing job 4242" in done.stderr


def test_multi_node_on_cpus_with_a_chosen_port_and_launcher(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    text = script_for(
        run_cli, *BASE, "--nodes", "1", "--gpus", "0", "--procs-per-node", "3",
        "--rdzv-port", "31234", "--torchrun", "pixi run torchrun", "--", "-m", "pkg.train",
    )  # fmt: skip
    assert "--gres" not in text
    assert "torchrun=(pixi run torchrun --nnodes 1 --nproc-per-node 3" in text
    assert "rdzv_port=31234" in text
    assert "command=(-m pkg.train)" in text


def test_array_tasks_get_their_own_folder_and_only_the_warned_one_requeues(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    text = script_for(
        run_cli, *BASE[:-1], "s3://bucket/sweep/", "--array", "0-9%4", "--requeue",
        "--costguard", str(tmp_path / "bin" / "costguard"), "--", "true",
    )  # fmt: skip
    assert "#SBATCH --array=0-9%4" in text
    # Task 3 of array job 4240 is job 4243: it is the one that requeues.
    slurm = {"SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_ID": "4243"}
    done, made = run_script(text.replace("exit(0)", ""), tmp_path, slurm=slurm)
    assert done.returncode == 0, done.stderr
    (costguard,) = calls_of(made, "costguard")
    assert costguard[3:5] == ["--checkpoint", "s3://bucket/sweep/task-3"]
    assert [c for c in calls_of(made, "scontrol") if c[0] == "requeue"] == []


def test_an_array_task_saved_on_its_warning_requeues_alone(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    ckpt = tmp_path / "sweep dir"
    text = script_for(
        run_cli, *BASE[:-1], str(ckpt), "--array", "1,3,5-7:2", "--requeue",
        "--costguard", str(tmp_path / "bin" / "costguard"),
        "--", sys.executable, "-c", "import sys; sys.exit(75)",
    )  # fmt: skip
    slurm = {"SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": "5", "SLURM_JOB_ID": "4245"}
    done, made = run_script(text, tmp_path, slurm=slurm)
    assert done.returncode == 0, done.stderr
    (costguard,) = calls_of(made, "costguard")
    assert costguard[3:5] == ["--checkpoint", f"{ckpt}/task-5"]
    # The task by its array name: its job id may be the array's, which names every task.
    assert calls_of(made, "scontrol") == [["-o", "show", "job", "4240_5"], ["requeue", "4240_5"]]


def test_container_runs_the_command_in_apptainer_with_the_checkpoint_bound(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    marker = tmp_path / "ran"
    text = script_for(
        run_cli, *BASE[:-1], str(ckpt), "--gpus", "1", "--container", "images/train.sif",
        "--costguard", str(tmp_path / "bin" / "costguard"),
        "--", sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')",
    )  # fmt: skip
    done, made = run_script(text, tmp_path)
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "x"  # the command ran, inside the (stand-in) container
    assert ckpt.is_dir()  # made before the bind: Apptainer binds only folders that exist
    (apptainer,) = calls_of(made, "apptainer")
    image = str(Path.cwd() / "images" / "train.sif")  # made absolute where it is written
    assert apptainer[:5] == ["exec", "--nv", "--bind", str(ckpt), image]
    assert apptainer[5:7] == [sys.executable, "-c"]
    (costguard,) = calls_of(made, "costguard")
    assert costguard[costguard.index("--") + 1] == "apptainer"  # costguard run stays outside


def test_multi_node_in_a_container_cpu_only(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    text = script_for(
        run_cli, *BASE, "--nodes", "2", "--gpus", "0", "--procs-per-node", "2",
        "--container", "docker://pytorch/pytorch:latest",
        "--costguard", str(tmp_path / "bin" / "costguard"), "--", "train.py",
    )  # fmt: skip
    done, made = run_script(text, tmp_path)
    assert done.returncode == 0, done.stderr
    (apptainer,) = calls_of(made, "apptainer")
    # No GPU: no --nv; an s3:// checkpoint: nothing to bind.
    assert apptainer[:3] == ["exec", "docker://pytorch/pytorch:latest", "torchrun"]
    assert calls_of(made, "torchrun")[0][-1] == "train.py"


def mirror_requests(tmp_path: Path, make_script: Callable[[int], str]) -> list[str]:
    """The paths pip asked a loopback package mirror for while the script ran."""
    asked: list[str] = []

    class Mirror(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Mirror)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        text = make_script(server.server_address[1])
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
        env.update({"PIP_CONFIG_FILE": os.devnull, "PATH": f"{stand_ins(tmp_path)}:{env['PATH']}"})
        env.update({"CALLS": str(tmp_path / "calls.jsonl"), "SLURM_JOB_ID": "4242"})
        done = subprocess.run(
            ["bash", "-c", text], env=env, cwd=tmp_path, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        assert "costguard-mirror-probe" in done.stderr, done.stderr  # pip found nothing there
    finally:
        server.shutdown()
        server.server_close()
    return asked


def test_the_index_url_reaches_pip_in_the_job(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    def batch(port: int) -> str:
        return script_for(
            run_cli, *BASE, "--gpus", "0", "--index-url", f"http://127.0.0.1:{port}/simple/",
            "--costguard", str(tmp_path / "bin" / "costguard"), "--", *PIP_PROBE,
        )  # fmt: skip

    # Every request reached the mirror (pip may also ask it about itself).
    assert "/simple/costguard-mirror-probe/" in mirror_requests(tmp_path, batch)


def test_the_script_of_every_shape_is_valid_bash(run_cli: Callable[..., Any]) -> None:
    text = script_for(
        run_cli, *BASE, "--nodes", "4", "--array", "0-3", "--container", "i.sif",
        "--index-url", "https://mirror.example/simple/", "--", "train.py",
    )  # fmt: skip
    subprocess.run(["bash", "-n"], input=text, text=True, check=True, timeout=30)
    assert "{{" not in text
    assert shlex.quote("s3://bucket/run1/task-") + '"$SLURM_ARRAY_TASK_ID"' in text


@pytest.mark.slow
def test_a_warning_reaches_the_training_script_inside_the_container(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    """Real `costguard run` and training script, the stand-in apptainer between them: the
    script is no child of `costguard run`, so the notice comes through the relay file."""
    from tests.helpers.training import TRAIN_SCRIPT, costguard_command, manifests

    ckpt = tmp_path / "ckpt"
    text = script_for(
        run_cli, *BASE[:-1], str(ckpt), "--gpus", "0", "--container", "t.sif", "--requeue",
        "--costguard", costguard_command()[0],
        "--", sys.executable, str(TRAIN_SCRIPT), "--steps", "200", "--sleep", "0.1",
        "--out", str(tmp_path / "out.pt"),
    )  # fmt: skip
    bin_dir = stand_ins(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "COSTGUARD_"))}
    env.update({"PATH": f"{bin_dir}:{env['PATH']}", "CALLS": str(tmp_path / "calls.jsonl")})
    env.update({"SLURM_JOB_ID": "4242", "COSTGUARD_CLOUD": "none", "OMP_NUM_THREADS": "1"})
    env["XDG_CONFIG_HOME"] = str(tmp_path / "no-config")
    shell = subprocess.Popen(
        ["bash", "-c", text], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert shell.stdout is not None
    for line in shell.stdout:
        if line.startswith("STEP 3"):
            break
    shell.send_signal(signal.SIGUSR1)  # as SLURM's --signal=B:USR1 does
    _, err = shell.communicate(timeout=120)
    assert shell.returncode == 0, err[-3000:]
    assert "signal notice (SIGUSR1)" in err, err[-3000:]
    assert "costguard: checkpoint saved" in err
    assert "costguard: requeueing job 4242" in err
    made = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert calls_of(made, "apptainer")[0][:3] == ["exec", "--bind", str(ckpt)]
    # The notice's save is the newest; a scheduled save may come first on a busy machine.
    saved = sorted(manifests(ckpt), key=lambda m: int(m["step"]))
    assert saved[-1]["reason"] == "notice:signal-signal", saved
    assert {m["reason"] for m in saved[:-1]} <= {"schedule"}, saved
