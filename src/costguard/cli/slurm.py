"""``costguard slurm script/submit``: a preempt-safe SLURM batch job around a training script."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from costguard.checkpoint.completion import sync_dir_path
from costguard.cli.helpformat import HelpGroup
from costguard.cli.options import TRAILING_COMMAND, cadence_options
from costguard.cli.params import Name, StoreUrl, Text, WholeNumber, option_group
from costguard.errors import InputError
from costguard.secrets import find_secret
from costguard.slurm.batch import (
    DEFAULT_MAX_REQUEUES,
    DEFAULT_SIGNAL_LEAD_S,
    MAX_SIGNAL_LEAD_S,
    BatchJob,
    batch_script,
)

F = TypeVar("F", bound=Callable[..., Any])

HOW = """The job runs COMMAND under `costguard run --checkpoint URL`. SLURM sends USR1 to the
batch shell --signal-lead seconds before the time limit, and TERM on preemption or
scancel; the shell passes both on, the training script (with a costguard Checkpointer)
saves and exits 75, and with --requeue the job requeues itself (`scontrol requeue`, at
most --max-requeues times) and resumes from the checkpoint in its next allocation.

With --nodes, each node's torchrun runs under its own `costguard run` and the whole job
requeues; with --array, each task has its own checkpoint folder and requeues alone
(`costguard estimate --count 10` prices a 10-task sweep; `costguard checkpoint ls` on
the --checkpoint folder lists each task's latest)."""


def job_options(func: F) -> F:
    """The options shared by ``script`` and ``submit``."""
    options = [
        click.option(
            "--checkpoint",
            "url",
            type=StoreUrl(),
            required=True,
            help="Where checkpoints go: a folder on a shared file system, s3://..., gs://...",
        ),
        click.option(
            "--time",
            "time_limit",
            metavar="TIME",
            type=Name(),
            required=True,
            help="SLURM time limit: HH:MM:SS, D-HH:MM:SS, MM...",
        ),
        click.option(
            "--gpus",
            "--gpus-per-node",
            "gpus",
            type=WholeNumber(0, 1024),
            default=1,
            show_default=True,
            help="GPUs per node (--gres=gpu:N); 0 for a CPU partition.",
        ),
        click.option(
            "--nodes",
            type=WholeNumber(1, 100_000),
            help="Multi-node: one torchrun per node (srun), c10d rendezvous at the first "
            "node; COMMAND is what torchrun runs (train.py ARGS, or -m MODULE).",
        ),
        click.option(
            "--procs-per-node",
            type=WholeNumber(1, 1024),
            help="With --nodes: processes per node (default: one per GPU).",
        ),
        click.option(
            "--rdzv-port",
            type=WholeNumber(1024, 65535),
            help="With --nodes: the rendezvous port (default: 29500 + job id % 10000).",
        ),
        click.option(
            "--torchrun",
            "torchrun_command",
            metavar="COMMAND",
            type=Text(),
            default="torchrun",
            show_default=True,
            help="With --nodes: how the nodes start torchrun, e.g. 'pixi run torchrun'.",
        ),
        click.option(
            "--array",
            metavar="RANGE",
            type=Name(),
            help="A job array, e.g. 0-9 or 0-99%8: each task checkpoints to "
            "<checkpoint>/task-<index>; only a warned task requeues.",
        ),
        click.option(
            "--container",
            metavar="IMAGE",
            type=Text(),
            help="Run the command inside this Apptainer image (apptainer exec --nv, the "
            "checkpoint folder bound in), e.g. image.sif.",
        ),
        click.option(
            "--index-url",
            metavar="URL",
            type=Text(),
            help="The site's package mirror (PIP_INDEX_URL and UV_DEFAULT_INDEX in the job), "
            "so nothing needs the public index.",
        ),
        click.option(
            "--gpu-type", type=Name(), help="GPU type in the GRES request, e.g. a100 (gpu:a100:N)."
        ),
        click.option(
            "--mem",
            metavar="SIZE",
            type=Name(),
            help="Memory per node, e.g. 64G (plain numbers are MB).",
        ),
        click.option("--cpus-per-task", type=WholeNumber(1, 4096), help="CPUs for the job."),
        click.option("--partition", type=Name(), help="SLURM partition(s), comma-separated."),
        click.option("--account", type=Name(), help="Account (allocation) to charge."),
        click.option(
            "--job-name",
            type=Name(),
            default="costguard",
            show_default=True,
            help="SLURM job name.",
        ),
        click.option(
            "--requeue",
            is_flag=True,
            help="After a save on the warning signal or a preemption, requeue the job.",
        ),
        click.option(
            "--max-requeues",
            type=WholeNumber(0, 10_000),
            default=DEFAULT_MAX_REQUEUES,
            show_default=True,
            help="With --requeue: requeue at most N times (SLURM_RESTART_COUNT).",
        ),
        click.option(
            "--signal-lead",
            type=WholeNumber(1, MAX_SIGNAL_LEAD_S),
            default=DEFAULT_SIGNAL_LEAD_S,
            show_default=True,
            help="Seconds before the time limit that SLURM sends USR1 (it may come up to a "
            "minute earlier).",
        ),
        cadence_options("Also save"),
        click.option("--keep", type=WholeNumber(min=1), help="Keep the newest N checkpoints."),
        click.option(
            "--sync-dir",
            metavar="DIR",
            type=Text(),
            help="Keep the trainer's own checkpoints written here (Hugging Face, Accelerate, "
            "Lightning) in the store; see costguard run --help.",
        ),
        click.option(
            "--costguard",
            "costguard_command",
            metavar="COMMAND",
            type=Text(),
            default="costguard",
            show_default=True,
            help="How the nodes start costguard, e.g. 'pixi run costguard'.",
        ),
        click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True),
    ]
    return option_group(*options)(func)


def build_job(options: dict[str, Any]) -> BatchJob:
    """Validate the options into a :class:`BatchJob` (exit 2 on bad input, nothing run)."""
    url: str = options["url"]
    for flag, value in (("--checkpoint", url), ("--sync-dir", options["sync_dir"])):
        found = find_secret({flag: [value]}, os.environ) if value else None
        if found:  # before either is made absolute
            msg = f"{flag} carries {found[1]}, which would be written into the batch script"
            raise InputError(msg, hint="give the nodes access to the store by their own identity")
    if url.strip() and "://" not in url:
        # The job may start in another folder than this one: make a local path absolute.
        url = str(Path(url).expanduser().resolve())
    run_options: list[str] = []
    for flag, name in (
        ("--every-steps", "every_steps"),
        ("--every-minutes", "every_minutes"),
        ("--keep", "keep"),
    ):
        if options[name] is not None:
            run_options += [flag, str(options[name])]
    if options["sync_dir"] is not None:
        # Like a local checkpoint folder: the job may start in another folder than this one.
        run_options += ["--sync-dir", sync_dir_path(options["sync_dir"], here=True)]
    command: Sequence[str] = options["command"]
    container: str | None = options["container"]
    if container is not None and container.strip() and "://" not in container:
        container = str(Path(container.strip()).expanduser().resolve())
    return BatchJob.build(
        command=command,
        checkpoint=url,
        time=options["time_limit"],
        signal_lead_s=options["signal_lead"],
        gpus=options["gpus"],
        gpu_type=options["gpu_type"],
        mem=options["mem"],
        cpus_per_task=options["cpus_per_task"],
        partition=options["partition"],
        account=options["account"],
        job_name=options["job_name"],
        requeue=options["requeue"],
        max_requeues=options["max_requeues"],
        costguard=options["costguard_command"],
        run_options=run_options,
        nodes=options["nodes"],
        procs_per_node=options["procs_per_node"],
        rdzv_port=options["rdzv_port"],
        torchrun=options["torchrun_command"],
        array=options["array"],
        container=container,
        index_url=options["index_url"],
    )


@click.group(
    "slurm",
    cls=HelpGroup,
    short_help="Preempt-safe SLURM batch jobs that save and requeue themselves.",
    epilog="""\b
Examples:
  costguard slurm script --gpus 1 --mem 64G --time 08:00:00 --requeue \\
      --checkpoint /scratch/$USER/run1 -- pixi run python train.py \\
      > job.sbatch
  costguard slurm submit --gpus 1 --time 08:00:00 --partition gpu --requeue \\
      --checkpoint s3://my-bucket/run1 -- pixi run python train.py""",
)
def slurm_group() -> None:
    """Write or submit a SLURM batch job that survives its time limit and preemption."""


@slurm_group.command(
    "script",
    context_settings=TRAILING_COMMAND,
    short_help="Print the batch script (nothing is submitted).",
    epilog=f"""\b
Examples:
  costguard slurm script --gpus 1 --mem 64G --time 08:00:00 --requeue \\
      --checkpoint /scratch/$USER/run1 -- pixi run python train.py \\
      > job.sbatch
  sbatch job.sbatch
  costguard slurm script --gpus 0 --time 30 --signal-lead 60 \\
      --checkpoint ckpt/ -- python train.py --lr 3e-4
  costguard slurm script --nodes 2 --gpus-per-node 4 --time 12:00:00 \\
      --requeue --checkpoint /scratch/$USER/big -- train.py --lr 3e-4
  costguard slurm script --array 0-9 --time 2:00:00 --requeue \\
      --container img.sif --checkpoint /scratch/$USER/sweep -- python train.py

{HOW}""",
)
@job_options
def script_command(**options: Any) -> None:
    """Print a batch script that runs COMMAND (after --) preempt-safe under SLURM."""
    click.echo(batch_script(build_job(options)), nl=False)


@slurm_group.command(
    "submit",
    context_settings=TRAILING_COMMAND,
    short_help="Submit the batch script with sbatch.",
    epilog=f"""\b
Examples:
  costguard slurm submit --gpus 1 --mem 64G --time 08:00:00 --partition gpu \\
      --requeue --checkpoint /scratch/$USER/run1 -- pixi run python train.py
  squeue --me            # then watch it

{HOW}""",
)
@job_options
def submit_command(**options: Any) -> None:
    """Submit a batch script that runs COMMAND (after --) preempt-safe under SLURM.

    Prints the job id on standard output (for scripts), and how to follow it on
    standard error.
    """
    from costguard.slurm.sbatch import submit

    script = batch_script(build_job(options))  # every check before sbatch is looked for
    job_id = submit(script, os.environ)
    click.echo(job_id)
    click.echo(
        f"Submitted batch job {job_id}: `squeue -j {job_id}` follows it; its log is "
        f"slurm-{job_id}.out in the folder it was submitted from.",
        err=True,
    )
