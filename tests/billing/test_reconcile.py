"""costguard spend --job: a launched job's estimate and its controller's running cost
next to what the export billed under its costguard:job tag (job.json written by the
launcher's own save_job, the export tests/billing/data/focus_handmade.csv)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from costguard.billing.exports import read_spend
from costguard.billing.spend import report
from costguard.checkpoint.store import Store
from costguard.pricing.catalog import Catalog
from costguard.spot.job import Job, save_job
from costguard.spot.launcher.base import Handle
from costguard.spot.offers import find_offers
from costguard.spot.recovery import Attempt, AttemptOutcome
from tests.billing.test_cur_gcp import GCP_JSONL, cur2_table
from tests.billing.test_focus import HANDMADE, groups, spend
from tests.spot.test_offers_and_job import spec


def launched(
    tmp_path: Path, catalog: Catalog, job_id: str, start: float = 1000.0, hours: int = 2
) -> tuple[str, Decimal]:
    """A finished local job of one attempt of ``hours`` from ``start``; its URL and its
    running cost."""
    store = Store.open(tmp_path / "ckpt")
    offer = find_offers(catalog, gpu="T4", provider="local")[0]
    attempt = Attempt(
        1,
        offer,
        start,
        handle=Handle("local", offer.region, "local-1", extra={"pid": "1"}),
        ended_unix=start + hours * 3600,
        outcome=AttemptOutcome.SUCCEEDED,
        exit_code=0,
    )
    save_job(store, Job(spec(store.url, job_id=job_id), attempts=(attempt,), status="succeeded"))
    return store.url, offer.usd_per_hour * hours


def test_a_jobs_bill_next_to_its_estimate_and_running_cost(
    run_cli: Callable[..., Any], tmp_path: Path, catalog: Catalog
) -> None:
    url, running = launched(tmp_path, catalog, "llama-ft")
    document = spend(run_cli, str(HANDMADE), "--job", url, "--month", "2026-11")
    assert document["job_id"] == "llama-ft"
    assert document["by"] == "service"
    # only the job's charges: two spot hours, its volume, one hour refunded
    assert groups(document) == {"Amazon Elastic Compute Cloud": Decimal("0.3817")}
    assert document["running_cost_usd"] == str(running.normalize())
    assert Decimal(document["gap_usd"]) == Decimal("0.3817") - running
    assert document["estimate_usd"] is not None
    assert "storage" in {g["kind"] for g in document["gaps"]}
    table = run_cli("spend", str(HANDMADE), "--job", url, "--by", "day")
    assert table.exit_code == 0, table.stderr
    assert "Job llama-ft:" in table.stdout
    assert "controller's running cost" in table.stdout
    assert "2026-10-30" in table.stdout  # the previous month's hour, without --month


def test_each_gap_between_the_bill_and_the_controllers_count_is_named(
    run_cli: Callable[..., Any], tmp_path: Path, catalog: Catalog
) -> None:
    """llama-ft ran 2026-11-03 10:00 to 2026-11-09 10:00 UTC (144 hours); the export has
    its two spot hours, its volume and one hour refunded, and charges to 2026-11-07 only.
    The gaps add up to the difference; the untagged charges of those days are beside it."""
    start = datetime(2026, 11, 3, 10, tzinfo=UTC).timestamp()
    url, running = launched(tmp_path, catalog, "llama-ft", start=start, hours=144)
    price = running / 144
    document = spend(run_cli, str(HANDMADE), "--job", url, "--month", "2026-11")
    gaps = {g["kind"]: Decimal(g["usd"]) for g in document["gaps"]}
    assert gaps == {
        # billed compute against the hours the export covers (to 2026-11-08 00:00: 110 h)
        "idle time or price changes": Decimal("0.6034") - 110 * price,
        "storage": Decimal("0.08"),  # the EBS volume
        "credit": Decimal("-0.3017"),  # the refunded hour
        "missing days": -34 * price,  # 2026-11-08 00:00 to 2026-11-09 10:00
        "untagged": Decimal("0.133"),  # the bucket (11-04) and Azure's untagged disk (11-07)
    }
    assert Decimal(document["gap_usd"]) == Decimal("0.3817") - running
    assert sum(v for k, v in gaps.items() if k != "untagged") == Decimal(document["gap_usd"])
    notes = {g["kind"]: g["note"] for g in document["gaps"]}
    assert "export's charges end on 2026-11-07, the job ran to 2026-11-09" in notes["missing days"]
    table = run_cli("spend", str(HANDMADE), "--job", url, "--month", "2026-11")
    assert table.exit_code == 0, table.stderr
    assert "storage: $0.08, disks, snapshots and buckets" in table.stdout


def test_jobs_status_spend_puts_the_bill_under_the_status(
    run_cli: Callable[..., Any], tmp_path: Path, catalog: Catalog
) -> None:
    url, _ = launched(tmp_path, catalog, "llama-ft")
    result = run_cli("jobs", "status", url, "--spend", str(HANDMADE))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.index("job llama-ft: succeeded") < result.stdout.index("Job llama-ft:")
    assert "billed under its tag: $0.68" in result.stdout  # October's hour too
    assert "storage: $0.08" in result.stdout
    refused = run_cli("jobs", "status", url, "--spend", str(HANDMADE), "--format", "json")
    assert refused.exit_code == 2
    assert f"Hint: costguard spend EXPORT --job {url} --format json" in refused.stderr


def test_a_job_without_charges_in_the_export_is_refused(
    run_cli: Callable[..., Any], tmp_path: Path, catalog: Catalog
) -> None:
    url, _ = launched(tmp_path, catalog, "never-billed")
    result = run_cli("spend", str(HANDMADE), "--job", url)
    assert result.exit_code == 2
    assert "Error: the export has no charges tagged costguard:job=never-billed" in result.stderr
    assert "Hint: " in result.stderr


def test_what_each_charge_is_in_cur_and_gcp_exports(tmp_path: Path) -> None:
    """The kinds a reconciliation names, from CUR 2.0's line item types and product codes
    and from the GCP export's cost type, service and SKU (credits count with their charge)."""
    cur2 = tmp_path / "cur2.parquet"
    pq.write_table(cur2_table(), cur2)
    cur = report(read_spend([str(cur2)], "charge"), "charge")
    assert {g.key: g.billed_usd for g in cur.groups} == {
        "compute": Decimal("34.0786"),  # usage, the savings plan's covered hour, RI usage
        "commitment": Decimal("150.2274"),  # the plan's negation and fee, the RI fees
        "tax": Decimal("4.12"),
        "credit": Decimal(-25),
    }
    gcp = report(read_spend([str(GCP_JSONL)], "charge"), "charge")
    assert {g.key: g.billed_usd for g in gcp.groups} == {
        "compute": Decimal("0.823"),  # the L4 hours, core and ram, less their credits
        "tax": Decimal("0.31"),
        "storage": Decimal("0.026"),  # the bucket; the balanced PD's credit cancels it
    }
