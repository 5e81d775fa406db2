"""Option groups that several commands share: one declaration, so one range and one default.

* :func:`cadence_options`: ``--every-steps``/``--every-minutes`` (``launch``, ``run``,
  ``slurm``): how often a checkpoint is saved.
* :func:`idle_options`: ``--idle-minutes`` and the busy thresholds (``reap``, ``agent``):
  the same idle rule, judged from the cloud's metrics or on the instance.

* :data:`TRAILING_COMMAND`: the parsing of a command that runs a COMMAND of its own
  (``run``, ``launch``, ``pilot``, ``slurm script|submit``).

Each command keeps its own help sentences; the types, ranges and defaults live here.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import click

from costguard.cli.params import DecimalRange, F, FiniteFloat, WholeNumber, option_group
from costguard.reaper.policy import MAX_IDLE_MINUTES

_PERCENT = DecimalRange(0, maximum=100)

#: ``context_settings`` of a command ending in a COMMAND to run: the options stop at ``--``
#: or at the first word that is not an option (``costguard run python train.py --lr 3``),
#: and an unknown option before that is click's "No such option ... Did you mean", never
#: the first word of the command.
TRAILING_COMMAND: dict[str, bool] = {"allow_interspersed_args": False}


def cadence_options(verb: str) -> Callable[[F], F]:
    """``--every-steps N`` and ``--every-minutes T``; ``verb`` starts their help
    (``"Save"``: "Save every N steps.")."""
    return option_group(
        click.option("--every-steps", type=WholeNumber(min=1), help=f"{verb} every N steps."),
        click.option(
            "--every-minutes",
            type=FiniteFloat(min=0, min_open=True),
            help=f"{verb} every T minutes.",
        ),
    )


def idle_options(*, idle: str, gpu: str, cpu: str, network: str) -> Callable[[F], F]:
    """``--idle-minutes`` (60), ``--gpu-threshold`` and ``--cpu-threshold`` (5 %) and
    ``--network-threshold-mbps`` (1), each with the help sentence given."""
    return option_group(
        click.option(
            "--idle-minutes",
            type=WholeNumber(1, MAX_IDLE_MINUTES),
            default=60,
            show_default=True,
            help=idle,
        ),
        click.option(
            "--gpu-threshold", type=_PERCENT, default=Decimal(5), show_default=True, help=gpu
        ),
        click.option(
            "--cpu-threshold", type=_PERCENT, default=Decimal(5), show_default=True, help=cpu
        ),
        click.option(
            "--network-threshold-mbps",
            type=DecimalRange(0, maximum=1_000_000),
            default=Decimal(1),
            show_default=True,
            help=network,
        ),
    )
