"""One randomized preemption trial (:mod:`tests.integrations.preemption_trials`) of a fresh
Accelerate script with a registered EMA, on a local store: notices at
random moments, the output folder deleted before each attempt, every attempt resuming from
the store's newest checkpoint, the final weights and EMA bit for bit those of an
uninterrupted run. The Hugging Face and Lightning trials, and trials on S3 (a URL), run
the same way from the command line (minutes each on two cores)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.helpers.training import child_env
from tests.integrations.preemption_trials import reference, same_weights, trial

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_an_accelerate_run_preempted_at_random_moments_ends_bitwise(tmp_path: Path) -> None:
    env = child_env(tmp_path, COSTGUARD_CLOUD="none")
    url = str(tmp_path / "store")
    expected = reference("accelerate", tmp_path, env)
    record = trial("accelerate", url, tmp_path, env, random.Random(7))
    assert record["problems"] == [], record
    assert record["codes"].count(75) >= 1, record  # preempted at least once
    assert same_weights(tmp_path / "final.pt", expected), record
