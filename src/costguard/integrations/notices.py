"""The notices ``costguard run`` passes on, as one flag a trainer's callback reads.

``costguard run`` appends every notice (the cloud's metadata service, a relayed signal,
Ctrl-C) to the file in ``COSTGUARD_NOTICE_FILE`` and forwards SIGTERM and SIGUSR1 to the
script: a :class:`Watch` reads the file at each step boundary (one ``stat`` when nothing
is new) and turns those signals into
notices (instead of the default, dying mid-step), so the trainer saves at its next step
boundary. Without ``costguard run`` (no such variable) it does nothing at all.

Under ``costguard run`` a watch also tells it (two lines in its events file) that it is
installed and, when the script's code has ended (``atexit``), whether the script ever
looked at a notice and got one, how many signals its handler took, and whether each came
to it alone: a script that exits 0 after a notice it never saw, which no other handler got,
ended by itself, as it would have without the notice (its work done, see
:func:`costguard.checkpoint.supervisor.untouched`).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
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
        self._events = env.get(contract.ENV_EVENTS_FILE, "").strip() or None
        #: Whether the script was ever handed a notice (``pending`` returned one).
        self.seen = False
        #: Signals this process's handler took, and whether one came through another's.
        self.signals = 0
        self.shared_signal = False
        if path:
            self._listener = NoticeFileListener(path, self.board)
            self._undo = notice_signals.install(self.board, received=self._received)
            if self._events is not None:
                self._report({"event": contract.EVENT_WATCH})
                atexit.register(self._report_end)

    def pending(self) -> Notice | None:
        """The urgent notice that arrived, if one did."""
        if self._listener is not None:
            self._listener.poll()
        notice = self.board.urgent()
        if notice is not None:
            self.seen = True
        return notice

    def _received(self, alone: bool) -> None:
        self.signals += 1
        self.shared_signal = self.shared_signal or not alone

    def _report_end(self) -> None:
        """The script's code has ended: what the watch saw of notices (``costguard run``
        tells from it whether the script's own end had anything to do with them)."""
        self._report(
            {
                "event": contract.EVENT_WATCH_END,
                "seen": self.seen,
                "signals": self.signals,
                "alone": not self.shared_signal,
                "unix_ns": time.time_ns(),
            }
        )

    def _report(self, record: dict[str, Any]) -> None:
        """Append one line to ``costguard run``'s events file (one ``write`` on a file
        opened for appending: safe from a signal handler and beside other writers)."""
        assert self._events is not None
        line = json.dumps({**record, "pid": os.getpid()}) + "\n"
        try:
            fd = os.open(self._events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            logger.debug("costguard: could not report to %s: %s", self._events, exc)

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
