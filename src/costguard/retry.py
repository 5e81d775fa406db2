"""Retry with exponential backoff and full jitter, honouring ``Retry-After``: one rule for
every call costguard makes to a store or an API.

Each caller says which of its errors are worth another try (``classify`` returns a
:class:`Transient`, with the server's ``Retry-After`` when it sent one, or ``None``), and
may bound the waiting (``may_wait``: a preemption deadline); this module decides how long
to wait and gives up after a bounded number of attempts, raising the last error as it was.
The delay arithmetic is pure; :func:`call_with_retry` and :func:`call_with_retry_async`
sleep.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TypeVar

_T = TypeVar("_T")
#: Which errors are worth another try: a :class:`Transient`, or ``None`` for "raise it".
Classify = Callable[[Exception], "Transient | None"]
#: Told of each retry before its wait: the error, the retry's number (1 is the first),
#: how many retries there can be in all, and the wait in seconds.
OnRetry = Callable[[Exception, int, int, float], None]


@dataclass(frozen=True, slots=True)
class Transient:
    """An error worth another try, and how long the server asked us to wait (seconds)."""

    reason: str
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently to retry one call.

    Without ``Retry-After`` the n-th retry waits a random time up to
    ``min(max_delay_s, base_delay_s * 2**(n-1))`` ("full jitter": many ranks, jobs or
    clients throttled together do not come back together). A ``Retry-After`` is honoured
    up to ``max_retry_after_s``.

    >>> policy = RetryPolicy(attempts=4, base_delay_s=1, max_delay_s=3)
    >>> [policy.delay_s(n, None, rand=1.0) for n in (1, 2, 3)]
    [1.0, 2.0, 3.0]
    >>> policy.delay_s(1, retry_after_s=7.5, rand=0.5)
    7.5
    """

    attempts: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    max_retry_after_s: float = 120.0

    def delay_s(self, retry: int, retry_after_s: float | None, rand: float) -> float:
        """Seconds to wait before retry number ``retry`` (1 is the first); ``rand`` in [0, 1]."""
        if retry_after_s is not None:
            return min(max(retry_after_s, 0.0), self.max_retry_after_s)
        return rand * min(self.max_delay_s, self.base_delay_s * 2.0 ** (retry - 1))


#: For calls to price and cloud APIs, which throttle for longer than a store does.
API_RETRY = RetryPolicy(base_delay_s=1.0, max_delay_s=30.0)


def _always(_delay_s: float) -> bool:
    return True


def call_with_retry(
    call: Callable[[], _T],
    classify: Classify,
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], object] = time.sleep,
    rand: Callable[[], float] = random.random,
    may_wait: Callable[[float], bool] = _always,
    on_retry: OnRetry | None = None,
) -> _T:
    """Call ``call``; retry while ``classify`` calls its error transient and ``may_wait``
    allows the wait, at most ``policy.attempts`` times in all. The last error is raised
    as it was.

    >>> answers = iter([ValueError("busy"), 42])
    >>> def flaky():
    ...     answer = next(answers)
    ...     if isinstance(answer, Exception):
    ...         raise answer
    ...     return answer
    >>> call_with_retry(flaky, lambda exc: Transient(str(exc), 0.0), RetryPolicy())
    42
    """
    for attempt in range(1, policy.attempts + 1):
        try:
            return call()
        except Exception as exc:
            delay = _next_delay(exc, attempt, classify, policy, rand, may_wait, on_retry)
            if delay is None:
                raise
        sleep(delay)
    msg = "RetryPolicy.attempts must be at least 1"
    raise ValueError(msg)


async def call_with_retry_async(
    call: Callable[[], Awaitable[_T]],
    classify: Classify,
    policy: RetryPolicy,
    *,
    rand: Callable[[], float] = random.random,
    may_wait: Callable[[float], bool] = _always,
    on_retry: OnRetry | None = None,
) -> _T:
    """:func:`call_with_retry` for a coroutine: the waits are ``asyncio.sleep``."""
    for attempt in range(1, policy.attempts + 1):
        try:
            return await call()
        except Exception as exc:
            delay = _next_delay(exc, attempt, classify, policy, rand, may_wait, on_retry)
            if delay is None:
                raise
        await asyncio.sleep(delay)
    msg = "RetryPolicy.attempts must be at least 1"
    raise ValueError(msg)


def _next_delay(
    exc: Exception,
    attempt: int,
    classify: Classify,
    policy: RetryPolicy,
    rand: Callable[[], float],
    may_wait: Callable[[float], bool],
    on_retry: OnRetry | None,
) -> float | None:
    """The wait before the next attempt after ``exc``, or ``None``: raise it."""
    transient = classify(exc)
    if transient is None or attempt >= policy.attempts:
        return None
    delay = policy.delay_s(attempt, transient.retry_after_s, rand())
    if not may_wait(delay):
        return None
    if on_retry is not None:
        on_retry(exc, attempt, policy.attempts - 1, delay)
    return delay


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """A ``Retry-After`` header (seconds, or an HTTP date) as seconds from ``now``.

    >>> parse_retry_after("3")
    3.0
    >>> parse_retry_after("Tue, 01 Dec 2026 00:00:10 GMT", datetime(2026, 12, 1, tzinfo=UTC))
    10.0
    >>> parse_retry_after("soon") is None
    True
    """
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max((moment - (now or datetime.now(UTC))).total_seconds(), 0.0)
