"""The one way a test waits for something another thread or process does: poll a
condition, bounded, and fail naming what never happened.

    notice = wait_for(board.urgent, "a notice on the board", timeout_s=10)

The condition's first truthy value is returned. ``alive``, called before each poll, may
raise to end the wait early (a process that ended while it was waited for), and
``ignoring`` names exceptions that mean "not yet" (a service still starting).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Long enough for a busy two-core CI machine; a test that passes never waits it out.
TIMEOUT_S = 60.0
POLL_S = 0.05


class WaitTimeoutError(AssertionError):
    """What was waited for did not happen within the wait's bound."""


def wait_for(
    condition: Callable[[], T | None],
    what: str,
    *,
    timeout_s: float = TIMEOUT_S,
    poll_s: float = POLL_S,
    alive: Callable[[], object] | None = None,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``condition`` every ``poll_s`` until it gives a truthy value (returned); fail
    with :class:`WaitTimeoutError` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if alive is not None:
            alive()
        try:
            value = condition()
            if value:
                return value
        except ignoring:
            pass  # not yet
        if time.monotonic() >= deadline:
            msg = f"waited {timeout_s:g} s for {what}; it did not happen"
            raise WaitTimeoutError(msg)
        time.sleep(poll_s)
