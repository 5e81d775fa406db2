"""Refresh throughput: a fixture catalogue of >= 50,000 price records from local servers.

Generates Azure Retail Prices items and GCP Compute Engine SKUs in the documented shapes
(most of them noise, as in the real catalogues: Windows and Low Priority meters,
commitments, other machine series and regions), serves them from the test suite's local
servers (Azure Retail Prices over HTTP, 1,000 items a page; the Cloud Billing Catalog
over gRPC, 5,000 SKUs a page, as the APIs page), and runs `costguard pricing refresh` in
a child process (the console script's entry point), so that its peak memory and CPU
time are its own. Both servers render each page once (the warm-up run), so the timed
runs measure the client; the median of the timed runs counts. Targets: >= 20,000
records/s for the whole command (process start to exit) and < 500 MB peak. The CPU time
of the refresh process is printed too: on a shared machine the wall clock also counts
the other processes' turns.

    python benchmarks/refresh.py [--azure-items 40000] [--gcp-skus 20000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The local servers and record builders are the test suite's (tests/refresh/servers.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.refresh.servers import (
    CatalogServer,
    Handler,
    LocalServer,
    Reply,
    Request,
    azure_item,
    azure_prices_handler,
    dumps,
    gcp_sku,
)

from costguard.pricing.refresh.parse_gcp import GCP_GPUS, gcp_series
from costguard.pricing.tables import load_catalog

MIN_RECORDS_PER_S = 20_000
MAX_PEAK_MB = 500
#: Runs the `costguard` console script's entry point with anonymous Google credentials
#: (the local catalog server asks for none).
CHILD = (
    "import sys\n"
    "from google.auth.credentials import AnonymousCredentials\n"
    "import costguard.clouds.gcp\n"
    "costguard.clouds.gcp.default_credentials = AnonymousCredentials\n"
    "from costguard.cli import main\n"
    "sys.argv[0] = 'costguard'\n"
    "main()\n"
)


def azure_catalogue(count: int, rng: random.Random) -> list[dict[str, Any]]:
    catalog = load_catalog()
    regions = sorted({r.name for r in catalog.regions if r.provider == "azure"})
    items: list[dict[str, Any]] = []
    for row in catalog.instances:
        if row.provider == "azure" and row.ondemand_usd_per_hour is not None:
            items.append(azure_item(row.instance_type, row.region, str(row.ondemand_usd_per_hour)))
            if row.spot_usd_per_hour is not None:
                spot = str(row.spot_usd_per_hour)
                items.append(azure_item(row.instance_type, row.region, spot, spot=True))
    while len(items) < count:
        region = rng.choice(regions)
        sku = f"Standard_X{rng.randrange(1, 2000)}s_v{rng.randrange(2, 7)}"
        usd = f"{rng.uniform(0.01, 40):.4f}"
        kind = rng.randrange(5)
        items.append(
            azure_item(
                sku,
                region,
                usd,
                spot=kind == 1,
                windows=kind == 2,
                low_priority=kind == 3,
                price_type="DevTestConsumption" if kind == 4 else "Consumption",
            )
        )
    return items


def gcp_catalogue(count: int, rng: random.Random) -> list[dict[str, Any]]:
    catalog = load_catalog()
    regions = sorted({r.name for r in catalog.regions if r.provider == "gcp"})
    skus: list[dict[str, Any]] = []
    series = {gcp_series(r.instance_type) for r in catalog.instances if r.provider == "gcp"}
    for name in sorted(s for s in series if s):
        for kind, unit in (("Core", "h"), ("Ram", "GiBy.h")):
            skus.append(
                gcp_sku(f"{name} {kind} running in Americas", "0.03", regions=regions, unit=unit)
            )
            skus.append(
                gcp_sku(
                    f"Spot Preemptible {name} {kind} running in Americas",
                    "0.007",
                    regions=regions,
                    unit=unit,
                    usage_type="Preemptible",
                )
            )
    for model in GCP_GPUS:
        skus.append(
            gcp_sku(f"Nvidia {model.title()} GPU running in Americas", "1.5", regions=regions)
        )
    while len(skus) < count:
        region = rng.choice(regions)
        usd = f"{rng.uniform(0.0001, 5):.6f}"
        noise = rng.randrange(4)
        description = (
            f"Commitment v1: Z{rng.randrange(99)} Cpu in {region} for 1 Year",
            f"Z{rng.randrange(99)} Instance Core running in {region}",
            f"Storage PD Capacity in {region} tier {rng.randrange(99)}",
            f"Network Inter Zone Egress from {region} {rng.randrange(999)}",
        )[noise]
        usage = "Commit1Yr" if noise == 0 else "OnDemand"
        skus.append(gcp_sku(description, usd, regions=[region], usage_type=usage))
    return skus


def rendered(handler: Handler) -> Handler:
    """Answers rendered once and kept, so the timed run measures the client, not the
    server's JSON encoding (which shares this machine's cores)."""
    answers: dict[tuple[str, tuple[tuple[str, str], ...]], Reply] = {}

    def handle(server: LocalServer, request: Request) -> Reply:
        key = (request.path, tuple(sorted(request.query.items())))
        if key not in answers:
            reply = handler(server, request)
            answers[key] = Reply(reply.status, dumps(reply.body), reply.headers)
        return answers[key]

    return handle


def run_refresh(command: list[str], env: dict[str, str]) -> tuple[float, float, dict[str, Any]]:
    """One refresh in a child process: wall seconds, CPU seconds (user + system), report."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"refresh failed ({done.returncode}):\n{done.stderr}")
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall_s, cpu_s, json.loads(done.stdout)


def records_of(report: dict[str, Any]) -> int:
    return sum(int(p["records"]) for p in report["providers"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--azure-items", type=int, default=40_000)
    parser.add_argument("--gcp-skus", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--runs", type=int, default=3, help="timed runs (the median counts)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    azure_items = azure_catalogue(args.azure_items, rng)
    gcp_skus = gcp_catalogue(args.gcp_skus, rng)
    azure = LocalServer(rendered(azure_prices_handler(azure_items, page_size=1000)))
    gcp = CatalogServer(gcp_skus, page_size=5000)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            # Bytecode is cached (in the scratch folder), as an installed package has it
            # compiled: the warm-up run compiles, the timed run does not.
            env = {
                **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
                "PYTHONPYCACHEPREFIX": str(Path(scratch) / "pycache"),
                "COSTGUARD_GCP_ENDPOINT": gcp.url,
                "COSTGUARD_AZURE_PRICES_ENDPOINT": azure.url,
                "COSTGUARD_CACHE_DIR": str(Path(scratch) / "unused"),
                "XDG_CONFIG_HOME": str(Path(scratch) / "config"),
            }
            command = [sys.executable, "-c", CHILD, "pricing", "refresh"]
            command += ["--provider", "gcp", "--provider", "azure"]
            command += ["--output", str(Path(scratch) / "pricing"), "--format", "json"]
            load = os.getloadavg()[0]
            run_refresh(command, env)  # renders every page once: the servers' warm-up
            runs = [run_refresh(command, env) for _ in range(max(args.runs, 1))]
    finally:
        azure.close()
        gcp.close()
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    wall_s, cpu_s, report = sorted(runs, key=lambda run: run[0])[len(runs) // 2]  # median
    records = records_of(report)
    print(
        f"catalogue: {len(azure_items):,} Azure items + {len(gcp_skus):,} GCP SKUs; "
        f"{os.cpu_count()} CPUs, load average {load:.1f} when it started"
    )
    best_s = min(run[0] for run in runs)
    print(
        f"timed runs (wall s): {', '.join(f'{run[0]:.2f}' for run in runs)} "
        f"(best {records / best_s:,.0f} records/s); the median:"
    )
    for p in report["providers"]:
        rate = p["records"] / p["seconds"] if p["seconds"] else 0
        print(
            f"  {p['provider']:<6} {p['records']:>7,} records in {p['seconds']:.2f} s "
            f"({rate:,.0f} records/s, side by side with the other), "
            f"{p['rows_updated']} table rows updated"
        )
    fetch_s = max(p["seconds"] for p in report["providers"])
    print(f"  fetch + parse, both providers: {fetch_s:.2f} s, {records / fetch_s:,.0f} records/s")
    rate = records / wall_s
    print(
        f"whole command (process start, imports, fetch, merge, write, exit): {wall_s:.2f} s, "
        f"{rate:,.0f} records/s"
    )
    print(
        f"  CPU time of the refresh process: {cpu_s:.2f} s, {records / cpu_s:,.0f} records per "
        "CPU-second (what a machine to itself would approach)"
    )
    print(f"peak memory (max RSS of the refresh process): {peak_mb:,.0f} MB")
    for name, ratio, met in (
        (
            f">= {MIN_RECORDS_PER_S:,} records/s (whole command)",
            rate / MIN_RECORDS_PER_S,
            rate >= MIN_RECORDS_PER_S,
        ),
        (f"< {MAX_PEAK_MB} MB peak", peak_mb / MAX_PEAK_MB, peak_mb < MAX_PEAK_MB),
    ):
        print(f"target {name}: {'met' if met else 'MISSED'} ({ratio:.2f}x the target)")


if __name__ == "__main__":
    main()
