"""A seeded 2-rank DDP training run (gloo, CPU) that checkpoints through costguard.

Started by the tests with torchrun, under ``costguard run`` or alone. Each rank prints
``READY <rank> <pid> <start>`` after the restore and ``STEP <rank> <n>`` after each step;
rank 0 writes the final weights, optimizer and scheduler state to ``--out`` and every
rank writes its final RNG states next to it. The ranks seed dropout and Python/NumPy
noise differently and read different shards, so a resume that gave a rank another rank's
RNG or loader state would change the final weights.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from costguard.checkpoint import Checkpointer, ResumableLoader
from costguard.checkpoint.state import rng_state


def say(line: str) -> None:
    """One line in one write: the ranks share stdout, and must not split each other's lines."""
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step")
    parser.add_argument(
        "--abort-after-close", type=int, default=-1, help="this rank aborts after close()"
    )
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    random.seed(10 + rank)
    np.random.seed(20 + rank)
    torch.manual_seed(30 + rank)
    data = torch.randn(96, 8, generator=torch.Generator().manual_seed(4))
    target = data.sum(dim=1, keepdim=True).sin()
    shard = torch.utils.data.Subset(
        torch.utils.data.TensorDataset(data, target), list(range(rank, len(data), world))
    )
    loader = ResumableLoader(shard, batch_size=6, shuffle=True, seed=5 + rank)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1)
    )
    ddp = DistributedDataParallel(model)  # rank 0's initial weights on every rank
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.7)
    extra: dict[str, float] = {"loss_sum": 0.0}  # the mean loss over ranks: replicated

    ckpt = Checkpointer.from_env(default="checkpoints/", every_steps=5)
    parts: dict[str, Any] = {
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "loader": loader,
    }
    step = ckpt.restore(**parts, extra=extra)
    say(f"READY {rank} {os.getpid()} {step}")
    while step < args.steps:
        for x, y in loader:
            noise = random.random() * 1e-3 + float(np.random.rand()) * 1e-3
            loss = torch.nn.functional.mse_loss(ddp(x), y) + noise
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            extra["loss_sum"] += float(mean) / world
            if args.sleep:
                time.sleep(args.sleep)
            ckpt.step(step, epoch=loader.epoch, **parts, extra=extra)
            step += 1
            say(f"STEP {rank} {step}")
            if step >= args.steps:
                break
    ckpt.close()
    if rank == args.abort_after_close:
        os.abort()  # as gloo's teardown sometimes does: "terminate called without ..."
    torch.save({"rng": rng_state(), "extra": extra}, f"{args.out}.rank{rank}")
    if rank == 0:
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "extra": extra,
            },
            args.out,
        )
    dist.barrier()
    dist.destroy_process_group()
    say(f"DONE {rank}")


if __name__ == "__main__":
    main()
