"""A seeded 2-rank DDP training run (gloo, CPU) that checkpoints through costguard.

Started by the tests with torchrun, under ``costguard run`` or alone. Each rank prints
``READY <rank> <pid> <start>`` after the restore and ``STEP <rank> <n>`` after each step;
rank 0 writes the final weights, optimizer and scheduler state to ``--out`` and every
rank writes its final RNG states next to it. The ranks seed dropout and Python/NumPy
noise differently and read different shards, so a resume that gave a rank another rank's
RNG or loader state would change the final weights.

``--one-tensor``: a model whose weights are one tensor (a gang's test,
tests/spot/test_gang.py). DDP then reduces one bucket of one layout in every run, so a
resumed 4-rank run sums in the same order as an uninterrupted one and ends bitwise equal
(with several tensors, DDP's bucket rebuild after a restart changes 4-rank gloo sums by
float rounding: tests/checkpoint/test_multinode.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from costguard.checkpoint import Checkpointer, ResumableLoader
from costguard.checkpoint.state import rng_state

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: tests/ importable
from tests.checkpoint import _train_common as common


def main() -> None:
    parser = common.options(steps=40)
    parser.add_argument(
        "--abort-after-close", type=int, default=-1, help="this rank aborts after close()"
    )
    parser.add_argument("--one-tensor", action="store_true", help="the weights in one tensor")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    common.deterministic(python=10 + rank, numpy=20 + rank, torch_seed=30 + rank)
    loader = ResumableLoader(
        common.shard(common.regression(96, 8), rank, world),
        batch_size=6,
        shuffle=True,
        seed=5 + rank,
    )
    if args.one_tensor:
        model = torch.nn.Sequential(torch.nn.Dropout(0.2), torch.nn.Linear(8, 1, bias=False))
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1)
        )
    ddp = DistributedDataParallel(model)  # rank 0's initial weights on every rank
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.7)
    extra: dict[str, float] = {"loss_sum": 0.0}  # the mean loss over ranks: replicated

    ckpt = Checkpointer.from_env(default="checkpoints/", every_steps=5)
    parts = common.parts(model, optimizer, scheduler, loader, extra=extra)
    step = ckpt.restore(**parts)
    common.say(f"READY {rank} {os.getpid()} {step}")
    for x, y in common.batches(
        ckpt, loader, step, args.steps, parts, sleep_s=args.sleep,
        announce=lambda n: common.say(f"STEP {rank} {n}"),
    ):  # fmt: skip
        mean = common.train_step(ddp, x, y, optimizer, scheduler, common.noise()).detach().clone()
        dist.all_reduce(mean)
        extra["loss_sum"] += float(mean) / world
    ckpt.close()
    if rank == args.abort_after_close:
        os.abort()  # as gloo's teardown sometimes does: "terminate called without ..."
    torch.save({"rng": rng_state(), "extra": extra}, f"{args.out}.rank{rank}")
    if rank == 0:
        common.save_final(parts, args.out)
    dist.barrier()
    dist.destroy_process_group()
    common.say(f"DONE {rank}")


if __name__ == "__main__":
    main()
