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
three of them hold an empty shard of it. ``--lora`` trains a LoRA-shaped model instead: a
frozen 8 MiB base (two 1024 x 1024 weights, sharded) with small trainable adapters.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from costguard.checkpoint import Checkpointer, ResumableLoader
from costguard.checkpoint.state import rng_state

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: tests/ importable
from tests.checkpoint import _train_common as common


class LoraBlock(torch.nn.Module):
    """``base(x) + up(down(x))``, ``base`` a frozen 1024 x 1024 weight (4 MiB)."""

    def __init__(self) -> None:
        super().__init__()
        self.base = torch.nn.Linear(1024, 1024)
        self.base.requires_grad_(False)
        self.down = torch.nn.Linear(1024, 2, bias=False)
        self.up = torch.nn.Linear(2, 1024, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.base(x) + self.up(self.down(x)))


def lora_model() -> torch.nn.Sequential:
    """8 features in, one out: a small projection, two frozen blocks with adapters, a head."""
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 1024), LoraBlock(), torch.nn.Dropout(0.1), LoraBlock(),
        torch.nn.Linear(1024, 1),
    )  # fmt: skip
    model[0].requires_grad_(False)
    return model


def build(rank: int, world: int, *, lora: bool = False) -> tuple[Any, Any, Any, ResumableLoader]:
    """The model (sharded over all ranks), optimizer, scheduler and this rank's loader."""
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)  # the same initial weights on every rank, and every world size
    if lora:
        model = lora_model()
        layers = (model[1], model[3])
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1)
        )
        layers = (model[0], model[3])
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)
    torch.manual_seed(30 + rank)  # each rank its own dropout stream
    loader = ResumableLoader(
        common.shard(common.regression(64, 8), rank, world),
        batch_size=4,
        shuffle=True,
        seed=5 + rank,
    )
    return model, optimizer, scheduler, loader


def main() -> None:
    parser = common.options(steps=12)
    parser.add_argument("--every-steps", type=int, default=4)
    parser.add_argument("--lora", action="store_true", help="the LoRA-shaped model")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    common.deterministic(python=10 + rank, numpy=20 + rank)
    model, optimizer, scheduler, loader = build(rank, world, lora=args.lora)
    extra: dict[str, float] = {"noise": 0.0}

    ckpt = Checkpointer.from_env(default="checkpoints/", every_steps=args.every_steps)
    parts = common.parts(model, optimizer, scheduler, loader, extra=extra)
    step = ckpt.restore(**parts)
    common.say(f"READY {rank} {os.getpid()} {step}")
    for x, y in common.batches(
        ckpt, loader, step, args.steps, parts, sleep_s=args.sleep,
        announce=lambda n: common.say(f"STEP {rank} {n}"),
    ):  # fmt: skip
        this = common.noise()
        total = torch.tensor([this], dtype=torch.float64)
        dist.all_reduce(total)  # extra is replicated: the same on every rank
        extra["noise"] += float(total)
        common.train_step(model, x, y, optimizer, scheduler, this)
    step = max(step, args.steps)  # where the loop ended; a restore only stays where it was
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
    common.say(f"WROTE {rank}")  # gloo's teardown may still abort (torch's own flake)
    dist.barrier()
    dist.destroy_process_group()
    common.say(f"DONE {rank}")


if __name__ == "__main__":
    main()
