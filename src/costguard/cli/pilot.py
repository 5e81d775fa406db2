"""``costguard pilot``: run a script's first steps here, measure them, price the whole run.

The script runs under ``costguard run`` (its Checkpointer times the steps and records the
pace in the store) and is stopped after ``--steps``; then the answer of ``costguard
estimate --from-run`` is printed for ``--total-steps``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from costguard.cli.estimate import number, speedup_option, whole_number
from costguard.cli.options import TRAILING_COMMAND
from costguard.cli.params import Name, StoreUrl, WholeNumber, table_or_json

if TYPE_CHECKING:
    from costguard.settings import Settings

EXAMPLES = """
\b
Examples:
  costguard pilot --steps 200 --total-steps 20000 -- python train.py
  costguard pilot --steps 200 --epochs 3 -- python hf_train.py
  costguard pilot --steps 200 --gpu a10g --speedup 1 --format json \\
      -- python train.py          # measured off an A10G: the speed-up

\b
In train.py the loop calls Checkpointer.from_env(...).step(step, ...) after
each step (as under costguard run), or a Hugging Face or Lightning trainer
has costguard's PreemptionCallback; it is stopped after --steps steps.
"""


@click.command(
    "pilot",
    context_settings=TRAILING_COMMAND,
    epilog=EXAMPLES,
    short_help="Time a script's first steps here and price the whole run from them.",
)
@click.option(
    "--steps",
    "pilot_steps",
    type=WholeNumber(10, 10**7),
    required=True,
    help="Run this many steps of the script, then stop it.",
)
@click.option(
    "--total-steps",
    type=whole_number("steps"),
    help="The whole run's steps to price [default: the script's Checkpointer(total_steps=N)].",
)
@click.option(
    "--epochs",
    type=number("epochs"),
    help="Or the whole run's epochs, at the steps per epoch the script's trainer recorded "
    "(its Hugging Face or Lightning PreemptionCallback).",
)
@click.option(
    "--checkpoint",
    "url",
    type=StoreUrl(),
    default="costguard-pilot/",
    show_default=True,
    help="Where the pilot's pace is recorded (estimate --from-run reads it again later).",
)
@click.option("--gpu", type=Name(), help="Price this GPU [default: the one measured on].")
@speedup_option
@click.option(
    "--provider", "providers", type=Name(), multiple=True, help="aws, gcp or azure (repeatable)."
)
@click.option("--region", "regions", type=Name(), multiple=True, help="Region (repeatable).")
@click.option(
    "--spot/--on-demand", "spot", default=None, help="Only spot, or only on-demand [both]."
)
@table_or_json("table for people, json for scripts.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@click.pass_obj
def pilot_command(settings: Settings, /, command: Sequence[str], **options: Any) -> None:
    """Run COMMAND (after --) for --steps steps, then price --total-steps at that pace.

    The pace is the training's alone: the first steps (warm-up), slow ones (evaluation)
    and save stalls are left out, and the answer says so. Prices come from the tables,
    as for costguard estimate.
    """
    from costguard.checkpoint.pace import PACE_FILE, host_name, not_own_pilot, read_pace
    from costguard.checkpoint.supervisor import supervise
    from costguard.cli.estimate import show_quote
    from costguard.errors import CostguardError, InputError
    from costguard.pricing.question import Question, check_names
    from costguard.pricing.tables import load_tables
    from costguard.secrets import redact
    from costguard.spot.prepare import normal_url, open_store
    from costguard.text import visible

    def say(line: str) -> None:
        click.echo(f"costguard pilot: {visible(redact(line))}", err=True)

    if options["total_steps"] is not None and options["epochs"] is not None:
        msg = "--total-steps and --epochs both give the run's length"
        raise InputError(msg, hint="keep one of them")
    question = Question(
        from_run=options["url"],
        steps=options["total_steps"],
        epochs=options["epochs"],
        gpus=(options["gpu"],) if options["gpu"] else (),
        speedup=options["speedup"],
        providers=options["providers"],
        regions=options["regions"],
        spot=options["spot"],
    )
    # Its names checked before the script runs: a GPU or region the tables do not know
    # would otherwise be refused only after the whole pilot.
    check_names(load_tables(settings.pricing_dir, settings.pricing_cache_dir), question)
    if not nvidia_gpu_visible(os.environ) and None in (options["gpu"], options["speedup"]):
        # Refused before the work: the pace would be the CPU's, which no table prices.
        msg = "this machine shows no NVIDIA GPU: the pilot would be timed on its CPU"
        raise InputError(
            msg,
            hint="name the GPU to price and how many times as fast it runs the steps (a "
            "figure you state): --gpu a10g --speedup F; or time the pilot on the GPU itself: "
            "`costguard launch --gpu a10g --pilot-steps 200 ...`",
        )

    since = time.time()
    code = supervise(
        command,
        url=options["url"],
        every_steps=None,
        every_minutes=None,
        keep=1,
        cloud="none",
        signal_mode="auto",
        quiet=True,
        say=say,
        pilot_steps=options["pilot_steps"],
    )
    if code != 0:
        msg = f"the script exited with {code} before its pilot steps were measured"
        raise CostguardError(msg, hint="run it once with costguard run to see why")
    store = open_store(normal_url(options["url"]))
    pace = read_pace(store)
    hint = (
        "after each training step: ckpt.step(step, model=model, ...), with ckpt = "
        "Checkpointer.from_env(...); or give a Hugging Face or Lightning trainer "
        "costguard's PreemptionCallback"
    )
    if pace is None:
        msg = "the script recorded no pace: its loop never called Checkpointer.step()"
        raise InputError(msg, hint=hint)
    problem = not_own_pilot(
        pace,
        since_unix=since,
        now_unix=time.time(),
        host=host_name(),
        env=os.environ,
    )
    if problem is not None:
        msg = (
            f"{PACE_FILE} in {store.url} is not this pilot's, so it is not priced: {problem}; "
            "the script recorded no pace of its own"
        )
        raise InputError(msg, hint=hint)
    # Priced at the record just checked: the store is not read again, so a record written
    # there since (by anyone who can write the bucket) is never what the quote shows.
    show_quote(settings, question, options["output_format"].lower(), pace=pace)


def nvidia_gpu_visible(environ: Mapping[str, str], dev: Path = Path("/dev")) -> bool:
    """Whether a script started here sees an NVIDIA GPU: a ``/dev/nvidiaN`` device, and
    CUDA_VISIBLE_DEVICES not set to none (empty or -1).

    >>> nvidia_gpu_visible({}, Path("/nonexistent"))
    False
    >>> nvidia_gpu_visible({"CUDA_VISIBLE_DEVICES": ""})
    False
    """
    if environ.get("CUDA_VISIBLE_DEVICES", "0").strip() in ("", "-1"):
        return False
    return any(re.fullmatch(r"nvidia\d+", path.name) for path in dev.glob("nvidia*"))
