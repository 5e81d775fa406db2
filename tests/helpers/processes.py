"""Ports and processes for the emulators and servers the tests start."""

from __future__ import annotations

import ctypes
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from costguard.spot.launcher.local import rendezvous_port


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


def signal_side_thread(pid: int, sig: int, timeout_s: float = 30.0) -> int:
    """Send ``sig`` to a thread of process ``pid`` other than its main one (``tgkill``),
    once the main thread has been asleep (blocked in a call) for a while; the thread's id.

    The kernel may hand a signal sent to a process to any of its threads that does not
    block it, and a Python program runs its handlers in its main thread only, between
    bytecodes. This makes the choice that a busy machine makes now and then. Waits
    (bounded) for the process to have such a thread.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    deadline, asleep = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        threads = (int(task.name) for task in Path(f"/proc/{pid}/task").iterdir())
        side = sorted(tid for tid in threads if tid != pid)
        # /proc/PID/stat: "pid (name) state ...": S is asleep in the kernel.
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        asleep = asleep + 1 if state == "S" else 0
        if side and asleep >= 5:
            if libc.tgkill(pid, side[0], sig) != 0:
                raise OSError(ctypes.get_errno(), f"tgkill({pid}, {side[0]}, {sig})")
            return side[0]
        time.sleep(0.05)
    raise AssertionError(f"process {pid}: no side thread, or its main thread never waited")
