"""What checkpointing costs training, measured side by side in one run.

1. Training stall per save / the in-memory state copy alone (target <= 1.2). Also printed
   (Linux): the peak memory a local save adds, streamed as the Checkpointer writes it and
   serialised into memory first.
2. Save throughput to moto S3 / raw boto3 ``upload_file`` of the same bytes (target >= 0.8);
   restore / ``download_file`` (target >= 0.8), and / one plain ``get_object`` (moto serves
   ranged GETs slowly, so both baselines are printed). Each repeat runs the save between
   two ``upload_file`` runs of the same bytes and divides by their mean, so a machine
   that speeds up or slows down over a repeat slows both alike; the ratio is printed per
   repeat, beside the two baseline runs' own ratio (how far this machine moves a run
   against itself within a repeat: no ratio here is more exact than that). Every timed
   run starts after a short pause, so that none runs while the last is still freed.
   Each object but the checkpoints is deleted, untimed, once timed, so moto's memory
   stays flat; the checkpoint keeps every save (retention, which runs after a commit,
   deletes nothing inside a timed save). Also printed, against the same baselines: the
   store layer alone (``Store.put_hashed`` of the serialised bytes) and a save streamed
   by ``torch.save`` into ``Store.upload``; and where one save's time goes. The restores
   follow the saves, each next to the baselines' reads of the same bytes.
3. Steps/s of a small training loop while a background save runs / steps/s without
   (target >= 0.9), per save: the loop alone just before and just after each save.
4. Peak memory a restore adds / the state's size (target <= 0.5), from a local folder and
   from moto S3, beside plain ``torch.load`` and ``torch.load(mmap=True)`` of the same
   file (Linux). Each is measured in a fresh process that already holds the model and
   optimizer, as a resuming script does.

The state is a stack of Linear layers with AdamW moments, >= 512 MB in all. moto runs as a
separate process on loopback so its work does not share this process's GIL.

    python benchmarks/checkpoint.py [--size-mb 640] [--repeats 3] [--loop-repeats 9] [--only N]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO, Any, cast

import boto3
import torch

from costguard.checkpoint import Checkpointer
from costguard.checkpoint import state as state_mod
from costguard.checkpoint.store import Store

BUCKET = "bench-bucket"
#: A pause, untimed, before each timed S3 run: a run that starts while moto and the kernel
#: still free the last 600 MB runs slower (an upload_file right after a save took about
#: 25% longer than the one before it, without this pause).
SETTLE_S = 2.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=2):
                return process, url
        except OSError:
            time.sleep(0.2)
    process.kill()
    sys.exit("moto server did not start")


def big_state(size_mb: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Linear layers whose weights plus two AdamW moments come to about ``size_mb``."""
    dim = 2048
    per_layer_mb = 3 * (dim * dim + dim) * 4 / 2**20
    layers = max(1, round(size_mb / per_layer_mb))
    model = torch.nn.Sequential(*[torch.nn.Linear(dim, dim) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, dim)).sum().backward()
    optimizer.step()  # creates the moments
    return model, optimizer


def small_loop() -> Any:
    """A small training step (one thread), the work a save must not slow down."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(64, 256)

    def step() -> None:
        optimizer.zero_grad()
        model(batch).pow(2).mean().backward()
        optimizer.step()

    return step


def steps_per_second(step: Any, seconds: float) -> float:
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        step()
        done += 1
    return done / (time.perf_counter() - started)


def where_the_time_goes(store: Store, model: torch.nn.Module, optimizer: Any) -> str:
    """One save's steps timed one after the other, as the Checkpointer runs them."""
    copier = state_mod.CpuCopier()
    copier.copy(
        state_mod.capture(1, state_mod.TrainState(model=model, optimizer=optimizer))
    )  # warm
    times = {}
    started = time.perf_counter()
    snapshot = copier.copy(
        state_mod.capture(1, state_mod.TrainState(model=model, optimizer=optimizer))
    )
    times["copy"] = time.perf_counter() - started
    started = time.perf_counter()
    data = state_mod.serialise(snapshot)
    times["serialise"] = time.perf_counter() - started
    started = time.perf_counter()
    hashlib.sha256(data).hexdigest()
    times["sha256"] = time.perf_counter() - started
    started = time.perf_counter()
    store.put("where/state.pt", data)
    times["upload"] = time.perf_counter() - started
    store.delete(["where/state.pt"])
    total = sum(times.values())
    parts = ", ".join(f"{k} {v:.2f} s ({100 * v / total:.0f}%)" for k, v in times.items())
    return f"one save, step by step: {parts}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=640)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loop-repeats", type=int, default=9, help="saves timed in part 3")
    parser.add_argument(
        "--only", type=int, choices=(1, 2, 3, 4), help="run one measurement (default: all)"
    )
    parser.add_argument(
        "--restore-child", nargs=2, metavar=("HOW", "WHERE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.restore_child:
        how, where = args.restore_child
        restore_child(how, where, size_mb=args.size_mb)
        return
    process, endpoint = start_moto()
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        run(args.size_mb, args.repeats, args.only, args.loop_repeats)
    finally:
        process.terminate()
        process.wait(timeout=30)


def run(size_mb: int, repeats: int, only: int | None = None, loop_repeats: int = 9) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    model, optimizer = big_state(size_mb)
    payload = state_mod.serialise(
        state_mod.CpuCopier().copy(
            state_mod.capture(1, state_mod.TrainState(model=model, optimizer=optimizer))
        )
    )
    size = len(payload)
    print(f"state: {size / 2**20:.0f} MiB (model + AdamW moments), {repeats} repeats, medians")

    if only in (None, 1):
        measure_stall(model, optimizer, repeats)
    if only in (None, 2):
        measure_s3(s3, model, optimizer, payload, repeats)
    if only in (None, 3):
        measure_steps(model, optimizer, loop_repeats)
    if only in (None, 4) and Path("/proc/self/clear_refs").exists():
        measure_restore_memory(model, optimizer, size_mb)


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    msg = f"no {field} in /proc/self/status"
    raise RuntimeError(msg)


def restore_child(how: str, where: str, size_mb: int) -> None:
    """In a fresh process holding the model and optimizer: the peak memory (MiB) one
    restore adds, printed as the last line."""
    model, optimizer = big_state(size_mb)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _kib("VmRSS")
    if how == "costguard":
        with Checkpointer(where, check=False) as ckpt:
            assert ckpt.restore(model=model, optimizer=optimizer) > 0
    else:
        state = torch.load(where, map_location="cpu", weights_only=True, mmap=how == "mmap")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        del state
    print((_kib("VmHWM") - before) / 1024)


def measure_restore_memory(model: torch.nn.Module, optimizer: Any, size_mb: int) -> None:
    # 4. Restore memory: each way in its own process, so each peak is its own.
    def added(how: str, where: str) -> float:
        done = subprocess.run(
            [sys.executable, __file__, "--size-mb", str(size_mb), "--restore-child", how, where],
            capture_output=True,
            text=True,
            check=True,
        )
        return float(done.stdout.strip().splitlines()[-1])

    with tempfile.TemporaryDirectory() as folder:
        with Checkpointer(folder, keep_last=1) as ckpt:
            ckpt.save(0, model=model, optimizer=optimizer, block=True)
        with Checkpointer(f"s3://{BUCKET}/restore", keep_last=1) as ckpt:
            ckpt.save(0, model=model, optimizer=optimizer, block=True)
        payload = next(Path(folder).glob("ckpt-*/state.pt"))
        state_mib = payload.stat().st_size / 2**20
        figures = {
            "costguard, local": added("costguard", folder),
            "costguard, S3": added("costguard", f"s3://{BUCKET}/restore"),
            "torch.load": added("plain", str(payload)),
            "torch.load(mmap=True)": added("mmap", str(payload)),
        }
    shown = "; ".join(
        f"{name} {mib:.0f} MiB ({mib / state_mib:.2f})" for name, mib in figures.items()
    )
    print(f"4. restore peak added memory / state ({state_mib:.0f} MiB), target <= 0.5: {shown}")


def measure_stall(model: torch.nn.Module, optimizer: Any, repeats: int) -> None:
    # 1. Stall per save vs the copy alone (a local folder: the stall does not depend on it).
    copier = state_mod.CpuCopier()
    copier.copy(
        state_mod.capture(1, state_mod.TrainState(model=model, optimizer=optimizer))
    )  # warm buffers
    copy_s = []
    for _ in range(repeats):
        started = time.perf_counter()
        copier.copy(state_mod.capture(1, state_mod.TrainState(model=model, optimizer=optimizer)))
        copy_s.append(time.perf_counter() - started)
    with tempfile.TemporaryDirectory() as folder:
        ckpt = Checkpointer(folder, keep_last=1)
        stall_s = []
        for step in range(repeats + 1):
            future = ckpt.save(step, model=model, optimizer=optimizer)
            assert future is not None
            result = future.result()
            if step:  # the first save warms the copier's buffers
                stall_s.append(result.stall_s)
        ckpt.close()
    copy_med, stall_med = statistics.median(copy_s), statistics.median(stall_s)
    print(
        f"1. copy alone {copy_med:.3f} s; training blocked per save {stall_med:.3f} s; "
        f"ratio {stall_med / copy_med:.2f} (target <= 1.2)"
    )
    if Path("/proc/self/clear_refs").exists():
        print("   " + memory_per_save(model, optimizer))


def memory_per_save(model: torch.nn.Module, optimizer: Any) -> str:
    """Peak memory a local save adds to the process, beyond the CPU copy (Linux), as the
    Checkpointer writes it (streamed into the file) and serialised into memory first."""

    def kib(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        msg = f"no {field} in /proc/self/status"
        raise RuntimeError(msg)

    def peak_added(write: Any) -> float:
        # Writing 5 to clear_refs resets the peak resident size (VmHWM) to the current one.
        Path("/proc/self/clear_refs").write_text("5")
        before = kib("VmRSS")
        write()
        return (kib("VmHWM") - before) / 1024

    copier = state_mod.CpuCopier()
    snapshot = copier.copy(
        state_mod.capture(1, state_mod.TrainState(model=model, optimizer=optimizer))
    )
    with tempfile.TemporaryDirectory() as folder:
        store = Store.open(folder)
        streamed = peak_added(
            lambda: store.write_stream("a.pt", lambda f: state_mod.torch_save(snapshot, f))
        )
        buffered = peak_added(lambda: store.put_hashed("b.pt", state_mod.serialise(snapshot)))
    mib = sum(t.untyped_storage().nbytes() for t in _tensors(snapshot)) / 2**20
    return (
        f"peak memory a local save adds beyond the {mib:.0f} MiB copy: streamed into the file "
        f"{streamed:.0f} MiB; serialised in memory first {buffered:.0f} MiB"
    )


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def measure_s3(
    s3: Any, model: torch.nn.Module, optimizer: Any, payload: bytes | memoryview, repeats: int
) -> None:
    size = len(payload)
    # 2. Save and restore through moto S3 vs boto3 on the same bytes, interleaved.
    store = Store.open(f"s3://{BUCKET}/store")
    ckpt = Checkpointer(f"s3://{BUCKET}/run", keep_last=repeats + 1)
    upload_s, download_s, get_s, save_s, put_s, stream_s = [], [], [], [], [], []
    restore_s: list[float] = []
    self_s: list[float] = []  # upload_file before / after, in each repeat
    copier = state_mod.CpuCopier()
    with tempfile.TemporaryDirectory() as folder:
        raw = Path(folder) / "payload.bin"
        raw.write_bytes(payload)

        def baseline() -> float:
            time.sleep(SETTLE_S)
            started = time.perf_counter()
            s3.upload_file(str(raw), BUCKET, "raw/payload.bin")
            took = time.perf_counter() - started
            s3.delete_object(Bucket=BUCKET, Key="raw/payload.bin")  # moto's memory stays flat
            return took

        for i in range(repeats):
            before = baseline()
            time.sleep(SETTLE_S)
            started = time.perf_counter()
            future = ckpt.save(i, model=model, optimizer=optimizer)
            assert future is not None
            result = future.result()
            save_s.append(time.perf_counter() - started)
            assert result.ok, result.error
            after = baseline()
            upload_s.append((before + after) / 2)
            self_s.append(before / after)
            time.sleep(SETTLE_S)
            started = time.perf_counter()
            digest = store.put_hashed(f"put/{i}.bin", payload)
            put_s.append(time.perf_counter() - started)
            assert digest == hashlib.sha256(payload).hexdigest()
            store.delete([f"put/{i}.bin"])
            time.sleep(SETTLE_S)
            started = time.perf_counter()
            snapshot = copier.copy(
                state_mod.capture(1, state_mod.TrainState(model=model, optimizer=optimizer))
            )
            with store.upload(f"stream/{i}.pt") as upload:
                torch.save(snapshot, cast("IO[bytes]", upload))  # any .write() will do
            stream_s.append(time.perf_counter() - started)
            assert upload.size >= 0.99 * len(payload)
            del snapshot
            store.delete([f"stream/{i}.pt"])
        s3.upload_file(str(raw), BUCKET, "raw/payload.bin")  # for the restores' baselines

        # Restores, each next to download_file and get_object of the same bytes, in turns.
        def timed_download(_: int) -> None:
            started = time.perf_counter()
            s3.download_file(BUCKET, "raw/payload.bin", str(Path(folder) / "down.bin"))
            download_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            s3.get_object(Bucket=BUCKET, Key="raw/payload.bin")["Body"].read()
            get_s.append(time.perf_counter() - started)

        def timed_restore(_: int) -> None:
            reader = Checkpointer(f"s3://{BUCKET}/run", check=False)
            started = time.perf_counter()
            reader.restore(model=model, optimizer=optimizer)
            restore_s.append(time.perf_counter() - started)
            reader.close()

        for i in range(repeats):
            for read in (
                (timed_download, timed_restore) if i % 2 == 0 else (timed_restore, timed_download)
            ):
                read(i)
    ckpt.close()
    mb = size / 1e6
    up, save, put, stream = (statistics.median(x) for x in (upload_s, save_s, put_s, stream_s))
    down, get, restore = (statistics.median(x) for x in (download_s, get_s, restore_s))

    def paired(ours: list[float]) -> str:
        # Each repeat's upload_file ran around ours: the ratio per repeat, so that the
        # machine's drift over the run cancels out.
        ratios = sorted(u / o for u, o in zip(upload_s, ours, strict=True))
        return (
            f"ratio per repeat, median {statistics.median(ratios):.2f} "
            f"(range {ratios[0]:.2f}-{ratios[-1]:.2f})"
        )

    spread = sorted(self_s)

    print(
        f"2. save (copy+serialise+sha256+upload+manifest) {mb / save:.0f} MB/s; boto3 "
        f"upload_file {mb / up:.0f} MB/s; {paired(save_s)} (target >= 0.8)"
    )
    print(
        f"   upload_file against itself (before / after ours, same repeat): median "
        f"{statistics.median(spread):.2f} (range {spread[0]:.2f}-{spread[-1]:.2f})"
    )
    print(
        f"   store layer alone (Store.put_hashed: upload + sha256 in one pass) {mb / put:.0f} "
        f"MB/s; {paired(put_s)}"
    )
    print(
        f"   streamed (copy + torch.save into Store.upload: serialise, sha256 and upload "
        f"overlapped) {mb / stream:.0f} MB/s; {paired(stream_s)}"
    )
    print(
        f"   restore (download+verify+load) {mb / restore:.0f} MB/s; download_file "
        f"{mb / down:.0f} MB/s: ratio {down / restore:.2f} (target >= 0.8); one get_object "
        f"{mb / get:.0f} MB/s: ratio {get / restore:.2f}"
    )
    print("   " + where_the_time_goes(store, model, optimizer))


def measure_steps(model: torch.nn.Module, optimizer: Any, repeats: int) -> None:
    # 3. A small training loop's steps/s while the big state saves in the background.
    # The loop's own pace drifts by a quarter on a shared machine, so each save is
    # measured between two runs of the loop alone, right before and right after it, and
    # the ratio is taken per save: drift over the whole run cancels out.
    step = small_loop()
    steps_per_second(step, 1.0)  # warm up
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        ckpt = Checkpointer(folder, keep_last=1)
        ckpt.save(0, model=model, optimizer=optimizer, block=True)  # warm buffers
        for i in range(repeats):
            before = steps_per_second(step, 2.0)
            future = ckpt.save(i + 1, model=model, optimizer=optimizer)
            assert future is not None
            done, started = 0, time.perf_counter()
            while not future.done():
                step()
                done += 1
            during = done / (time.perf_counter() - started)
            assert future.result().ok
            after = steps_per_second(step, 2.0)
            rows.append((before, during, after))
        ckpt.close()
    ratios = sorted(during / ((before + after) / 2) for before, during, after in rows)
    alone = statistics.median(x for before, _, after in rows for x in (before, after))
    with_save = statistics.median(during for _, during, _ in rows)
    print(
        f"3. small loop alone {alone:.0f} steps/s; while a save runs {with_save:.0f} steps/s "
        f"(local folder); ratio per save, median {statistics.median(ratios):.2f} "
        f"of {len(ratios)} (range {ratios[0]:.2f}-{ratios[-1]:.2f}) (target >= 0.9); "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
