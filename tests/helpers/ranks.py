"""``python ranks.py N SCRIPT [ARGS...]``: N ranks of a torch.distributed script, forked
from one interpreter that has already imported torch.

The tests start ranks outside ``costguard run`` this way (uninterrupted reference runs,
restores on another number of ranks, the kill -9 trials). Each rank is a real process with
its own pid, started the way ``torch.multiprocessing.start_processes(start_method="fork")``
starts one, and finds the others through the ``env://`` rendezvous (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, as torchrun sets them). What it saves
is ``import torch`` and the modules a training step loads lazily: about 7 s of CPU per rank
on this machine, 20 s or more per 4-rank start. Runs under ``costguard run`` keep torchrun:
its behaviour there (signals, exit codes) is part of what they test.

As torchrun does, when one rank fails or is killed the others are stopped (SIGTERM, then
SIGKILL after a grace period) and the exit code is 1; a signal to the launcher goes to
every rank.
"""

from __future__ import annotations

import os
import runpy
import signal
import socket
import sys

# What every training script here imports, and what its first optimizer step and save load
# lazily (torch._dynamo through torch._disable_dynamo; DCP and FSDP for sharded states).
import torch
import torch._dynamo
import torch.distributed.checkpoint
import torch.distributed.fsdp  # noqa: F401
from torch.multiprocessing import start_processes

import costguard.checkpoint  # noqa: F401


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_main(rank: int, world: int, port: int, script: str, args: list[str]) -> None:
    """One rank: torchrun's environment, then the script as ``__main__``."""
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def main() -> int:
    world, script, *args = sys.argv[1:]
    context = start_processes(
        rank_main,
        args=(int(world), free_port(), script, args),
        nprocs=int(world),
        join=False,
        start_method="fork",
    )

    def relay(number: int, _frame: object) -> None:
        for process in context.processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, number)

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, relay)
    try:
        while not context.join():  # one failed: SIGTERM to the rest, SIGKILL after 30 s
            pass
    except Exception as failed:  # a rank raised, exited non-zero or was killed
        print(f"ranks.py: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
