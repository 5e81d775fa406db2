"""`costguard spend --by job` over a generated FOCUS Parquet export, next to DuckDB's
GROUP BY of the same file, in one run.

The file has the FOCUS 1.0 columns AWS Data Exports write (costs as double, periods as
timestamps, Tags as a map), 400 jobs and a fifth of the rows untagged. Each contender
runs in its own process, in turns, ``--runs`` times; the figures are medians of wall time,
CPU time (all threads: steadier than wall on a shared machine) and peak resident memory
(``wait4``). Targets (issue 31): costguard's wall <= 1.5x DuckDB's and its peak <= 1 GB.
DuckDB sums the doubles as floats; costguard sums exact decimals.

    python benchmarks/spend.py [--rows 10000000] [--runs 3] [--folder /tmp/costguard-spend]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

CHUNK_ROWS = 1_000_000
JOBS = 400

OURS = """
import sys
from costguard.billing.exports import read_spend
from costguard.billing.spend import report
spend = report(read_spend([sys.argv[1]], "job"), "job")
print(len(spend.groups), spend.total_billed_usd)
"""
DUCKDB = """
import sys, duckdb
duckdb.sql("SET enable_progress_bar = false")
rows = duckdb.sql(
    "SELECT Tags['costguard:job'] AS job, sum(BilledCost), sum(EffectiveCost) "
    f"FROM read_parquet('{sys.argv[1]}') GROUP BY 1"
).fetchall()
print(len(rows), sum(r[1] for r in rows))
"""


def generate(path: Path, rows: int) -> None:
    """Write ``rows`` FOCUS rows in chunks (memory bounded by a chunk)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    random = np.random.default_rng(31)
    tags_type = pa.map_(pa.string(), pa.string())
    jobs = [f"job-{i:03d}" for i in range(JOBS)]
    start = np.datetime64("2026-11-01T00:00:00", "ms")
    writer = None
    try:
        for first in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - first)
            which = random.integers(0, JOBS + JOBS // 4, n)
            tags = [
                [("costguard:job", jobs[j]), ("costguard:owner", f"u{j % 7}")] if j < JOBS else []
                for j in which.tolist()
            ]
            billed = np.round(random.exponential(0.4, n), 10)
            hours = random.integers(0, 30 * 24, n).astype("timedelta64[h]")
            table = pa.table(
                {
                    "BilledCost": billed,
                    "EffectiveCost": billed,
                    "BillingCurrency": pa.array(["USD"] * n),
                    "BillingPeriodStart": pa.array(np.full(n, start), pa.timestamp("ms", "UTC")),
                    "ChargePeriodStart": pa.array(start + hours, pa.timestamp("ms", "UTC")),
                    "ServiceName": pa.array(["Amazon Elastic Compute Cloud"] * n),
                    "SubAccountId": pa.array(["111122223333"] * n),
                    "Tags": pa.array(tags, tags_type),
                }
            )
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()


class Run(NamedTuple):
    wall: float
    cpu: float
    peak: int
    output: str


def timed(code: str, path: Path) -> Run:
    """Wall seconds, CPU seconds (all threads), peak resident bytes and output of
    ``python -c code path``."""
    began = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - began
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        sys.exit(f"failed ({child.returncode}): {code.strip().splitlines()[-1]}")
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, output.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/costguard-spend"))
    parser.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    path = args.folder / f"focus-{args.rows}.parquet"
    if args.generate_only:
        generate(path, args.rows)
        return
    if not path.exists():
        # In a process of its own: a child forked from a big parent would report the
        # parent's resident memory as its own peak.
        began = time.perf_counter()
        command = [sys.executable, __file__, "--rows", str(args.rows), "--folder", str(args.folder)]
        subprocess.run([*command, "--generate-only"], check=True)
        print(
            f"generated {path} ({path.stat().st_size / 1e6:.0f} MB) "
            f"in {time.perf_counter() - began:.0f} s"
        )
    results: dict[str, list[Run]] = {"costguard": [], "duckdb": []}
    for _ in range(args.runs):
        results["costguard"].append(timed(OURS, path))
        results["duckdb"].append(timed(DUCKDB, path))
    medians = {}
    for name, runs in results.items():
        wall = statistics.median(r.wall for r in runs)
        cpu = statistics.median(r.cpu for r in runs)
        peak = statistics.median(r.peak for r in runs)
        medians[name] = (wall, cpu, peak)
        print(
            f"{name:10s} wall {wall:7.2f} s  cpu {cpu:7.2f} s  peak {peak / 2**20:7.0f} MiB"
            f"  -> {runs[0].output}"
        )
    ratio = medians["costguard"][0] / medians["duckdb"][0]
    cpu_ratio = medians["costguard"][1] / medians["duckdb"][1]
    peak_gb = medians["costguard"][2] / 1e9
    print(
        f"costguard / duckdb wall: {ratio:.2f}x (target <= 1.5x), cpu {cpu_ratio:.2f}x; "
        f"costguard peak {peak_gb:.2f} GB (target <= 1 GB); {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
