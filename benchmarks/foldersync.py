"""What ``costguard run --sync-dir`` costs training, and how soon a notice's checkpoint is
committed, in one run.

1. Steps/s of a small training loop (its own process, one thread, as the trainer runs
   beside ``costguard run``) while a SIZE MB Hugging Face checkpoint folder is uploaded to
   moto S3 by :class:`~costguard.checkpoint.foldersync.FolderSync` / steps/s in the same
   run while nothing is uploaded (target >= 0.9); beside it, the same ratio for boto3
   ``upload_file`` of the same files (what any upload costs on this machine).
2. Notice to committed: the trainer's own save of a SIZE MB state into ``checkpoint-N/``
   plus the sync of that folder up to its manifest (files, sha256, manifest; retention
   comes after the commit) / the same save plus one boto3 ``upload_file`` of each of its
   files (target <= 1.2).

moto runs in this process (a thread), as the store would be reached from ``costguard run``.

    python benchmarks/foldersync.py [--size-mb 500]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import boto3
import torch
from moto.server import ThreadedMotoServer

from costguard.checkpoint.foldersync import FolderSync
from costguard.checkpoint.store import Store

BUCKET = "bench-sync"
#: The training loop beside the upload: steps done in each WINDOW_S window, as lines.
WINDOW_S = 0.25
LOOP = """
import sys, time, torch
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
batch = torch.randn(64, 256)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    start, done = time.time(), 0
    while time.time() - start < {window}:
        opt.zero_grad(); model(batch).pow(2).mean().backward(); opt.step(); done += 1
    print(start, time.time(), done, flush=True)
""".replace("{window}", str(WINDOW_S))


def hf_folder(root: Path, step: int, size_mb: int) -> Path:
    """A checkpoint folder as the Trainer leaves it: weights, optimizer, state file."""
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name, share in (("model.safetensors", 1), ("optimizer.pt", 2)):
        with (folder / name).open("wb") as file:
            for _ in range(size_mb * share // 3):
                file.write(os.urandom(2**20))
    (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    return folder


def steps_ratio(upload: Callable[[], object], what: str) -> float:
    """Part 1: steps/s of the loop while ``upload()`` runs / steps/s before and after."""
    loop = subprocess.Popen(
        [sys.executable, "-c", LOOP, "120"], stdout=subprocess.PIPE, text=True, bufsize=1
    )
    assert loop.stdout is not None
    windows = [tuple(map(float, loop.stdout.readline().split())) for _ in range(12)]
    started = time.time()
    uploading = threading.Thread(target=upload)
    uploading.start()
    while uploading.is_alive():
        windows.append(tuple(map(float, loop.stdout.readline().split())))
    ended = time.time()
    windows += [tuple(map(float, loop.stdout.readline().split())) for _ in range(12)]
    loop.kill()
    loop.wait()
    during = [w[2] / (w[1] - w[0]) for w in windows if w[0] >= started and w[1] <= ended]
    outside = [w[2] / (w[1] - w[0]) for w in windows if w[1] <= started or w[0] >= ended]
    print(f"  {what} took {ended - started:.1f} s ({len(during)} windows of the loop in it)")
    return statistics.mean(during) / statistics.mean(outside)


def notice_ratio(store: Store, root: Path, size_mb: int) -> float:
    """Part 2: (trainer save + sync) / (trainer save + upload_file of each file)."""
    dim = 1024
    layers = max(1, round(size_mb / (3 * dim * dim * 4 / 2**20)))
    model = torch.nn.Sequential(*[torch.nn.Linear(dim, dim, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, dim)).sum().backward()
    optimizer.step()
    root.mkdir(parents=True)
    s3 = boto3.client("s3")
    committed_at: list[float] = []  # FolderSync says "kept" once the manifest is written
    sync = FolderSync(
        store, root, keep=2, say=lambda line: committed_at.append(time.perf_counter())
    )
    ours, theirs = [], []
    for step in (20, 30, 40):
        folder = root / f"checkpoint-{step}"
        folder.mkdir()
        started = time.perf_counter()
        torch.save(model.state_dict(), folder / "model.safetensors")
        torch.save(optimizer.state_dict(), folder / "optimizer.pt")
        (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
        saved_s = time.perf_counter() - started
        started = time.perf_counter()
        for file in sorted(folder.iterdir()):
            s3.upload_file(str(file), BUCKET, f"raw/{step}/{file.name}")
        theirs.append(saved_s + time.perf_counter() - started)
        started = time.perf_counter()
        (committed,) = sync.sync(finished=True)  # then retention, not part of the commit
        ours.append(saved_s + committed_at[-1] - started)
        print(
            f"  step {step}: save {saved_s:.1f} s; save + sync {ours[-1]:.1f} s "
            f"({committed.size_bytes / 2**20:.0f} MB); save + upload_file {theirs[-1]:.1f} s"
        )
    return statistics.median(o / t for o, t in zip(ours, theirs, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    try:
        with tempfile.TemporaryDirectory() as folder:
            store = Store.open(f"s3://{BUCKET}/run")
            root = Path(folder, "one")
            files = sorted(hf_folder(root, 10, args.size_mb).iterdir())
            sync = FolderSync(store, root, keep=2, say=print, settle_s=0.0, poll_s=0.05)

            def synced() -> None:  # the thread costguard run starts, until it has kept it
                sync.start()
                while not sync.kept:
                    time.sleep(0.05)
                sync.finish()

            ratio = steps_ratio(synced, "the sync")
            print(f"1. steps/s while a folder syncs / without: {ratio:.2f} (target >= 0.9)")
            s3 = boto3.client("s3")
            ratio = steps_ratio(
                lambda: [s3.upload_file(str(f), BUCKET, f"raw/{f.name}") for f in files],
                "upload_file of the same files",
            )
            print(f"   the same for boto3 upload_file (what any upload costs here): {ratio:.2f}")
            ratio = notice_ratio(store, Path(folder, "two"), args.size_mb)
            print(f"2. notice to committed / save + upload_file: {ratio:.2f} (target <= 1.2)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
