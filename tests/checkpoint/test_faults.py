"""Faults: an HTTP proxy in front of moto S3 (:mod:`tests.helpers.faults`, the
``flaky_s3`` fixture) answers some requests with 503 or stalls them. Saves retry and
succeed, or are reported; training goes on; nothing earlier is lost."""

from __future__ import annotations

import pytest
import torch

from costguard.checkpoint import Checkpointer, RetryPolicy
from tests.helpers.faults import Faults, train

FAST = RetryPolicy(attempts=4, base_delay_s=0.05, max_delay_s=0.2)


@pytest.mark.slow
def test_throttled_and_stalled_puts_are_retried(flaky_s3: Faults) -> None:
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpointer(
        "s3://flaky/run",
        every_steps=1,
        retry=FAST,
        storage_options={"config_kwargs": {"read_timeout": 1, "retries": {"max_attempts": 1}}},
    )
    flaky_s3.fail_puts, flaky_s3.stall_puts, flaky_s3.stall_s = 3, 1, 2.0
    for step in range(3):
        train(model, opt)
        ckpt.step(step, model=model, optimizer=opt)
    ckpt.close()
    assert flaky_s3.failed == 3
    assert flaky_s3.stalled == 1
    assert [r.ok for r in ckpt.results] == [True, True, True]
    fresh = torch.nn.Linear(6, 3)
    assert Checkpointer("s3://flaky/run").restore(model=fresh) == 3
    assert torch.equal(fresh.weight, model.weight)
