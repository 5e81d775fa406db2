"""The bundled tables answer in the regions the clouds sell each GPU in: coverage is
measured against GCP's own lists of accelerator and machine types per region, and
AWS's list of instance types per region (``tests/unit/catalogue``, sources in its
SOURCES.md)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from costguard.pricing.tables import load_catalog

CATALOGUE = Path(__file__).parent / "catalogue"
#: GPUs attached to n1 machines: sold where the accelerator type is listed.
ATTACHED = {
    "nvidia-tesla-t4": "T4",
    "nvidia-tesla-p100": "P100",
    "nvidia-tesla-p4": "P4",
    "nvidia-tesla-v100": "V100",
}
#: GPUs that come inside a machine type: sold where the machine type is listed.
BUILT_IN = {
    "g2-standard-4": "L4",
    "a2-highgpu-1g": "A100",
    "a2-ultragpu-1g": "A100-80GB",
    "a3-highgpu-8g": "H100",
    "a3-edgegpu-8g": "H100",
    "a3-megagpu-8g": "H100-MEGA",
    "a3-ultragpu-8g": "H200",
    "a4-highgpu-8g": "B200",
}
THRESHOLD = 0.9
#: The GPUs below the threshold, with (regions priced, regions sold): no public price
#: source for the other regions was found (pricing/README.md, "GCP world rows"). Exact,
#: so a row added or lost moves a figure and this test with it.
SHORT = {
    "H100-MEGA": (11, 13),
    "H200": (7, 9),
    "B200": (3, 11),
}


def gcp_catalogue() -> dict[str, set[str]]:
    sold: dict[str, set[str]] = defaultdict(set)
    for name, mapping in (
        ("gcp-acceleratortyperegion.csv", ATTACHED),
        ("gcp-machinetyperegion.csv", BUILT_IN),
    ):
        lines = (CATALOGUE / name).read_text(encoding="utf-8").splitlines()
        for line in lines[1:]:
            fields = line.split(";")
            if fields[0] in mapping:
                sold[mapping[fields[0]]].add(fields[-1])
    return sold


def gcp_priced() -> dict[str, set[str]]:
    priced: dict[str, set[str]] = defaultdict(set)
    for row in load_catalog().instances:
        if row.provider == "gcp" and row.accelerator and row.ondemand_usd_per_hour:
            priced[row.accelerator].add(row.region)
    return priced


def test_every_gcp_gpu_is_priced_in_the_regions_gcp_sells_it_in() -> None:
    sold, priced = gcp_catalogue(), gcp_priced()
    assert set(sold) == set(ATTACHED.values()) | set(BUILT_IN.values())
    coverage = {gpu: (len(regions & priced[gpu]), len(regions)) for gpu, regions in sold.items()}
    assert {gpu: c for gpu, c in coverage.items() if c[0] < THRESHOLD * c[1]} == SHORT
    # No row claims a region where GCP does not sell that GPU.
    assert {gpu: priced[gpu] - regions for gpu, regions in sold.items()} == {
        gpu: set() for gpu in sold
    }
    covered = sum(c[0] for c in coverage.values())
    listed = sum(c[1] for c in coverage.values())
    assert (covered, listed) == (114, 128)  # 89% over every GPU and region (was 61%, 82%, 87%)


def test_estimate_l4_answers_in_every_gcp_region_that_sells_it(run_cli) -> None:
    run = run_cli(
        "estimate",
        "--gpu",
        "l4",
        "--provider",
        "gcp",
        "--hours",
        "1",
        "--top",
        "0",
        "--format",
        "json",
        "--no-stale-warning",
    )
    assert run.exit_code == 0, run.stderr
    regions = {option["region"] for option in json.loads(run.stdout)["options"]}
    assert regions == gcp_catalogue()["L4"]
    assert len(regions) >= 18


def test_every_aws_gpu_is_priced_in_the_regions_aws_sells_it_in() -> None:
    # AWS's list per instance type (instances.vantage.sh data of 2026-01-21; SOURCES.md).
    lines = (CATALOGUE / "aws-instancetyperegion.csv").read_text(encoding="utf-8").splitlines()
    sold_types = {(name, region) for name, region in (line.split(";") for line in lines[1:])}
    rows = [r for r in load_catalog().instances if r.provider == "aws" and r.accelerator]
    gpu = {r.instance_type: str(r.accelerator) for r in rows}
    sold: dict[str, set[str]] = defaultdict(set)
    for name, region in sold_types:
        sold[gpu[name]].add(region)
    priced: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        if row.ondemand_usd_per_hour or row.spot_usd_per_hour:
            priced[gpu[row.instance_type]].add(row.region)
    coverage = {g: (len(regions & priced[g]), len(regions)) for g, regions in sold.items()}
    assert {g: c for g, c in coverage.items() if c[0] < THRESHOLD * c[1]} == {}
    covered = sum(c[0] for c in coverage.values())
    listed = sum(c[1] for c in coverage.values())
    assert (covered, listed) == (222, 222)  # every GPU in every region AWS lists it in
    # Every type in every region too, and no on-demand price where AWS lists none (p5e is
    # sold as spot and capacity blocks only).
    assert {(r.instance_type, r.region) for r in rows if r.ondemand_usd_per_hour} == sold_types
