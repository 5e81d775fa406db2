"""Backoff with full jitter, bounded attempts, Retry-After honoured."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from costguard.retry import (
    RetryPolicy,
    Transient,
    call_with_retry,
    parse_retry_after,
)

policies = st.builds(
    RetryPolicy,
    attempts=st.integers(1, 10),
    base_delay_s=st.floats(0.001, 5),
    max_delay_s=st.floats(0.001, 60),
    max_retry_after_s=st.floats(0, 600),
)


@given(policies, st.integers(1, 30), st.floats(0, 1))
def test_backoff_is_bounded_and_grows(policy: RetryPolicy, retry: int, rand: float) -> None:
    delay = policy.delay_s(retry, None, rand)
    assert 0 <= delay <= min(policy.max_delay_s, policy.base_delay_s * 2 ** (retry - 1))
    assert policy.delay_s(retry, None, 1.0) <= policy.delay_s(retry + 1, None, 1.0)


@given(policies, st.floats(-10, 10_000))
def test_retry_after_is_honoured_up_to_the_limit(policy: RetryPolicy, retry_after: float) -> None:
    assert policy.delay_s(1, retry_after, 0.5) == min(max(retry_after, 0), policy.max_retry_after_s)


def flaky(failures: int, exc: Exception) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= failures:
            raise exc
        return "ok"

    return calls, call


def test_transient_errors_are_retried_with_the_policys_waits() -> None:
    calls, call = flaky(2, TimeoutError("slow"))
    waits: list[float] = []
    policy = RetryPolicy(attempts=3, base_delay_s=1, max_delay_s=10)
    result = call_with_retry(
        call, lambda e: Transient("slow"), policy, sleep=waits.append, rand=lambda: 1.0
    )
    assert result == "ok"
    assert len(calls) == 3
    assert waits == [1.0, 2.0]


def test_attempts_are_bounded_and_the_last_error_raised() -> None:
    calls, call = flaky(99, TimeoutError("slow"))
    with pytest.raises(TimeoutError):
        call_with_retry(
            call, lambda e: Transient("slow", 0), RetryPolicy(attempts=4), sleep=lambda s: None
        )
    assert len(calls) == 4


def test_other_errors_are_not_retried() -> None:
    calls, call = flaky(1, ValueError("bad request"))
    with pytest.raises(ValueError, match="bad request"):
        call_with_retry(call, lambda e: None, RetryPolicy(), sleep=lambda s: None)
    assert len(calls) == 1


def test_retry_after_forms() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after("Tue, 01 Dec 2026 00:01:00 GMT", now) == 60.0
    assert parse_retry_after("Mon, 30 Nov 2026 00:00:00 GMT", now) == 0.0  # in the past
    for junk in (None, "", "soon", "nan", "inf"):
        assert parse_retry_after(junk, now) is None
