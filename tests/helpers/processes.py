"""Ports and processes for the emulators and servers the tests start."""

from __future__ import annotations

import socket
import subprocess
from typing import Any


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
