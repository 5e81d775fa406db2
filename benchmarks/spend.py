"""`costguard spend --by job` over generated FOCUS exports (CSV.gz and Parquet), next to
DuckDB's exact ``DECIMAL`` GROUP BY of the same files, in one run.

The files hold ``--rows`` FOCUS 1.0 charges of 20,000 resources, in the columns AWS Data
Exports write (costs of up to 10 places; periods as ``YYYY-MM-DD HH:MM:SS`` text in the
CSV, timestamps in the Parquet; Tags a JSON object in the CSV, a map in the Parquet).
Each resource carries its own Name tag (20,000 distinct tag sets, as real exports have),
400 jobs' tags, and a fifth of the resources none. They are written once under
``--folder`` and reused.

Contenders, each in a process of its own, in turns, ``--runs`` times:

- ``costguard``: the CLI, ``costguard spend FILE --by job --format json``;
- ``duckdb``: DuckDB's GROUP BY of the job tag with costs cast to ``DECIMAL(38, 10)``
  (every amount has at most 10 places), printed as the same JSON groups;
- ``duckdb-engine`` (``--engine``): the embedded-DuckDB engine costguard could use
  instead of pyarrow, sketched: DuckDB sums per distinct Tags value, costguard's tag rule
  picks each one's job, Python adds the Decimals.

Every group's billed and effective sums must equal DuckDB's to the last digit, or the
run fails. Figures are medians of wall time, CPU time (all threads: steadier than wall on
a shared machine) and peak resident memory (``wait4``). Targets (issue 49): costguard's
wall and peak <= 1.5x DuckDB's, for each file.

Why costguard reads with pyarrow and not with an embedded DuckDB (measured here with
``--engine``): the sketch matches DuckDB on CSV.gz but groups the Parquet map by its key
and value lists at about 2x DuckDB's CPU; DuckDB turns a DOUBLE into a DECIMAL from its
binary value (``32.7726`` becomes ``32.772599999999995904``), not as the decimal the
export wrote, so a Parquet export would bill other amounts than its CSV twin; and the
amortised CUR figures, GCP credits and ``--job``'s reconciliation are pyarrow kernels a
second engine would have to repeat. DuckDB stays the yardstick.

    python benchmarks/spend.py [--rows 10000000] [--runs 3] [--folder /tmp/costguard-spend]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

CHUNK_ROWS = 500_000
JOBS = 400
RESOURCES = 20_000

#: What both DuckDB contenders start with: the file as a DuckDB source, costs exact.
SOURCE = """
import json, sys, duckdb
from decimal import Decimal
path = sys.argv[1]
duckdb.sql("SET enable_progress_bar = false")
if path.endswith(".parquet"):
    source = f"read_parquet('{path}')"
else:
    kinds = {"BilledCost": "DECIMAL(38, 10)", "EffectiveCost": "DECIMAL(38, 10)",
             "Tags": "VARCHAR"}
    source = f"read_csv('{path}', header = true, types = {kinds}, nullstr = 'NULL')"
sums = "sum(BilledCost::DECIMAL(38, 10)), sum(EffectiveCost::DECIMAL(38, 10))"
"""
DUCKDB = (
    SOURCE
    + """
parquet = path.endswith(".parquet")
job = "Tags['costguard:job']" if parquet else "json_extract_string(Tags, '$.\\"costguard:job\\"')"
rows = duckdb.sql(f"SELECT {job}, {sums} FROM {source} GROUP BY 1").fetchall()
print(json.dumps({k: [str(b), str(e)] for k, b, e in rows}))
"""
)
ENGINE = (
    SOURCE
    + """
from costguard.billing.spend import parse_tags, tag_value
from costguard.tags import JOB_TAG
tags = "map_keys(Tags), map_values(Tags)" if path.endswith(".parquet") else "Tags"
rows = duckdb.sql(f"SELECT {tags}, {sums} FROM {source} GROUP BY ALL").fetchall()
groups = {}
for *tag, billed, effective in rows:
    found = dict(zip(*tag)) if len(tag) == 2 and tag[0] else parse_tags(tag[0])
    group = groups.setdefault(tag_value(found or {}, JOB_TAG), [Decimal(0), Decimal(0)])
    group[0] += billed
    group[1] += effective
print(json.dumps({k: [str(b), str(e)] for k, (b, e) in groups.items()}))
"""
)


def generate(folder: Path, rows: int) -> tuple[Path, Path]:
    """Write ``rows`` FOCUS rows as Parquet and as CSV.gz, in chunks (memory bounded by
    a chunk), unless they are there already."""
    import gzip

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    parquet, csv_gz = folder / f"focus-{rows}.parquet", folder / f"focus-{rows}.csv.gz"
    if parquet.exists() and csv_gz.exists():
        return parquet, csv_gz
    random = np.random.default_rng(49)
    tagged = [r % 5 != 0 for r in range(RESOURCES)]
    pairs = [
        [("Name", f"node-{r:05d}")]
        + (
            [("costguard:job", f"job-{r % JOBS:03d}"), ("costguard:owner", f"u{r % 7}")]
            if tagged[r]
            else []
        )
        for r in range(RESOURCES)
    ]
    texts = pa.array([json.dumps(dict(p)) for p in pairs])
    maps = pa.array(pairs, pa.map_(pa.string(), pa.string()))
    ids = pa.array([f"i-{r:017x}" for r in range(RESOURCES)])
    start = np.datetime64("2026-11-01T00:00:00", "s")
    writer = None
    part_csv = csv_gz.with_suffix(".part")
    with gzip.open(part_csv, "wb", compresslevel=6) as text:
        for first in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - first)
            which = pa.array(random.integers(0, RESOURCES, n))
            units = random.integers(0, 10**10, n) * (random.random(n) < 0.5) + random.integers(
                0, 10**4, n
            )
            # As the exports write them: 10 places as text, the nearest double in Parquet.
            whole, part = np.divmod(units, 10**10)
            cost = pc.binary_join_element_wise(
                pc.cast(pa.array(whole), pa.string()),
                pc.utf8_lpad(pc.cast(pa.array(part), pa.string()), 10, "0"),
                ".",
            )
            day = start + random.integers(0, 30 * 24, n).astype("timedelta64[h]")
            columns = {
                "BilledCost": cost,
                "BillingCurrency": pa.array(["USD"] * n),
                "BillingPeriodStart": pa.array(np.full(n, start), pa.timestamp("s", "UTC")),
                "ChargeCategory": pa.array(["Usage"] * n),
                "ChargePeriodEnd": pa.array(day + np.timedelta64(1, "h"), pa.timestamp("s", "UTC")),
                "ChargePeriodStart": pa.array(day, pa.timestamp("s", "UTC")),
                "EffectiveCost": cost,
                "PricingQuantity": pa.array(np.ones(n)),
                "PricingUnit": pa.array(["Hours"] * n),
                "ResourceId": pc.take(ids, which),
                "ServiceName": pa.array(["Amazon Elastic Compute Cloud"] * n),
                "SubAccountId": pa.array(["111122223333"] * n),
            }
            floats = {k: pa.array(units / 10**10) for k in columns if "Cost" in k}
            table = pa.table({**columns, **floats, "Tags": pc.take(maps, which)})
            if writer is None:
                writer = pq.ParquetWriter(parquet.with_suffix(".part"), table.schema)
            writer.write_table(table)
            stamps = {
                k: pc.strftime(v, "%Y-%m-%d %H:%M:%S")
                for k, v in columns.items()
                if k.endswith(("Start", "End"))
            }
            written = pa.table({**columns, **stamps, "Tags": pc.take(texts, which)})
            sink = pa.BufferOutputStream()
            pcsv.write_csv(
                written, sink, pcsv.WriteOptions(include_header=first == 0, quoting_style="needed")
            )
            text.write(sink.getvalue().to_pybytes())
    assert writer is not None
    writer.close()
    parquet.with_suffix(".part").rename(parquet)
    part_csv.rename(csv_gz)
    return parquet, csv_gz


class Run(NamedTuple):
    wall: float
    cpu: float
    peak: int
    groups: dict[str | None, tuple[str, str]]


def timed(command: list[str]) -> Run:
    """Wall seconds, CPU seconds (all threads), peak resident bytes and the groups a
    contender printed."""
    began = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - began
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"failed ({os.waitstatus_to_exitcode(status)}): {' '.join(command)[:200]}")
    document = json.loads(output)
    if "groups" in document:  # costguard's --format json
        groups = {g["key"]: (g["billed_usd"], g["effective_usd"]) for g in document["groups"]}
    else:
        groups = {None if k == "null" else k: tuple(v) for k, v in document.items()}
    exact = {k: (_plain(v[0]), _plain(v[1])) for k, v in groups.items()}
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, exact)


def _plain(amount: str) -> str:
    """An exact amount's text without trailing zeros (DuckDB prints all its places)."""
    from decimal import Decimal

    text = f"{Decimal(amount).normalize():f}"
    return "0" if text in ("0", "-0") else text


def compare(path: Path, runs: int, engine: bool) -> None:
    """Time the contenders on ``path`` in turns; print medians and ratios."""
    python = sys.executable
    spend = [python, "-m", "costguard", "spend", str(path)]
    contenders = {
        "costguard": [*spend, "--by", "job", "--format", "json"],
        "duckdb": [python, "-c", DUCKDB, str(path)],
    }
    if engine:
        contenders["duckdb-engine"] = [python, "-c", ENGINE, str(path)]
    results: dict[str, list[Run]] = {name: [] for name in contenders}
    for _ in range(runs):
        for name, command in contenders.items():
            results[name].append(timed(command))
    reference = results["duckdb"][0].groups
    medians = {}
    print(f"{path.name} ({path.stat().st_size / 1e6:.0f} MB), {runs} run(s) each:")
    for name, done in results.items():
        wall = statistics.median(r.wall for r in done)
        cpu = statistics.median(r.cpu for r in done)
        peak = statistics.median(r.peak for r in done)
        medians[name] = (wall, cpu, peak)
        walls = ", ".join(f"{r.wall:.2f}" for r in done)
        exact = all(r.groups == reference for r in done)
        print(
            f"  {name:13s} wall {wall:6.2f} s ({walls})  cpu {cpu:6.2f} s  "
            f"peak {peak / 2**20:5.0f} MiB  {len(done[0].groups)} groups, "
            f"{'equal to DuckDB' if exact else 'NOT EQUAL to DuckDB'}"
        )
        if not exact:
            differ = [k for k in reference if done[0].groups.get(k) != reference[k]][:3]
            sys.exit(f"{name} differs from DuckDB on {differ}")
    for name in contenders:
        if name != "duckdb":
            wall, cpu, peak = (a / b for a, b in zip(medians[name], medians["duckdb"], strict=True))
            print(f"  {name} / duckdb: wall {wall:.2f}x, cpu {cpu:.2f}x, peak {peak:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/costguard-spend"))
    parser.add_argument("--only", choices=("csv", "parquet"), help="time one file only")
    parser.add_argument("--engine", action="store_true", help="also the duckdb-engine sketch")
    parser.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    if args.generate_only:
        generate(args.folder, args.rows)
        return
    began = time.perf_counter()
    # In a process of its own: a child forked from a big parent would report the
    # parent's resident memory as its own peak.
    command = [sys.executable, __file__, "--rows", str(args.rows), "--folder", str(args.folder)]
    subprocess.run([*command, "--generate-only"], check=True)
    parquet = args.folder / f"focus-{args.rows}.parquet"
    csv_gz = args.folder / f"focus-{args.rows}.csv.gz"
    print(f"files ready in {time.perf_counter() - began:.0f} s")
    for path in (csv_gz, parquet):
        if args.only is None or path.name.endswith(args.only if args.only == "parquet" else "gz"):
            compare(path, args.runs, args.engine)
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
