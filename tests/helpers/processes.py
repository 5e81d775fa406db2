"""Ports and processes for the emulators and servers the tests start."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from costguard.spot.launcher.local import rendezvous_port
from tests.helpers.waiting import wait_for


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now (where nothing should)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_port() -> int:
    """A free loopback port for a server that binds it later (an emulator, slurmd): drawn
    below the kernel's ephemeral range, as a gang's rendezvous is, so no other program's
    bind to port 0 or outgoing connection takes it in between."""
    return rendezvous_port()


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """Stop an emulator: SIGTERM, then SIGKILL if it has not exited after ``grace_s``.

    Azurite (node) sometimes takes longer than that to close its servers on a busy machine;
    a slow goodbye must not fail the run.
    """
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first), from the kernel's own lists; a script
    `costguard run` starts in a process group of its own is one of them."""
    found: list[int] = []
    stack = [pid]
    while stack and len(found) < 1000:
        parent = stack.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            found.extend(children)
            stack.extend(children)
    return found


def kill_tree(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL ``proc`` and every process below it (none outlives a failed test to hold its
    pipes or a CPU for the rest of the run)."""
    for pid in [*descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def signal_side_thread(pid: int, sig: int, timeout_s: float = 30.0) -> int:
    """Send ``sig`` to a thread of process ``pid`` other than its main one (``tgkill``),
    once the main thread has been asleep (blocked in a call) for a while; the thread's id.

    The kernel may hand a signal sent to a process to any of its threads that does not
    block it, and a Python program runs its handlers in its main thread only, between
    bytecodes. This makes the choice that a busy machine makes now and then. Waits
    (bounded) for the process to have such a thread.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    asleep = [0]

    def a_side_thread_while_the_main_one_waits() -> int | None:
        threads = (int(task.name) for task in Path(f"/proc/{pid}/task").iterdir())
        side = sorted(tid for tid in threads if tid != pid)
        # /proc/PID/stat: "pid (name) state ...": S is asleep in the kernel.
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        asleep[0] = asleep[0] + 1 if state == "S" else 0
        return side[0] if side and asleep[0] >= 5 else None

    what = f"process {pid} to have a side thread while its main thread waits"
    tid = wait_for(a_side_thread_while_the_main_one_waits, what, timeout_s=timeout_s)
    if libc.tgkill(pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {tid}, {sig})")
    return tid


class StreamLines:
    """The lines of a child's text stream (a pipe) as they come, read on a thread, so
    that a test can wait for one (:meth:`wait_until`) without blocking on the pipe."""

    def __init__(self, stream: Iterable[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Iterable[str]) -> None:
        for line in stream:
            self.lines.append(line)

    def wait_until(self, text: str, timeout_s: float = 60.0) -> str:
        """The first line that holds ``text``, once it has come."""

        def line() -> str | None:
            return next((line for line in self.lines if text in line), None)

        return wait_for(line, f"a line with {text!r}", timeout_s=timeout_s)

    def text(self, timeout_s: float = 60.0) -> str:
        """Everything, once the stream has ended (the child has exited)."""
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the stream did not end"
        return "".join(self.lines)
