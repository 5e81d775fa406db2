"""A 2-rank FSDP2 (``fully_shard``, gloo, CPU) loop with the README's Checkpointer calls,
and a sharded tensor where costguard cannot save one: in ``extra`` (an EMA of a sharded
weight kept as a DTensor). The model and optimizer are saved sharded, through DCP; the
``extra`` dict goes whole into one rank's ``train.pt``, which would store rank 0's shard.

Each rank prints ``REFUSED <rank> <error>`` when costguard refuses the state and exits 3;
``SAVED <rank>`` if a save went through (which would be the bug: rank 0 would store its
shard of the EMA alone). ``--skip-restore`` goes straight to ``step``.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from costguard.checkpoint import Checkpointer
from costguard.checkpoint.checkpointer import ShardedStateError


def say(line: str) -> None:
    """One line in one write: the ranks share stdout."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--skip-restore", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = next(model.parameters())
    extra = {"ema": first.detach().clone()}  # a DTensor: rank 0 holds half
    ckpt = Checkpointer.from_env(default=args.url, every_steps=1, watch=False)
    code = 0
    try:
        start = 0 if args.skip_restore else ckpt.restore(model=model, optimizer=opt, extra=extra)
        for step in range(start, 2):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            ckpt.step(step, model=model, optimizer=opt, extra=extra)
        ckpt.close()
        say(f"SAVED {rank}")
    except ShardedStateError as exc:
        say(f"REFUSED {rank} {exc.message}")
        ckpt.close(final=False)
        code = 3
    dist.barrier()  # both ranks have said what happened before either exits 3
    dist.destroy_process_group()
    sys.exit(code)


if __name__ == "__main__":
    main()
