"""`costguard slurm script/submit`: the batch script, its quoting, its requeue rule, bad input.

The script itself runs under bash here (no cluster): `--costguard` points at a stand-in
that reports the arguments `costguard run` would get and exits with a chosen status, and
`scontrol` at a stand-in that records its arguments. The real cluster is in
test_slurm_jobs.py.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from costguard.slurm.batch import TEMPLATE_NAME, template_path

ROOT = Path(__file__).resolve().parents[2]
BASE = ("slurm", "script", "--time", "08:00:00", "--checkpoint", "s3://bucket/run1")
WEIRD = ["python", "train.py", "--note", 'it\'s a $HOME `id` "quoted"; rm -rf /', "", "a\nb", "*"]


def script_for(run_cli: Callable[..., Any], *args: str) -> str:
    result = run_cli(*args)
    assert result.exit_code == 0, result.stderr
    return str(result.stdout)


def test_script_asks_for_the_warning_gpus_and_requeue(run_cli: Callable[..., Any]) -> None:
    text = script_for(
        run_cli, *BASE, "--gpus", "2", "--gpu-type", "a100", "--mem", "64g",
        "--partition", "gpu", "--account", "abc123", "--requeue", "--signal-lead", "300",
        "--", "pixi", "run", "python", "train.py",
    )  # fmt: skip
    assert text.startswith("#!/bin/bash\n")
    lines = text.splitlines()
    sbatch = [line for line in lines if line.startswith("#SBATCH")]
    assert sbatch == [
        "#SBATCH --job-name=costguard",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=abc123",
        "#SBATCH --time=08:00:00",
        "#SBATCH --mem=64G",
        "#SBATCH --gres=gpu:a100:2",
        "#SBATCH --signal=B:USR1@300",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
    ]
    # sbatch stops reading #SBATCH lines at the first command: they must all come first.
    first_command = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert all(lines.index(line) < first_command for line in sbatch)
    assert "costguard_run=(costguard run --signals relay --checkpoint s3://bucket/run1)" in text
    assert "command=(pixi run python train.py)" in text
    assert "max_requeues=10" in text
    assert "scontrol requeue" in text
    assert "{{" not in text


def test_cpu_job_has_no_gres_and_no_requeue_unless_asked(run_cli: Callable[..., Any]) -> None:
    text = script_for(run_cli, *BASE, "--gpus", "0", "--", "python", "train.py")
    assert "--gres" not in text
    assert "#SBATCH --requeue" not in text
    assert "max_requeues=0" in text
    assert "#SBATCH --signal=B:USR1@120" in text  # the default lead


def test_run_options_and_local_checkpoint_made_absolute(
    run_cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    text = script_for(
        run_cli, "slurm", "script", "--time", "1-00:00:00", "--checkpoint", "ckpt",
        "--every-minutes", "15", "--keep", "2", "--costguard", "pixi run costguard",
        "--", "python", "train.py",
    )  # fmt: skip
    assert "#SBATCH --time=1-00:00:00" in text
    expected = [
        "pixi",
        "run",
        "costguard",
        "run",
        "--signals",
        "relay",
        "--checkpoint",
        str(tmp_path / "ckpt"),
    ]
    expected += ["--every-minutes", "15.0", "--keep", "2"]
    assert f"costguard_run=({shlex.join(expected)})" in text


def run_script(
    text: str,
    tmp_path: Path,
    *,
    status: int,
    restarts: int | None = None,
    state: str = "RUNNING",
) -> tuple[subprocess.CompletedProcess[str], list[str], list[list[str]]]:
    """Run the batch script with bash, with stand-ins for costguard and scontrol."""
    seen = tmp_path / "argv.json"
    calls = tmp_path / "scontrol.calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(
        f'#!/bin/sh\necho "$@" >> {shlex.quote(str(calls))}\n'
        f'[ "$1" = -o ] && echo "JobId=4242 JobName=x JobState={state} Reason=None"\n'
        "exit 0\n"
    )
    scontrol.chmod(0o755)
    stand_in = tmp_path / "costguard_stand_in.py"
    stand_in.write_text(
        "import json, sys\n"
        f"open({str(seen)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        f"sys.exit({status})\n"
    )
    text = text.replace(
        "costguard_run=(costguard run",
        f"costguard_run=({shlex.quote(sys.executable)} {shlex.quote(str(stand_in))} run",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["SLURM_JOB_ID"] = "4242"
    if restarts is not None:
        env["SLURM_RESTART_COUNT"] = str(restarts)
    done = subprocess.run(
        ["bash", "-c", text], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    argv = json.loads(seen.read_text())
    made = [line.split() for line in calls.read_text().splitlines()] if calls.exists() else []
    return done, argv, [call for call in made if call[0] == "requeue"]


def test_the_command_reaches_costguard_run_word_for_word(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    text = script_for(run_cli, *BASE, "--gpus", "0", "--", *WEIRD)
    done, argv, requeues = run_script(text, tmp_path, status=0)
    assert done.returncode == 0, done.stderr
    assert argv == ["run", "--signals", "relay", "--checkpoint", "s3://bucket/run1", "--", *WEIRD]
    assert requeues == []


@pytest.mark.parametrize(
    ("status", "restarts", "state", "requeue", "code", "requeued"),
    [
        (0, None, "RUNNING", True, 0, False),  # finished
        (3, None, "RUNNING", True, 3, False),  # failed: the job's own status
        (75, None, "RUNNING", True, 0, True),  # saved on a notice: requeue
        (75, 9, "RUNNING", True, 0, True),  # the 10th requeue is still allowed
        (75, 10, "RUNNING", True, 75, False),  # ...the 11th is not
        (75, None, "RUNNING", False, 75, False),  # requeueing not asked for
        (75, None, "CANCELLED", True, 75, False),  # scancel stays final
        (75, None, "PENDING", True, 75, False),  # SLURM requeues it itself
        (138, None, "RUNNING", True, 138, False),  # USR1 death, no warning passed on
    ],
)
def test_requeue_rule(
    run_cli: Callable[..., Any],
    tmp_path: Path,
    status: int,
    restarts: int | None,
    state: str,
    requeue: bool,
    code: int,
    requeued: bool,
) -> None:
    flags = ["--requeue"] if requeue else []
    text = script_for(run_cli, *BASE, "--gpus", "0", *flags, "--", "python", "train.py")
    done, _, calls = run_script(text, tmp_path, status=status, restarts=restarts, state=state)
    assert done.returncode == code, done.stderr
    assert calls == ([["requeue", "4242"]] if requeued else [])
    if status == 75 and not requeued:
        assert "not requeueing" in done.stderr


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (("--time", "8h"), "--time '8h' is not a SLURM time limit"),
        (("--time", "0"), "longer than 0"),
        (("--time", "00:61:00"), "not a SLURM time limit"),
        (("--time", "2-25:00"), "not a SLURM time limit"),
        (("--time", "400-00:00:00"), "more than a year"),
        (("--mem", "64GB"), "--mem '64GB'"),
        (("--mem", "-1G"), "--mem"),
        (("--gpus", "-1"), "--gpus"),
        (("--gpus", "two"), "--gpus"),
        (("--signal-lead", "0"), "--signal-lead"),
        (("--time", "1", "--signal-lead", "60"), "not shorter than the time limit"),
        (("--partition", "gpu; rm"), "--partition"),
        (("--job-name", "a b"), "--job-name"),
        (("--gpus", "0", "--gpu-type", "a100"), "--gpu-type"),
        (("--checkpoint", " "), "--checkpoint"),
        (("--gpu-type", "a100\n"), "--gpu-type"),
        (("--job-name", "train\n"), "--job-name"),
        (("--partition", "gpu\n"), "--partition"),
        (("--account", "lab\n"), "--account"),
        (("--costguard", "'x"), "--costguard"),
        (("--every-minutes", "nan"), "--every-minutes"),
        (("--every-minutes", "inf"), "--every-minutes"),
        (("--every-minutes", "1e400"), "--every-minutes"),
        # the shapes of big jobs: several nodes, arrays, containers, a package mirror
        (("--nodes", "0"), "--nodes"),
        (("--nodes", "two"), "--nodes"),
        (("--gpus-per-node", "-1"), "--gpus"),
        (("--nodes", "2", "--gpus", "0"), "needs --procs-per-node"),
        (("--procs-per-node", "2"), "--procs-per-node is for multi-node jobs"),
        (("--rdzv-port", "2000"), "--rdzv-port is for multi-node jobs"),
        (("--nodes", "2", "--rdzv-port", "80"), "--rdzv-port"),
        (("--nodes", "2", "--torchrun", " "), "--torchrun"),
        (("--nodes", "2", "--gpus", "2", "--", "python3"), "COMMAND is what torchrun runs"),
        (("--nodes", "2", "--gpus", "2", "--", "/x/torchrun"), "COMMAND is what torchrun runs"),
        (("--array", "9-0"), "goes down"),
        (("--array", "0-9:0"), ":step"),
        (("--array", "0-9%0"), "%limit"),
        (("--array", "a-b"), "not a SLURM array"),
        (("--array", "0-9\n#SBATCH --x"), "'--array'"),  # refused by the option's type
        (("--array", "5000000"), "too large"),
        (("--container", "img\n.sif"), "'--container'"),  # refused by the option's type
        (("--container", " "), "--container"),
        (("--index-url", "ftp://mirror/simple"), "not an http(s) URL"),
        (("--index-url", "https://me:pw@mirror/simple"), "carries a user name"),
        (("--index-url", "https://mirror/simple\nx"), "'--index-url'"),
        (("--job-name", "a\nb"), "--job-name"),
        (("--costguard", "'pixi run"), "cannot be split into words"),
        (("--nodes", "2", "--torchrun", "torchrun 'x"), "cannot be split into words"),
    ],
)
def test_bad_input_exits_2_with_a_hint(
    run_cli: Callable[..., Any], extra: tuple[str, ...], needle: str
) -> None:
    for command in ("script", "submit"):
        args = ["slurm", command, "--time", "08:00:00", "--checkpoint", "ckpt/", *extra]
        result = run_cli(*args, "--", "python", "train.py")
        assert result.exit_code == 2, (command, result.stdout, result.stderr)
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert lines[0].startswith("Error: "), lines
        assert needle in lines[0], lines
        assert len(lines) == 2, lines
        assert lines[1].startswith("Hint: ")


@pytest.mark.parametrize("field", ["gpu_type", "job_name", "partition", "account"])
def test_a_trailing_newline_never_reaches_the_sbatch_header(field: str) -> None:
    """Library callers get the same check as the CLI: a newline would end the #SBATCH
    header, and SLURM would ignore --signal, --requeue and --open-mode after it."""
    from costguard.errors import InputError
    from costguard.slurm.batch import BatchJob

    bad: dict[str, Any] = {field: "a100\n"}
    with pytest.raises(InputError, match=field.replace("_", "-")):
        BatchJob.build(
            command=["python", "train.py"], checkpoint="s3://b/run1", time="08:00:00", **bad
        )


def test_missing_command_exits_2(run_cli: Callable[..., Any]) -> None:
    result = run_cli(*BASE)
    assert result.exit_code == 2
    assert "COMMAND" in result.stderr


def test_submit_without_sbatch_says_so(
    run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no sbatch
    result = run_cli("slurm", "submit", *BASE[2:], "--", "python", "train.py")
    assert result.exit_code == 1
    assert "sbatch is not on PATH" in result.stderr
    assert "costguard slurm script" in result.stderr
    assert result.stdout == ""


def test_template_is_the_one_in_infra() -> None:
    assert template_path() == ROOT / "infra" / "slurm" / TEMPLATE_NAME
