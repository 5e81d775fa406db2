"""What an incremental save costs a LoRA-shaped fine-tune, measured side by side in one run.

The state: a frozen base of ``--layers`` square Linear weights (>= 512 MB in all, float32,
``requires_grad`` off) with a rank-``--rank`` adapter on each (about 1% of the base) and
AdamW over the adapters. The loop trains a step, then saves (``Checkpointer.save``, the
README's calls), ``--saves`` times, into a local folder (``--folder``; a temporary one on
the working directory's disk by default, so no tmpfs holds it).

1. Bytes uploaded per save (after the first, which stores everything once) / the full
   state's size (target <= 0.03).
2. Training stall per save (after the first) / a copy of the full state to CPU memory
   (target <= 0.1). The full copy is timed tensor by tensor into one warm scratch buffer
   the size of the largest tensor: the same bytes copied as a full snapshot, without
   holding a second copy of the state (memory stays near the state's size).

Afterwards the newest checkpoint is verified (every object's sha256, pool objects
included). Medians over the saves. torch runs one intra-op thread (``--threads``): on a
small shared machine its pool of threads waiting for busy cores blurs both timings.

With ``--sharded`` the same model is sharded with FSDP2 (``fully_shard``, gloo on CPU) over
``--world`` processes, and every rank saves its own shards:

1. Bytes written per save (after the first; every rank's shards and pool objects,
   ``train.pt``, ``dcp.metadata``) / the checkpoint's size (target <= 0.05).
2. Training stall per save (after the first: how long ``Checkpointer.save`` kept the
   loop, on the slowest rank; the save then goes on in the background and is waited for
   outside the timing) / a full sharded save of the same state
   (``Checkpointer(incremental=False)``: every shard written each time, the loop blocked
   until it is committed) (target <= 0.2).

    python benchmarks/incremental.py [--layers 8] [--width 4096] [--rank 16] [--saves 6]
    python benchmarks/incremental.py --sharded [--world 2] [--layers 8] [--width 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from costguard.checkpoint import Checkpointer
from costguard.checkpoint import state as state_mod
from costguard.checkpoint.inventory import verify


class LoraLinear(torch.nn.Module):
    """``base(x) + up(down(x))`` with ``base`` frozen."""

    def __init__(self, width: int, rank: int) -> None:
        super().__init__()
        self.base = torch.nn.Linear(width, width, bias=False)
        self.base.requires_grad_(False)
        self.down = torch.nn.Linear(width, rank, bias=False)
        self.up = torch.nn.Linear(rank, width, bias=False)
        torch.nn.init.zeros_(self.up.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.up(self.down(x))


def tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in tensors(v)]
    return []


def full_copy_s(state: Any, repeats: int = 3) -> float:
    """Median time to copy every tensor of ``state`` into a warm CPU buffer."""
    found = tensors(state)
    scratch = torch.empty(max(t.numel() * t.element_size() for t in found), dtype=torch.uint8)
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        for t in found:
            n = t.numel() * t.element_size()
            scratch[:n].copy_(t.detach().reshape(-1).view(torch.uint8))
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def sharded_rank(rank: int, args: argparse.Namespace, port: int, folder: str) -> None:
    """One rank of ``--sharded``: full sharded saves, then incremental ones; rank 0 writes
    what it measured to ``folder/report.json``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (args.world,))
    model = torch.nn.Sequential(*(LoraLinear(args.width, args.rank) for _ in range(args.layers)))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)

    def saves(name: str, count: int, *, incremental: bool) -> tuple[list[Any], list[float]]:
        """``count`` saves, each after a training step: rank 0's results (empty
        elsewhere) and how long each ``save`` call kept this rank."""
        stalls = []
        with Checkpointer(
            Path(folder, name), keep_last=2, partial_grace_s=0.0, incremental=incremental
        ) as ckpt:
            for step in range(count):
                model(torch.randn(4, args.width)).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
                dist.barrier()
                started = time.perf_counter()
                ckpt.save(step, model=model, optimizer=optimizer)
                stalls.append(time.perf_counter() - started)
                ckpt.flush()  # the background part, outside the timing
        return ckpt.results, stalls

    full, _ = saves("full", args.saves, incremental=False)
    incremental, stalls = saves("incremental", args.saves, incremental=True)
    every: list[Any] = [None] * args.world
    dist.all_gather_object(every, stalls)
    if rank == 0:
        first, *later = incremental
        assert all(r.ok for r in [*full, *incremental])
        report = {
            # The loop waited for all of a full save: staging, shards, index, manifest.
            "full_s": statistics.median(r.save_s for r in full[1:]),
            "full_bytes": full[-1].size_bytes,
            "first": [first.uploaded_bytes, max(s[0] for s in every)],
            "uploaded": statistics.median(r.uploaded_bytes for r in later),
            "size": statistics.median(r.size_bytes for r in later),
            "stall": statistics.median(max(s[i] for s in every) for i in range(1, args.saves)),
            "save_s": statistics.median(r.save_s for r in later),
        }
        Path(folder, "report.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def sharded(args: argparse.Namespace) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(dir=args.folder or Path.cwd()) as folder:
        mp.spawn(sharded_rank, args=(args, port, folder), nprocs=args.world, join=True)
        report = json.loads(Path(folder, "report.json").read_text())
    mib = 2**20
    print(
        f"sharded over {args.world} ranks: checkpoint {report['size'] / mib:.1f} MiB; a full "
        f"sharded save writes {report['full_bytes'] / mib:.1f} MiB in {report['full_s']:.3f} s"
    )
    print(
        f"first save: {report['first'][0] / mib:.1f} MiB written, blocked "
        f"{report['first'][1]:.3f} s (everything, once)"
    )
    written = report["uploaded"] / report["size"]
    print(
        f"1. bytes written per save {report['uploaded'] / mib:.2f} MiB / checkpoint "
        f"{report['size'] / mib:.1f} MiB: ratio {written:.4f} (target <= 0.05: "
        f"{'met' if written <= 0.05 else 'NOT met'})"
    )
    stall = report["stall"] / report["full_s"]
    print(
        f"2. training blocked per save {report['stall'] * 1e3:.1f} ms / full sharded save "
        f"{report['full_s'] * 1e3:.1f} ms: ratio {stall:.3f} (target <= 0.2: "
        f"{'met' if stall <= 0.2 else 'NOT met'})"
    )
    print(f"   the save in the background, staging to commit: {report['save_s']:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--saves", type=int, default=6)
    parser.add_argument("--folder", default=None, help="the checkpoint folder (default: a temp)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--sharded", action="store_true", help="FSDP2 over --world ranks")
    parser.add_argument("--world", type=int, default=2, help="ranks, with --sharded")
    args = parser.parse_args()
    if args.sharded:
        sharded(args)
        return
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(LoraLinear(args.width, args.rank) for _ in range(args.layers)))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    adapter = sum(p.numel() * p.element_size() for p in trainable)

    def train_step() -> None:
        model(torch.randn(4, args.width)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    train_step()  # AdamW's moments exist from here on: the state has its full size
    captured = state_mod.capture(1, state_mod.TrainState(model=model, optimizer=optimizer))
    full = sum(t.numel() * t.element_size() for t in tensors(captured))
    copy_s = full_copy_s(captured)
    del captured
    print(
        f"state: {full / 2**20:.0f} MiB ({frozen / 2**20:.0f} MiB frozen, adapters "
        f"{adapter / 2**20:.1f} MiB = {adapter / frozen:.2%} of the base, + AdamW moments)"
    )
    with tempfile.TemporaryDirectory(dir=args.folder or Path.cwd()) as folder:
        ckpt = Checkpointer(folder, keep_last=2, partial_grace_s=0.0)
        for step in range(args.saves):
            train_step()
            future = ckpt.save(step, model=model, optimizer=optimizer)
            assert future is not None
            result = future.result()
            assert result.ok, result.error
        ckpt.close()
        bad = [v for v in verify(ckpt.store, latest_only=True) if not v.ok]
        assert not bad, bad
        first, *later = ckpt.results
        uploaded = statistics.median(r.uploaded_bytes for r in later)
        stall = statistics.median(r.stall_s for r in later)
        save = statistics.median(r.save_s for r in later)
    print(
        f"first save: {first.uploaded_bytes / 2**20:.0f} MiB written, blocked "
        f"{first.stall_s:.3f} s, {first.save_s:.1f} s in all (everything, once)"
    )
    print(
        f"1. bytes written per save {uploaded / 2**20:.2f} MiB / full state "
        f"{full / 2**20:.0f} MiB: ratio {uploaded / full:.4f} (target <= 0.03)"
    )
    print(
        f"2. training blocked per save {stall * 1e3:.1f} ms / full-state copy "
        f"{copy_s * 1e3:.1f} ms: ratio {stall / copy_s:.3f} (target <= 0.1)"
    )
    print(f"   background save per save {save:.2f} s; newest checkpoint verified")


if __name__ == "__main__":
    main()
