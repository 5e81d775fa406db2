"""A seeded FSDP2 (``fully_shard`` on a CPU device mesh, gloo) training run with the
README's Checkpointer calls, unchanged from a single-process script.

Started by the tests with torchrun (any number of ranks), under ``costguard run`` or alone.
Each rank prints ``READY <rank> <pid> <start>`` after the restore, ``STEP <rank> <n>``
after each step and ``WROTE <rank>`` once its output is written. At the end rank 0 writes
the *full* state (model and optimizer gathered with
``get_state_dict(full_state_dict=True)``, keyed by parameter name, the same on any number
of ranks) to ``--out``, and every rank its RNG states and loader position to
``<out>.rank<r>``. ``--steps`` equal to the checkpoint's step only restores and writes: a
restore on another number of ranks. The second layer has one output row, so with 4 ranks
three of them hold an empty shard of it.
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
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from costguard.checkpoint import Checkpointer, ResumableLoader
from costguard.checkpoint.state import rng_state


def say(line: str) -> None:
    """One line in one write: the ranks share stdout."""
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


def build(rank: int, world: int) -> tuple[Any, Any, Any, ResumableLoader]:
    """The model (sharded over all ranks), optimizer, scheduler and this rank's loader."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # the same initial weights on every rank, and every world size
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1)
    )
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)
    torch.manual_seed(30 + rank)  # each rank its own dropout stream
    data = torch.randn(64, 8, generator=torch.Generator().manual_seed(4))
    target = data.sum(dim=1, keepdim=True).sin()
    shard = torch.utils.data.Subset(
        torch.utils.data.TensorDataset(data, target), list(range(rank, len(data), world))
    )
    loader = ResumableLoader(shard, batch_size=4, shuffle=True, seed=5 + rank)
    return model, optimizer, scheduler, loader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", required=True)
    parser.add_argument("--every-steps", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    random.seed(10 + rank)
    np.random.seed(20 + rank)
    model, optimizer, scheduler, loader = build(rank, world)
    extra: dict[str, float] = {"noise": 0.0}

    ckpt = Checkpointer.from_env(default="checkpoints/", every_steps=args.every_steps)
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
            total = torch.tensor([noise], dtype=torch.float64)
            dist.all_reduce(total)  # extra is replicated: the same on every rank
            extra["noise"] += float(total)
            loss = torch.nn.functional.mse_loss(model(x), y) + noise
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            if args.sleep:
                time.sleep(args.sleep)
            ckpt.step(step, epoch=loader.epoch, **parts, extra=extra)
            step += 1
            say(f"STEP {rank} {step}")
            if step >= args.steps:
                break
    ckpt.close()
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=full)
    own = {"rng": rng_state(), "loader": loader.state_dict(), "extra": extra}
    torch.save(own, f"{args.out}.rank{rank}")
    if rank == 0:
        torch.save(
            {
                "model": model_state,
                "optimizer": optimizer_state,
                "scheduler": scheduler.state_dict(),
                "step": step,
            },
            args.out,
        )
    say(f"WROTE {rank}")  # gloo's teardown may still abort (torch's own flake)
    dist.barrier()
    dist.destroy_process_group()
    say(f"DONE {rank}")


if __name__ == "__main__":
    main()
