"""Signals as notices: SIGTERM (Kubernetes, a VM shutting down, SLURM preemption) and
SIGUSR1 (SLURM's ``--signal=B:USR1@90`` before the time limit).

The handler only appends to the :class:`~costguard.checkpoint.notices.NoticeBoard` (no
lock, no I/O), which is all a signal handler can safely do; the training loop reacts at
its next step boundary.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from costguard.checkpoint.notices import Notice, NoticeBoard
from costguard.logs import get_logger

logger = get_logger(__name__)

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def install(
    board: NoticeBoard,
    signals: Iterable[signal.Signals] = DEFAULT_SIGNALS,
    *,
    received: Callable[[bool], None] | None = None,
) -> Callable[[], None]:
    """Post a notice on ``board`` when one of ``signals`` arrives; returns an undo function.

    ``received(alone)`` is called at each one too: ``alone`` says this handler was the
    process's handler for it, not one another handler called in turn (Lightning's chains
    the one it found), so no other code learnt of the signal.

    Outside the main thread (where Python cannot set handlers) nothing is installed and a
    warning is logged.

    >>> board = NoticeBoard()
    >>> undo = install(board, [signal.SIGUSR2])
    >>> signal.raise_signal(signal.SIGUSR2)
    >>> board.urgent().detail
    'SIGUSR2'
    >>> undo()
    """
    if threading.current_thread() is not threading.main_thread():
        logger.warning("costguard: not in the main thread; signals will not trigger a save")
        return lambda: None
    previous: dict[signal.Signals, Any] = {}

    def handler(signum: int, frame: FrameType | None) -> None:
        board.post(Notice("signal", "signal", None, signal.Signals(signum).name))
        if received is not None:
            received(signal.getsignal(signum) is handler)

    for sig in signals:
        previous[sig] = signal.signal(sig, handler)

    def undo() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return undo
