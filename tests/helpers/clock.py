"""A clock that the code's own waits advance: a test of a bounded wait (a backoff, a
deadline) takes no real seconds, and its outcome does not depend on the machine's load."""

from __future__ import annotations


class Clock:
    """Pass it as ``clock=`` and its :meth:`sleep` as ``sleep=``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
