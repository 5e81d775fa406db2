"""What ``costguard run --sync-dir`` costs training, and how soon a notice's checkpoint is
committed, in one run.

1. Steps/s of a small training loop (its own process, one thread, as the trainer runs
   beside ``costguard run``) while a SIZE MB Hugging Face checkpoint folder is uploaded to
   moto S3 by :class:`~costguard.checkpoint.foldersync.FolderSync` / steps/s in the same
   run while nothing is uploaded (target >= 0.95); beside it, the same ratio for boto3
   ``upload_file`` of the same files (what any upload costs on this machine). Beside
   each, the CPU seconds the upload took (this process and moto): on a shared machine
   the ratio moves with everyone's load, the CPU seconds much less.
2. Notice to committed: the trainer's own save of a SIZE MB state into ``checkpoint-N/``
   plus the sync of that folder up to its manifest (files, sha256, manifest; retention
   comes after the commit) / the same save plus one boto3 ``upload_file`` of each of its
   files (target <= 1.2).
3. Restore on a new machine: a SIZE MB folder of sharded weights (as a big model's
   Trainer writes it) put back from moto S3 with its files read one after another, then
   ``RESTORE_READS`` at a time (the default), alternating, each verified; the serial time /
   the parallel one. moto is given back nice 0 first where this process may.

4. Start-up: ``costguard run --checkpoint DIR --sync-dir DIR -- python -c ...`` to the
   script's first line, less the same script started alone, alternating (target <= 0.5 s).
5. Save to store: a sync started as ``costguard run`` starts it (file system events, the
   default settle and poll); a save written file by file, its ``trainer_state.json`` last;
   the time from that last write to the manifest in the store, less the upload itself
   (the "kept ... s" the sync says) (target <= 2 s).

moto runs as a separate process on loopback (benchmarks/checkpoint.py's), at
``--moto-nice`` (default 19): in real use the store's own work is not done on the training
machine, and here it must not take the cores from the training loop that part 1 measures
(both uploads, costguard's and boto3's, meet the same server). The results end with one
table: each ratio beside its baseline's and its target, with the machine's load average
(a shared machine moves every figure).

    python benchmarks/foldersync.py [--size-mb 500] [--repeats 3] [--moto-nice 19]
        [--parts 1,2,3,4,5]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import torch

from checkpoint import start_moto  # benchmarks/checkpoint.py
from costguard.checkpoint.foldersync import RESTORE_READS, FolderSync
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


def hf_folder(root: Path, step: int, size_mb: int, shards: int = 1) -> Path:
    """A checkpoint folder as the Trainer leaves it: weights (a third, in ``shards``
    files), optimizer, state file."""
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    weights = [("model.safetensors", size_mb // 3)] if shards == 1 else [
        (f"model-{i:05d}-of-{shards:05d}.safetensors", size_mb // 3 // shards)
        for i in range(1, shards + 1)
    ]  # fmt: skip
    for name, megabytes in (*weights, ("optimizer.pt", size_mb * 2 // 3)):
        with (folder / name).open("wb") as file:
            if name.endswith(".safetensors"):  # a whole one: one uint8 tensor of it all
                size = megabytes * 2**20
                header = f'{{"w":{{"dtype":"U8","shape":[{size}],"data_offsets":[0,{size}]}}}}'
                file.write(len(header).to_bytes(8, "little") + header.encode())
            for _ in range(megabytes):
                file.write(os.urandom(2**20))
    (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    return folder


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far, every thread (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def steps_ratio(upload: Callable[[], object], what: str, moto: int) -> tuple[float, float]:
    """One loop: steps/s of the loop while ``upload()`` runs / steps/s before and after;
    and the CPU seconds the upload took, here and in moto (process ``moto``): unlike the
    ratio, what a shared machine's load does not move."""
    loop = subprocess.Popen(
        [sys.executable, "-c", LOOP, "120"], stdout=subprocess.PIPE, text=True, bufsize=1
    )
    assert loop.stdout is not None
    windows = [tuple(map(float, loop.stdout.readline().split())) for _ in range(12)]
    started, cpu = time.time(), cpu_seconds(os.getpid()) + cpu_seconds(moto)
    uploading = threading.Thread(target=upload)
    uploading.start()
    while uploading.is_alive():
        windows.append(tuple(map(float, loop.stdout.readline().split())))
    ended, cpu = time.time(), cpu_seconds(os.getpid()) + cpu_seconds(moto) - cpu
    windows += [tuple(map(float, loop.stdout.readline().split())) for _ in range(12)]
    loop.kill()
    loop.wait()
    during = [w[2] / (w[1] - w[0]) for w in windows if w[0] >= started and w[1] <= ended]
    outside = [w[2] / (w[1] - w[0]) for w in windows if w[1] <= started or w[0] >= ended]
    print(
        f"  {what} took {ended - started:.1f} s, {cpu:.1f} CPU s with moto's "
        f"({len(during)} windows of the loop in it)"
    )
    return statistics.mean(during) / statistics.mean(outside), cpu


def notice_times(
    store: Store, root: Path, size_mb: int, repeats: int, moto: int
) -> tuple[list[float], list[float]]:
    """Part 2: trainer save + sync, and trainer save + upload_file of each file, in
    seconds, one pair a repeat (the pair runs back to back: its ratio is the figure);
    each upload's CPU seconds (here and in moto, process ``moto``) printed beside."""
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
    for step in range(20, 20 + 10 * repeats, 10):
        folder = root / f"checkpoint-{step}"
        folder.mkdir()
        started = time.perf_counter()
        torch.save(model.state_dict(), folder / "model.safetensors")
        torch.save(optimizer.state_dict(), folder / "optimizer.pt")
        (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
        saved_s = time.perf_counter() - started
        started, cpu = time.perf_counter(), cpu_seconds(os.getpid()) + cpu_seconds(moto)
        for file in sorted(folder.iterdir()):
            s3.upload_file(str(file), BUCKET, f"raw/{step}/{file.name}")
        theirs.append(saved_s + time.perf_counter() - started)
        their_cpu = cpu_seconds(os.getpid()) + cpu_seconds(moto) - cpu
        forget_raw(s3)
        started, cpu = time.perf_counter(), cpu_seconds(os.getpid()) + cpu_seconds(moto)
        (committed,) = sync.sync(finished=True)  # then retention, not part of the commit
        ours.append(saved_s + committed_at[-1] - started)
        our_cpu = cpu_seconds(os.getpid()) + cpu_seconds(moto) - cpu  # retention's too
        print(
            f"  step {step}: save {saved_s:.1f} s; save + sync {ours[-1]:.1f} s, "
            f"{our_cpu:.1f} CPU s ({committed.size_bytes / 2**20:.0f} MB); "
            f"save + upload_file {theirs[-1]:.1f} s, {their_cpu:.1f} CPU s"
        )
    return ours, theirs


def restore_times(
    store: Store, folder: Path, size_mb: int, repeats: int
) -> tuple[list[float], list[float]]:
    """Part 3: seconds to put a sharded folder back, files one at a time and
    ``RESTORE_READS`` at a time, alternating (one pair a repeat)."""
    source = folder / "three"
    hf_folder(source, 30, size_mb, shards=4)
    (kept,) = FolderSync(store, source, keep=1, say=print).sync(finished=True)
    print(f"  {len(kept.objects)} files, {kept.size_bytes / 2**20:.0f} MB")
    shutil.rmtree(source)
    serial: list[float] = []
    parallel: list[float] = []
    for repeat in range(repeats):
        for reads, times in ((1, serial), (RESTORE_READS, parallel)):
            target = folder / f"restored-{repeat}-{reads}"
            sync = FolderSync(store, target, keep=1, say=lambda line: None, restore_reads=reads)
            started = time.perf_counter()
            (restored,) = sync.prepare()
            times.append(time.perf_counter() - started)
            assert restored.name == kept.name
            shutil.rmtree(target)
        print(f"  repeat {repeat + 1}: one at a time {serial[-1]:.1f} s, "
              f"{RESTORE_READS} at a time {parallel[-1]:.1f} s")  # fmt: skip
    return serial, parallel


STARTED = "import time; print(time.time(), flush=True)"


def startup_times(folder: Path, repeats: int) -> tuple[list[float], list[float]]:
    """Part 4: seconds from starting ``costguard run`` to the script's first line, and
    from starting the script alone to it; alternating, one pair a repeat."""
    costguard = Path(sys.executable).with_name("costguard")
    ours: list[float] = []
    alone: list[float] = []
    for repeat in range(repeats):
        for times, command in (
            (alone, [sys.executable, "-c", STARTED]),
            (ours, [str(costguard), "run", "--checkpoint", str(folder / "store"),
                    "--sync-dir", str(folder / f"out-{repeat}"), "--",
                    sys.executable, "-c", STARTED]),
        ):  # fmt: skip
            started = time.time()
            child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
            assert child.stdout is not None
            times.append(float(child.stdout.readline()) - started)
            child.wait()
        print(f"  repeat {repeat + 1}: costguard run {ours[-1]:.2f} s, alone {alone[-1]:.2f} s")
    return ours, alone


def save_to_store(store: Store, root: Path, size_mb: int, repeats: int) -> list[float]:
    """Part 5: per save, seconds from its last file written to its manifest in the store,
    less the upload (what the sync's "kept" line says it took)."""
    said: list[tuple[float, str]] = []
    sync = FolderSync(store, root, keep=2, say=lambda line: said.append((time.time(), line)))
    sync.prepare()
    sync.start()
    latencies = []
    try:
        for step in range(10, 10 + 10 * repeats, 10):
            folder = hf_folder(root.parent / "writing", step, size_mb)  # beside the folder
            state = folder / "trainer_state.json"
            state.unlink()
            target = root / folder.name
            folder.rename(target)
            (target / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
            written = time.time()
            while not any(f"kept {target.name} " in line for _, line in said):
                time.sleep(0.01)
            at, line = next((t, x) for t, x in said if f"kept {target.name} " in x)
            upload_s = float(line.split(" bytes, ")[1].split(" s)")[0])
            latencies.append(at - written - upload_s)
            print(f"  step {step}: {at - written:.2f} s to the store, upload {upload_s:.1f} s")
    finally:
        sync.finish()
    return latencies


def moto_nice_for_restore(pid: int) -> int:
    """Give moto's main thread (whose request threads inherit it) nice 0 where this may
    (raising a priority needs privileges); its nice value now."""
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, pid, 0)
    return os.getpriority(os.PRIO_PROCESS, pid)


def forget_raw(s3: Any) -> None:
    """Delete the baseline's objects (moto keeps every byte in memory)."""
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="raw/"):
        for item in page.get("Contents", []):
            s3.delete_object(Bucket=BUCKET, Key=item["Key"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3, help="of each measurement")
    parser.add_argument("--moto-nice", type=int, default=19, help="moto's priority (0..19)")
    parser.add_argument("--parts", default="1,2,3,4,5", help="which parts to run, e.g. 3")
    args = parser.parse_args()
    torch.set_num_threads(1)
    process, endpoint = start_moto()
    # Linux nice is per thread: moto's request threads, started from now on by its main
    # thread, inherit this.
    os.setpriority(os.PRIO_PROCESS, process.pid, args.moto_nice)
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    try:
        with tempfile.TemporaryDirectory() as folder:
            parts = {int(p) for p in args.parts.split(",")}
            run(Path(folder), args.size_mb, args.repeats, (process.pid, args.moto_nice), parts)
    finally:
        process.terminate()
        process.wait(timeout=30)


def steps_ratios(
    store: Store, folder: Path, size_mb: int, repeats: int, moto: int
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Part 1, each repeat: the loop's ratio (and the CPU seconds) beside the sync, then
    beside upload_file."""
    s3 = boto3.client("s3")
    ours, theirs = [], []
    for repeat in range(repeats):
        root = folder / f"one-{repeat}"
        files = sorted(hf_folder(root, 10, size_mb).iterdir())
        sync = FolderSync(store, root, keep=2, say=print, settle_s=0.0, poll_s=0.05)

        def synced(sync: FolderSync = sync) -> None:  # costguard run's thread, until kept
            sync.start()
            while not sync.kept:
                time.sleep(0.05)
            sync.finish()

        def uploaded(files: list[Path] = files, repeat: int = repeat) -> None:
            for file in files:
                s3.upload_file(str(file), BUCKET, f"raw/{repeat}/{file.name}")

        print(f"part 1, repeat {repeat + 1} of {repeats}:")
        ours.append(steps_ratio(synced, "the sync", moto))
        theirs.append(steps_ratio(uploaded, "upload_file of the same files", moto))
        forget_raw(s3)  # untimed: moto's memory stays flat
        shutil.rmtree(root)
    return ours, theirs


def run(folder: Path, size_mb: int, repeats: int, moto: tuple[int, int], parts: set[int]) -> None:
    """The parts asked for, then the table; ``moto``: its process id and nice value."""
    store = Store.open(f"s3://{BUCKET}/run")
    # As costguard run does before the script starts: this thread's first call starts
    # fsspec's IO thread, at this thread's priority (not the sync thread's).
    store.check_writable()
    rows = [("", "costguard", "baseline", "target", "")]
    details = []
    if 1 in parts:
        ours, theirs = steps_ratios(store, folder, size_mb, repeats, moto[0])
        steps = statistics.median(r for r, _ in ours)
        rows += [
            ("1. steps/s while uploading / without", f"{steps:.2f}",
             f"{statistics.median(r for r, _ in theirs):.2f}", ">= 0.95",
             "ok" if steps >= 0.95 else "MISSED"),
            ("   CPU s of the upload, with moto's", f"{statistics.median(c for _, c in ours):.1f}",
             f"{statistics.median(c for _, c in theirs):.1f}", "", ""),
        ]  # fmt: skip
        details += [("part 1 per repeat, costguard", [r for r, _ in ours]),
                    ("part 1, upload_file", [r for r, _ in theirs])]  # fmt: skip
    if 2 in parts:
        print("part 2:")
        synced_s, uploaded_s = notice_times(store, folder / "two", size_mb, repeats, moto[0])
        pairs = [o / t for o, t in zip(synced_s, uploaded_s, strict=True)]
        notice = statistics.median(pairs)
        rows += [
            ("2. notice to committed, s", f"{statistics.median(synced_s):.1f}",
             f"{statistics.median(uploaded_s):.1f}", "", ""),
            ("   / save + upload_file, paired", f"{notice:.2f}", "", "<= 1.20",
             "ok" if notice <= 1.2 else "MISSED"),
        ]  # fmt: skip
        details.append(("part 2 per repeat, the pair's ratio", pairs))
    if 3 in parts:
        # A restore runs before the script starts: no loop beside it to protect, and a
        # real store serves at its own speed. A starved moto serves parallel reads slower.
        print(f"part 3 (moto at nice {moto_nice_for_restore(moto[0])}):")
        restores = Store.open(f"s3://{BUCKET}/restore")  # its own newest checkpoint
        serial, parallel = restore_times(restores, folder, size_mb, repeats)
        speedups = [a / b for a, b in zip(serial, parallel, strict=True)]
        rows += [
            (f"3. restore, {RESTORE_READS} reads at once / 1, s",
             f"{statistics.median(parallel):.1f}", f"{statistics.median(serial):.1f}", "", ""),
            ("   one at a time / at once, paired", f"{statistics.median(speedups):.2f}",
             "", "", ""),
        ]  # fmt: skip
        details.append(("part 3 per repeat, speed-up", speedups))
    if 4 in parts:
        print("part 4:")
        ours_s, alone_s = startup_times(folder / "four", repeats)
        extra = statistics.median(o - a for o, a in zip(ours_s, alone_s, strict=True))
        rows += [
            ("4. costguard run to the script, s", f"{statistics.median(ours_s):.2f}",
             f"{statistics.median(alone_s):.2f}", "", ""),
            ("   costguard's own, paired, s", f"{extra:.2f}", "", "<= 0.50",
             "ok" if extra <= 0.5 else "MISSED"),
        ]  # fmt: skip
    if 5 in parts:
        print("part 5:")
        # Its own prefix: a sync starts by putting back its store's newest checkpoint,
        # and parts 1-2 leave theirs in the shared one.
        saves = Store.open(f"s3://{BUCKET}/five")
        latencies = save_to_store(saves, folder / "five", size_mb, repeats)
        latency = statistics.median(latencies)
        rows += [
            ("5. save done to store, less upload, s", f"{latency:.2f}", "", "<= 2.0",
             "ok" if latency <= 2.0 else "MISSED"),
        ]  # fmt: skip
        details.append(("part 5 per save, s", latencies))
    load = os.getloadavg()[0]
    print(
        f"\n{size_mb} MB folder, medians of {repeats}; moto at nice {moto[1]} for parts 1-2; "
        f"{os.cpu_count()} CPUs, load average {load:.1f} during the run's last minute"
    )
    for name, *cells in rows:
        print(f"{name:<38}" + "".join(f"{cell:>13}" for cell in cells))
    for name, values in details:
        print(f"   {name}: " + " ".join(f"{r:.3f}" for r in values))


if __name__ == "__main__":
    main()
