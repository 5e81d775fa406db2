"""Randomized preemption trials (:mod:`tests.integrations.preemption_trials`): fresh user
scripts preempted at random moments, the output folder deleted before each attempt, every
attempt resuming from the store's newest checkpoint, the final weights bit for bit those
of an uninterrupted run.

On a local store, the Accelerate script with a registered EMA, preempted until it ends. On
S3 (moto over HTTP), each trainer (Hugging Face Trainer with gradient accumulation and
evaluation, Accelerate, Lightning with ``ModelCheckpoint``), one notice at a random moment:
a trial of all three preempted until done takes minutes each on two cores (measured:
158-220 s), one notice about a minute. The moments are drawn from a seed made per test run
(``COSTGUARD_TRIAL_SEED`` sets it), named in every failure. Longer trials run from the
command line (the module's docstring).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.helpers.stores import make_s3_bucket
from tests.helpers.training import SharedRuns, child_env
from tests.integrations.preemption_trials import reference, same_weights, trial

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SEED = int(os.environ.get("COSTGUARD_TRIAL_SEED") or random.SystemRandom().randrange(2**32))


def expected(shared_runs: SharedRuns, trainer: str, env: dict[str, str]) -> Path:
    """The trainer script's final weights, uninterrupted (made once per test run)."""

    def make(folder: Path) -> None:
        reference(trainer, folder, env)

    return shared_runs.folder(("preemption-trial", trainer), make) / "reference.pt"


def trainer_env(tmp_path: Path) -> dict[str, str]:
    return child_env(
        tmp_path, COSTGUARD_CLOUD="none", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error"
    )


def test_an_accelerate_run_preempted_at_random_moments_ends_bitwise(
    tmp_path: Path, shared_runs: SharedRuns
) -> None:
    env = trainer_env(tmp_path)
    final = expected(shared_runs, "accelerate", env)
    record = trial("accelerate", str(tmp_path / "store"), tmp_path, env, random.Random(SEED))
    record["seed"] = SEED  # COSTGUARD_TRIAL_SEED=<seed> draws the same moments
    assert record["problems"] == [], record
    assert record["codes"].count(75) >= 1, record  # preempted at least once
    assert same_weights(tmp_path / "final.pt", final), record


@pytest.mark.parametrize("trainer", ["hf", "accelerate", "lightning"])
def test_a_run_on_s3_preempted_at_a_random_moment_ends_bitwise(
    trainer: str, tmp_path: Path, shared_runs: SharedRuns, aws_env: str
) -> None:
    make_s3_bucket(aws_env, "trials")
    env = trainer_env(tmp_path)
    final = expected(shared_runs, trainer, env)
    env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    # The notice lands within the script's first 2 s of training: before its end (each
    # script trains 3 s or more), so the attempt is preempted, never finished.
    rng = random.Random(f"{SEED}-{trainer}")
    record = trial(trainer, "s3://trials/run", tmp_path, env, rng, most_notices=1, most_delay_s=2.0)
    record["seed"] = SEED
    assert record["problems"] == [], record
    assert record["codes"] == [75, 0], record
    assert same_weights(tmp_path / "final.pt", final), record
