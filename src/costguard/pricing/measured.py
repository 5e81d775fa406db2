"""Hours from a measured run: a recorded pace (:mod:`costguard.checkpoint.pace`) times the
steps asked for, on the GPU it was measured on, or on another one with a stated speed-up.

``costguard estimate --from-run URL --steps N`` prices these hours as it prices typed ones;
every figure it used is in :func:`hours_from` (the JSON's ``query.hours_from``) and in the
assumption lines. Pure: values in, values out.

>>> from costguard.checkpoint.pace import Pace
>>> pace = Pace(190, 95.0, 200, 2.0, 1.0, device="NVIDIA A10G")
>>> m = measure(pace, run="s3://b/run1", steps=7200, measured_gpu="A10G", gpu="A10G")
>>> m.hours, m.scaled
(Decimal('1.0000'), False)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from costguard.checkpoint.pace import Pace, describe
from costguard.errors import InputError, UnknownNameError
from costguard.pricing.gpus import canonical_gpu

#: Fewer measured steps than this give no pace worth pricing.
MIN_STEPS = 10
HOURS_PLACES = Decimal("0.0001")


@dataclass(frozen=True)
class Measured:
    """The hours a run of ``steps`` steps takes on ``gpu``, from a measured pace."""

    hours: Decimal
    steps: int
    run: str
    pace: Pace
    gpu: str
    #: The GPU the pace was measured on (canonical), or the device's own name when the
    #: tables know no such GPU (``cpu`` off a GPU).
    measured_on: str
    #: How many times as fast ``gpu`` is as what was measured: stated by the user.
    speedup: Decimal | None = None
    #: ``--epochs``: the epochs asked for, ``steps`` being that many of the record's.
    epochs: Decimal | None = None

    @property
    def scaled(self) -> bool:
        """Whether the hours were scaled to another GPU than the one measured."""
        return self.speedup is not None


def gpu_of_device(device: str, known: Iterable[str] = ()) -> str | None:
    """The tables' GPU name for a CUDA device name, ``None`` when it is none of them.

    >>> [gpu_of_device(d) for d in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB",
    ...                             "Tesla T4", "NVIDIA A10G", "cpu")]
    ['H100', 'A100-80GB', 'T4', 'A10G', None]
    """
    key = re.sub(r"[\s_]+", "-", device.strip().lower())
    key = re.sub(r"^(nvidia|tesla)-", "", re.sub(r"^nvidia-tesla-", "", key))
    tokens = [t for t in key.split("-") if t]
    if not tokens:
        return None
    sizes = [t for t in tokens[1:] if re.fullmatch(r"\d+gb?", t)]
    known = list(known)
    for candidate in (*(f"{tokens[0]}-{size}" for size in sizes), key, tokens[0]):
        try:
            return canonical_gpu(candidate, known)
        except UnknownNameError:
            continue
    return None


def steps_for_epochs(pace: Pace, epochs: Decimal, run: str) -> int:
    """The steps of ``epochs`` epochs, by the steps per epoch the trainer recorded
    (rounded up: a started epoch's steps are run); :class:`InputError` when it recorded none.

    >>> from costguard.checkpoint.pace import Pace
    >>> steps_for_epochs(Pace(10, 5.0, 10, 2.0, 1.0, steps_per_epoch=1200), Decimal("2.5"), "r")
    3000
    """
    if pace.steps_per_epoch is None:
        msg = f"--from-run: {run} recorded no steps per epoch (its trainer did not say)"
        raise InputError(
            msg,
            hint="pass --steps N instead (N: the epochs x the optimizer steps in one epoch)",
        )
    return int((epochs * pace.steps_per_epoch).to_integral_value(rounding=ROUND_CEILING))


def measure(
    pace: Pace,
    *,
    run: str,
    steps: int,
    measured_gpu: str | None,
    gpu: str,
    speedup: Decimal | None = None,
    max_hours: Decimal = Decimal(24 * 366 * 10),
    epochs: Decimal | None = None,
) -> Measured:
    """The hours for ``steps`` steps on ``gpu``; :class:`InputError` when the pace is too
    thin, or ``gpu`` is not what was measured and no speed-up says how it compares."""
    if pace.steps_measured < MIN_STEPS:
        msg = (
            f"{run} measured {pace.steps_measured} training step(s); at least {MIN_STEPS} "
            "are needed for a pace"
        )
        raise InputError(
            msg,
            hint=f"let it run longer, or measure {MIN_STEPS * 10} steps first: "
            "costguard pilot --steps 100 -- python train.py",
        )
    measured_on = measured_gpu or pace.device
    if speedup is None and gpu != measured_gpu:
        msg = f"{run} was measured on {measured_on}, not on {gpu}"
        raise InputError(
            msg,
            hint=f"pass --speedup F ({gpu} runs the steps F times as fast; a guess you state), "
            f"or measure on {gpu}",
        )
    seconds = Decimal(str(pace.seconds_measured)) / pace.steps_measured
    hours = Decimal(steps) * seconds / 3600 / (speedup or 1)
    hours = max(hours.quantize(HOURS_PLACES, rounding=ROUND_CEILING), HOURS_PLACES)
    if hours > max_hours:
        msg = f"{steps} steps at the measured pace take {hours:.0f} h, more than ten years"
        raise InputError(msg, hint="check --epochs" if epochs is not None else "check --steps")
    return Measured(hours, steps, run, pace, gpu, measured_on, speedup, epochs)


def hours_from(m: Measured) -> dict[str, Any]:
    """What the hours were made of, for the JSON's ``query.hours_from``."""
    pace = m.pace
    return {
        "run": m.run,
        "steps": m.steps,
        "epochs": m.epochs,
        "steps_per_epoch": pace.steps_per_epoch,
        "measured_on": m.measured_on,
        "device": pace.device,
        "host": pace.host,
        "ranks": pace.ranks,
        "steps_measured": pace.steps_measured,
        "seconds_measured": round(pace.seconds_measured, 3),
        "seconds_per_step": round(pace.seconds_per_step, 6),
        "wall_seconds_per_step": round(pace.wall_seconds_per_step, 6),
        "warmup_steps_left_out": pace.warmup_steps,
        "slow_steps_left_out": pace.outlier_steps,
        "saves": pace.saves,
        "seconds_inside_step_left_out": round(pace.overhead_s, 3),
        "evaluations": pace.evaluations,
        "evaluation_s_left_out": round(pace.evaluation_s, 3),
        "first_save_setup_s": round(pace.setup_s, 3),
        "pilot": pace.pilot,
        "recorded_unix": pace.updated_unix,
        "scaled": m.scaled,
        "speedup": m.speedup,
        "gpu": m.gpu,
    }


def assumption_lines(m: Measured) -> list[str]:
    """The measurement as assumptions: what was measured, on what, what was left out."""
    pace = m.pace
    steps = f"{m.steps} steps"
    if m.epochs is not None:
        unit = "epoch" if m.epochs == 1 else "epochs"
        steps += f" ({m.epochs} {unit} x {pace.steps_per_epoch} steps)"
    lines = [
        f"hours measured, not guessed: {steps} x {pace.seconds_per_step:.4f} s/step "
        f"= {m.hours} h, from {m.run} ({describe(pace)})",
        "the pace is training alone: warm-up, evaluation and the time inside step() (saves) "
        "are left out, and "
        "so are start-up and data staging before the first step",
    ]
    if m.scaled:
        lines.append(
            f"SCALED: measured on {m.measured_on}, priced on {m.gpu} at {m.speedup}x its "
            "speed (--speedup: a figure you stated, not measured)"
        )
    return lines
