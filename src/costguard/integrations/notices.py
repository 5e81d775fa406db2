"""The notices ``costguard run`` passes on, as one flag a trainer's callback reads.

``costguard run`` appends every notice (the cloud's metadata service, a relayed signal,
Ctrl-C) to the file in ``COSTGUARD_NOTICE_FILE`` and forwards SIGTERM and SIGUSR1 to the
script: a :class:`Watch` reads the file at each step boundary (one ``stat`` when nothing
is new) and turns those signals into
notices (instead of the default, dying mid-step), so the trainer saves at its next step
boundary. Without ``costguard run`` (no such variable) it does nothing at all.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from costguard import contract
from costguard.checkpoint.distributed import (
    ENV_NOTICE_FILE,
    ENV_PREEMPTED_FILE,
    NoticeFileListener,
    mark_preempted,
)
from costguard.checkpoint.notices import Notice, NoticeBoard
from costguard.checkpoint.notices import signals as notice_signals
from costguard.logs import get_logger

#: The exit code after a save on a notice: run the same command to resume (EX_TEMPFAIL).
EXIT_PREEMPTED = contract.EXIT_PREEMPTED

logger = get_logger(__name__)


class Watch:
    """Notices for this process, when it runs under ``costguard run``."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.board = NoticeBoard()
        self._preempted_file = env.get(ENV_PREEMPTED_FILE) or None
        path = env.get(ENV_NOTICE_FILE)
        self.active = bool(path)
        self._listener: NoticeFileListener | None = None
        self._undo: Callable[[], None] = lambda: None
        if path:
            self._listener = NoticeFileListener(path, self.board)
            self._undo = notice_signals.install(self.board)

    def pending(self) -> Notice | None:
        """The urgent notice that arrived, if one did."""
        if self._listener is not None:
            self._listener.poll()
        return self.board.urgent()

    def exit_preempted(self, step: int, **record: Any) -> NoReturn:
        """The trainer has saved on a notice: tell ``costguard run``, exit 75."""
        notice = self.board.urgent()
        if self._preempted_file:
            mark_preempted(
                self._preempted_file,
                {"step": step, "notice": notice.describe() if notice else "", **record},
            )
        logger.warning(
            "costguard: saved step %d on a notice; exiting 75 (run the same command to resume)",
            step,
        )
        raise SystemExit(EXIT_PREEMPTED)

    def close(self) -> None:
        """Give the signals back their handlers."""
        self._undo()


_shared: Watch | None = None
_lock = threading.Lock()


def shared() -> Watch:
    """This process's one :class:`Watch` (started at the first call, in the main thread)."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = Watch()
        return _shared
