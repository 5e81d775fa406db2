"""Two ranks (gloo, CPU) decide together: run by tests/checkpoint/test_distributed.py.

Scenarios, each in its own folder under ``argv[1]``, with a notice posted on rank 1 only:

* ``every``: the ranks agree at every step; the notice at step 5 stops both at step 5.
* ``sparse``: they agree every 4 steps and save every 3 by the step count; the notice
  at step 5 stops both at step 8 (the next agreement), and the scheduled saves of steps
  3 and 6 still happened on both ranks between agreements.

Then each rank restores from the emergency checkpoint and gets its own RNG and loader
state back. Every rank appends one JSON line per scenario to ``results-<rank>.jsonl``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from costguard.checkpoint import Checkpointer
from costguard.checkpoint.notices import Notice, NoticeBoard


class Position:
    """A per-rank stateful object (like a sharded loader's position)."""

    def __init__(self, rank: int) -> None:
        self.rank, self.taken = rank, 0

    def state_dict(self) -> dict[str, int]:
        return {"rank": self.rank, "taken": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.rank, self.taken = state["rank"], state["taken"]


def scenario(root: Path, name: str, rank: int, **options: Any) -> dict[str, Any]:
    url = root / name
    torch.manual_seed(100 + rank)
    model = torch.nn.Linear(2, 2)
    if rank == 0:
        torch.nn.init.ones_(model.weight)
    board = NoticeBoard()
    ckpt = Checkpointer(url, notices=board, exit_on_notice=False, keep_last=10, **options)
    position = Position(rank)
    stopped_at, expected_draw = None, None
    for step in range(20):
        position.taken += 1
        torch.rand(1)  # the torch RNG moves on, differently per rank
        if step == 5 and rank == 1:
            board.post(Notice("signal", "signal", None, "test"))
        if ckpt.step(step, model=model, loader=position):
            stopped_at = step
            expected_draw = torch.rand(1).item()  # what a resumed rank must draw next
            break
    ckpt.close()
    restored_position = Position(-1)
    reader = Checkpointer(url, check=False)
    start = reader.restore(model=torch.nn.Linear(2, 2), loader=restored_position)
    reader.close()
    return {
        "scenario": name,
        "rank": rank,
        "stopped_at": stopped_at,
        "saved": sorted(int(p.parent.name.split("-")[1]) for p in url.glob("*/manifest.json")),
        "start": start,
        "restored_position": restored_position.state_dict(),
        "expected_draw": expected_draw,
        "next_draw": torch.rand(1).item(),
        "results_on_this_rank": len(ckpt.results),
    }


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    root = Path(sys.argv[1])
    for name, options in (
        ("every", {"sync_every": 1}),
        ("sparse", {"sync_every": 4, "every_steps": 3}),
    ):
        result = scenario(root, name, rank, **options)
        dist.barrier()
        with (root / f"results-{rank}.jsonl").open("a") as stream:
            stream.write(json.dumps(result, sort_keys=True) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
