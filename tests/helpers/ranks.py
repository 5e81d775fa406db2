"""``python ranks.py N SCRIPT [ARGS...]``: N ranks of a torch.distributed script, forked
from one interpreter that has already imported torch.

The tests start ranks outside ``costguard run`` this way (uninterrupted reference runs,
restores on another number of ranks, the kill -9 trials). Each rank is a real process with
its own pid, started the way ``torch.multiprocessing.start_processes(start_method="fork")``
starts one, and finds the others through the ``env://`` rendezvous (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, as torchrun sets them) at a store that
rank 0 hosts on a port it bound itself (``store_port``). What it saves is ``import torch``
and the modules a training step loads lazily: about 7 s of CPU per rank on this machine,
20 s or more per 4-rank start. Runs under ``costguard run`` keep torchrun: its behaviour
there (signals, exit codes) is part of what they test.

As torchrun does, when one rank fails or is killed the others are stopped (SIGTERM, then
SIGKILL after a grace period) and the exit code is 1; a signal to the launcher goes to
every rank. Ranks still running after ``DEADLINE_S`` print their stacks and are killed
(exit 124), so a hang fails its test with a reason before the test's own timeout.
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import select
import signal
import sys
import time
from datetime import timedelta
from typing import Any

# What every training script here imports, and what its first optimizer step and save load
# lazily (torch._dynamo through torch._disable_dynamo; DCP and FSDP for sharded states).
import torch
import torch._dynamo
import torch.distributed.checkpoint
import torch.distributed.fsdp  # noqa: F401
from torch.distributed import TCPStore
from torch.multiprocessing import start_processes

import costguard.checkpoint  # noqa: F401

#: How long a rank waits for rank 0's store to be listening, and the store's own timeout.
STORE_TIMEOUT_S = 120
#: How long the ranks may run: a hang ends here, with stacks, before the test's timeout.
DEADLINE_S = 230
#: Rank 0's rendezvous store, open for as long as the rank lives.
STORES: list[TCPStore] = []


def store_port(rank: int, world: int, pipe: tuple[int, int]) -> int:
    """The port of the ranks' rendezvous store, which rank 0 hosts (as torchrun's agent
    does): rank 0 binds port 0 and writes the port it got into ``pipe`` once for each
    other rank; the others read it. No port is chosen first and bound later, so no other
    program on the machine can take it in between (a stranger's rank joining this store
    would hang the ranks for gloo's 30 minutes)."""
    read_end, write_end = pipe
    if rank == 0:
        os.close(read_end)
        store = TCPStore(
            "127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
            timeout=timedelta(seconds=STORE_TIMEOUT_S),
        )  # fmt: skip
        STORES.append(store)
        os.write(write_end, f"{store.port}\n".encode() * (world - 1))
        os.close(write_end)
        return int(store.port)
    os.close(write_end)
    ready, _, _ = select.select([read_end], [], [], STORE_TIMEOUT_S)
    line = os.read(read_end, 6) if ready else b""  # one "<port>\n": at most 6 bytes
    if not line.endswith(b"\n"):
        raise RuntimeError(f"rank {rank}: rank 0 never said its store's port")
    return int(line)


def rank_main(rank: int, world: int, pipe: tuple[int, int], script: str, args: list[str]) -> None:
    """One rank: torchrun's environment, then the script as ``__main__``."""
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store_port(rank, world, pipe)),
            "TORCHELASTIC_USE_AGENT_STORE": "True",  # every rank a client of rank 0's store
        }
    )
    faulthandler.register(signal.SIGQUIT, all_threads=True)  # stop_hung's stacks
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def main() -> int:
    world, script, *args = sys.argv[1:]
    context = start_processes(
        rank_main,
        args=(int(world), os.pipe(), script, args),
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
    deadline = time.monotonic() + DEADLINE_S
    try:
        # One failed: SIGTERM to the rest, SIGKILL after 30 s.
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                return stop_hung(context.processes)
    except Exception as failed:  # a rank raised, exited non-zero or was killed
        print(f"ranks.py: {failed}", file=sys.stderr)
        return 1
    return 0


def stop_hung(processes: list[Any]) -> int:
    """Ranks still running at the deadline: each prints every thread's stack (SIGQUIT,
    faulthandler) for the test's failure message, then is killed; exit 124 as timeout's."""
    hung = [p for p in processes if p.is_alive() and p.pid is not None]
    for process in hung:
        os.kill(process.pid, signal.SIGQUIT)
    time.sleep(2)  # for the stacks to be written
    for process in hung:
        process.kill()
        process.join()
    ranks = ", ".join(str(processes.index(p)) for p in hung)
    print(f"ranks.py: rank(s) {ranks} still running after {DEADLINE_S} s: killed", file=sys.stderr)
    return 124


if __name__ == "__main__":
    sys.exit(main())
