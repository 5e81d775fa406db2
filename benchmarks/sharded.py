"""What a sharded (FSDP2 + DCP) save costs, measured side by side in one run.

``--world`` processes (gloo on CPU by default; ``--device cuda`` uses NCCL and one GPU per
rank) hold a stack of Linear layers sharded with ``fully_shard`` plus their AdamW moments,
``--size-mb`` in all. Printed, with the targets of issue 18:

1. Peak memory per rank during a sharded save / that rank's shard (target <= 1.3): the
   rank's live state (its parameter shards and AdamW moments, counted tensor by tensor:
   the memory any save must read from) plus what the save adds (the process's peak RSS,
   sampled every millisecond while the save runs, less its RSS just before), over the
   bytes of the rank's ``shard-<rank>.distcp``. The process's whole RSS is not used: it
   also holds torch, gloo's buffers and the allocator's cache of FSDP's all-gathered
   layers from the training step, none of which depends on the save. On CUDA the live
   shards are in GPU memory and what the save adds is the CPU copy it writes from.
2. Bytes written by the busiest rank / (all bytes / world) (target <= 1.1): rank 0 also
   writes ``dcp.metadata`` and ``train.pt``.
3. Sharded save wall (``Checkpointer.save`` on every rank until all are done: shards with
   sha256, index, ``train.pt``, manifest; retention then runs in the background and is
   waited for outside the timing) / DCP's own ``dcp.save`` of the same state with
   ``FileSystemWriter`` (no manifest, no checksums) (target <= 1.2). The two run back to
   back in each repeat, into the same file system; medians.
4. A restore of the newest checkpoint (verify every object, then DCP load): its wall, and
   whether the full state came back equal.

    python benchmarks/sharded.py [--world 4] [--size-mb 256] [--repeats 3]
    python benchmarks/sharded.py --device cuda      # on a machine with GPUs (NCCL)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from costguard.checkpoint import Checkpointer
from costguard.checkpoint.manifest import MANIFEST_FILE

WIDTH = 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    with Path("/proc/self/statm").open() as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss(threading.Thread):
    """Samples the RSS every millisecond until stopped; :attr:`peak` is the highest seen."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = rss_bytes()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, rss_bytes())
            self._stop_event.wait(0.001)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, rss_bytes())


def build(size_mb: int, world: int, device: str) -> tuple[torch.nn.Module, Any]:
    """Layers of WIDTH x WIDTH weights, sharded over ``world`` ranks; AdamW state made.

    Parameters + two AdamW moments are 3 x 4 bytes per weight: ``size_mb`` sets the count.
    The model is made on the meta device, so no rank ever holds the whole of it.
    """
    layers = max(1, round(size_mb * 2**20 / (3 * 4 * WIDTH * WIDTH)))
    mesh = init_device_mesh(device, (world,))
    with torch.device("meta"):
        model = torch.nn.Sequential(
            *(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers))
        )
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device=device)
    torch.manual_seed(dist.get_rank())
    for param in model.parameters():
        torch.nn.init.normal_(param, std=0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, WIDTH, device=device)).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def rank_main(rank: int, args: argparse.Namespace, port: int, folder: str) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(args.world),
        }
    )
    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl" if cuda else "gloo")
    model, optimizer = build(args.size_mb, args.world, args.device)
    live = sum(
        t.to_local().nbytes if hasattr(t, "to_local") else t.nbytes
        for t in [*model.parameters(), *(v for s in optimizer.state.values() for v in s.values())]
        if isinstance(t, torch.Tensor)
    )
    root = Path(folder)
    ckpt = Checkpointer(root / "ours", keep_last=2, save_niceness=0)
    ours: list[float] = []
    theirs: list[float] = []
    peak_added = 0
    for repeat in range(args.repeats):
        dist.barrier()
        started_rss = rss_bytes()
        sampler = PeakRss()
        sampler.start()
        started = time.perf_counter()
        ckpt.save(repeat, model=model, optimizer=optimizer)
        dist.barrier()
        ours.append(time.perf_counter() - started)
        ckpt.flush()  # retention, in the background: before the baseline starts
        peak = sampler.stop()
        peak_added = max(peak_added, peak - started_rss)
        plain = root / f"plain-{repeat}"
        dist.barrier()
        started = time.perf_counter()
        state = dict(zip(("model", "optimizer"), get_state_dict(model, optimizer), strict=True))
        dcp.save(state, storage_writer=dcp.FileSystemWriter(plain))
        dist.barrier()
        theirs.append(time.perf_counter() - started)
        if rank == 0:
            shutil.rmtree(plain, ignore_errors=True)
    expected = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
    for param in model.parameters():  # other weights: the restore must bring them back
        torch.nn.init.zeros_(param)
    dist.barrier()
    started = time.perf_counter()
    with Checkpointer(root / "ours") as reader:
        restored = reader.restore(model=model, optimizer=optimizer)
    dist.barrier()
    restore_s = time.perf_counter() - started
    equal = all(
        torch.equal(v.full_tensor().cpu(), expected[k]) for k, v in model.state_dict().items()
    )
    ckpt.close(final=False)
    newest = [ckpt.results[-1].name if rank == 0 else ""]
    dist.broadcast_object_list(newest, src=0)
    manifest = json.loads((root / "ours" / newest[0] / MANIFEST_FILE).read_text())
    sizes = {o["name"]: o["size_bytes"] for o in manifest["objects"]}
    report = {
        "rank": rank,
        "shard": sizes[f"shard-{rank:05d}.distcp"],
        "live": live,
        "peak_added": peak_added,
        "ours": ours,
        "theirs": theirs,
        "restore_s": restore_s,
        "restored_step": restored,
        "equal": equal,
        "sizes": sizes,
    }
    reports: list[Any] = [None] * args.world
    dist.all_gather_object(reports, report)
    if rank == 0:
        show(args, reports)
    dist.barrier()
    dist.destroy_process_group()


def show(args: argparse.Namespace, reports: list[dict[str, Any]]) -> None:
    sizes = reports[0]["sizes"]
    total = sum(sizes.values())
    written = {r["rank"]: r["shard"] for r in reports}
    written[0] += sizes.get("dcp.metadata", 0) + sizes.get("train.pt", 0)
    ours = statistics.median(t for r in reports[:1] for t in r["ours"])
    theirs = statistics.median(t for r in reports[:1] for t in r["theirs"])
    print(
        f"sharded save: {args.world} ranks ({args.device}), {total / 2**20:.0f} MiB in all, "
        f"{args.repeats} repeats"
    )
    print("1. peak memory during the save / the rank's shard (target <= 1.3):")
    for r in reports:
        print(
            f"   rank {r['rank']}: shard {r['shard'] / 2**20:.1f} MiB, live state "
            f"{r['live'] / 2**20:.1f} MiB, added by the save {r['peak_added'] / 2**20:.1f} MiB:"
            f" {(r['live'] + r['peak_added']) / r['shard']:.2f}"
        )
    worst = max((r["live"] + r["peak_added"]) / r["shard"] for r in reports)
    print(f"   worst rank: {worst:.2f}  (the replicated path needs {args.world:.0f}x on rank 0)")
    busiest = max(written.values())
    print(
        f"2. busiest rank's bytes / (total / world) (target <= 1.1): "
        f"{busiest / (total / args.world):.3f}  (per rank, MiB: "
        + ", ".join(f"{written[k] / 2**20:.1f}" for k in sorted(written))
        + ")"
    )
    print(
        f"3. sharded save wall / dcp.save with FileSystemWriter (target <= 1.2): "
        f"{ours / theirs:.2f}  (median {ours:.2f} s vs {theirs:.2f} s; each repeat: "
        + ", ".join(
            f"{a:.2f}/{b:.2f}"
            for a, b in zip(reports[0]["ours"], reports[0]["theirs"], strict=True)
        )
        + ")"
    )
    print(
        f"4. restore (verify, then DCP load): {reports[0]['restore_s']:.2f} s; full state "
        f"equal on every rank: {all(r['equal'] for r in reports)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, help="ranks (default: 4 on CPU, one per GPU)")
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dir", help="where to write (default: a temporary folder)")
    args = parser.parse_args()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("no GPU here: the CUDA/NCCL sharded save and restore did NOT run")
            sys.exit(3)
        args.world = args.world or torch.cuda.device_count()
        if torch.cuda.device_count() < args.world:
            print(
                f"{torch.cuda.device_count()} GPU(s) for {args.world} ranks: ranks share GPUs, "
                "which NCCL refuses; pass --world "
                f"{torch.cuda.device_count()}"
            )
            sys.exit(3)
    args.world = args.world or 4
    folder = tempfile.mkdtemp(prefix="costguard-sharded-", dir=args.dir)
    try:
        mp.spawn(rank_main, args=(args, free_port(), folder), nprocs=args.world, join=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
