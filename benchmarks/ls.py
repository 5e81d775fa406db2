"""`costguard checkpoint ls` on a store of many checkpoint folders: its time and memory.

Writes ``--folders`` complete checkpoints (a small payload and its manifest each, as a
save writes them) into a temporary local folder, then runs ``costguard checkpoint ls`` on
it in a fresh process, as a user would, and prints its wall time, its CPU time (user +
system: what the machine's load does not change) and its peak resident memory.

Target (issue 28): 20,000 folders under 5 s and 200 MB. Before: 22 s.

    python benchmarks/ls.py [--folders 20000]
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_folders(root: Path, count: int) -> None:
    from costguard.checkpoint.manifest import MANIFEST_FILE, Manifest, ObjectEntry
    from costguard.checkpoint.manifest import checkpoint_name as name_of

    payload = b"\x00" * 64
    entry = ObjectEntry("state.pt", len(payload), hashlib.sha256(payload).hexdigest())
    for step in range(count):
        name = name_of(step, f"{step:08x}")
        folder = root / name
        folder.mkdir()
        (folder / "state.pt").write_bytes(payload)
        (folder / MANIFEST_FILE).write_text(Manifest(name, step, 1.0e9 + step, (entry,)).to_json())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folders", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="costguard-ls-") as tmp:
        root = Path(tmp) / "ckpt"
        root.mkdir()
        write_folders(root, args.folders)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "costguard", "checkpoint", "ls", str(root)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = done.stdout.count("complete")
    print(f"checkpoint ls, {args.folders} folders ({lines} listed complete):")
    print(f"  wall {wall:.2f} s, cpu {cpu:.2f} s, peak memory {after.ru_maxrss / 1024:.0f} MB")
    print("  target: under 5 s and 200 MB")


if __name__ == "__main__":
    main()
