"""``costguard run``: run a training script with checkpointing and preemption notices.

The command parses; :func:`costguard.checkpoint.supervisor.supervise` runs the script.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from costguard.cli import render
from costguard.cli.options import TRAILING_COMMAND, cadence_options
from costguard.cli.params import StoreUrl, Text, WholeNumber


@click.command(
    "run",
    context_settings=TRAILING_COMMAND,
    epilog="""\b
Examples:
  costguard run --checkpoint s3://my-bucket/run1 --every-steps 500 \\
      -- python train.py
  costguard run --checkpoint checkpoints/ --every-minutes 10 \\
      -- python train.py --lr 3e-4

\b
In train.py:
  ckpt = Checkpointer.from_env(default="checkpoints/")
  start = ckpt.restore(model=model, optimizer=opt)
  for step in range(start, total_steps):
      ...
      ckpt.step(step, model=model, optimizer=opt)

Exit code: the script's; 75 means it saved on a preemption notice and can be resumed
by running the same command again.

\b
Hugging Face Trainer, Accelerate or Lightning, with their own checkpoints:
  costguard run --checkpoint s3://my-bucket/run1 --sync-dir out/ \\
      -- python train.py

\b
Several processes (a Checkpointer per rank; FSDP2: each writes its shard):
  costguard run --checkpoint s3://my-bucket/run1 \\
      -- torchrun --nproc-per-node 2 train.py""",
    short_help="Run a training script with checkpointing and preemption notices.",
)
@click.option(
    "--checkpoint",
    "url",
    type=StoreUrl(),
    default="checkpoints/",
    show_default=True,
    help="Where checkpoints go: a folder, s3://bucket/prefix, gs://..., az://container/...",
)
@cadence_options("Save")
@click.option(
    "--keep",
    type=WholeNumber(min=1),
    default=3,
    show_default=True,
    help="Keep the newest N checkpoints (in the store too).",
)
@click.option(
    "--cloud",
    type=click.Choice(["auto", "aws", "gcp", "azure", "none"]),
    envvar="COSTGUARD_CLOUD",
    default="auto",
    show_default=True,
    help="Whose preemption notices to watch; auto reads the machine's vendor (no network).",
)
@click.option(
    "--signals",
    "signal_mode",
    type=click.Choice(["auto", "forward", "relay"]),
    default="auto",
    show_default=True,
    help="SIGTERM/SIGUSR1: forward them to the command, or relay them as notices to every "
    "process (and forward a second one); auto relays for torchrun.",
)
@click.option(
    "--sync-dir",
    metavar="DIR",
    type=Text(),
    default=None,
    help="Keep the trainer's own checkpoints written here (Hugging Face checkpoint-N/, "
    "Accelerate save_state folders, Lightning .ckpt) in the store, and put the newest back "
    "here before the script starts.",
)
@click.option(
    "--start-fresh",
    is_flag=True,
    help="Start from step 0 when checkpoints exist but none can be used (each corrupt or "
    "unreadable); without it the script's restore refuses, and this exits 2.",
)
@click.option(
    "--total-steps",
    type=WholeNumber(min=1),
    help="The whole run's steps (or Checkpointer(total_steps=N)): the recorded pace then "
    "gives its finish time and projected cost (costguard jobs status, estimate --from-run); "
    "with --sync-dir, a script that a notice ends once the store's newest checkpoint is at "
    "that step has finished (exit 0), for trainers that do not say where they end "
    "(an Accelerate loop).",
)
@click.option(
    "--pilot-steps",
    type=WholeNumber(min=1),
    help="Stop the script after this many steps, once their pace is recorded (exit 0): "
    "a pilot, as costguard pilot and launch --pilot-steps run it.",
)
@click.option(
    "-q", "--quiet", is_flag=True, help="No line per save; only the start and the exit summary."
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.pass_context
def run_command(ctx: click.Context, /, command: Sequence[str], **options: Any) -> None:
    """Run COMMAND (after --) with checkpointing to URL and preemption notices.

    Before the script starts, the checkpoint location is checked (write, read back,
    delete a probe object), so a wrong URL or a missing bucket fails at once.
    """
    from costguard.checkpoint.completion import sync_dir_path
    from costguard.checkpoint.supervisor import supervise
    from costguard.cli import console_script
    from costguard.secrets import redact

    if options["sync_dir"] is not None:  # the rules of every --sync-dir, before the store
        options["sync_dir"] = sync_dir_path(options["sync_dir"], here=True)

    def say(line: str) -> None:  # wrapped at a terminal; one line to a log or a pipe
        render.print_prose(redact(line), first="costguard: ", indent="  ", err=True)

    # The options are its keywords, by name; the console script ends once it returns.
    code = supervise(command, say=say, ending=console_script(), **options)
    ctx.exit(code)
