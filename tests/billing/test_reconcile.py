"""costguard spend --job: a launched job's estimate and its controller's running cost
next to what the export billed under its costguard:job tag (job.json written by the
launcher's own save_job, the export tests/billing/data/focus_handmade.csv)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from costguard.checkpoint.store import Store
from costguard.pricing.catalog import Catalog
from costguard.spot.job import Job, save_job
from costguard.spot.launcher.base import Handle
from costguard.spot.offers import find_offers
from costguard.spot.recovery import Attempt, AttemptOutcome
from tests.billing.test_focus import HANDMADE, groups, spend
from tests.spot.test_offers_and_job import spec


def launched(tmp_path: Path, catalog: Catalog, job_id: str) -> tuple[str, Decimal]:
    """A finished local job of one 2-hour attempt; its URL and its running cost."""
    store = Store.open(tmp_path / "ckpt")
    offer = find_offers(catalog, gpu="T4", provider="local")[0]
    attempt = Attempt(
        1,
        offer,
        1000.0,
        handle=Handle("local", offer.region, "local-1", extra={"pid": "1"}),
        ended_unix=1000.0 + 7200,
        outcome=AttemptOutcome.SUCCEEDED,
        exit_code=0,
    )
    save_job(store, Job(spec(store.url, job_id=job_id), attempts=(attempt,), status="succeeded"))
    return store.url, offer.usd_per_hour * 2


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
    assert any("Amazon Elastic Compute Cloud: 0.3817 charged" in g for g in document["gaps"])
    table = run_cli("spend", str(HANDMADE), "--job", url, "--by", "day")
    assert table.exit_code == 0, table.stderr
    assert "Job llama-ft:" in table.stdout
    assert "controller's running cost" in table.stdout
    assert "2026-10-30" in table.stdout  # the previous month's hour, without --month


def test_a_job_without_charges_in_the_export_is_refused(
    run_cli: Callable[..., Any], tmp_path: Path, catalog: Catalog
) -> None:
    url, _ = launched(tmp_path, catalog, "never-billed")
    result = run_cli("spend", str(HANDMADE), "--job", url)
    assert result.exit_code == 2
    assert "Error: the export has no charges tagged costguard:job=never-billed" in result.stderr
    assert "Hint: " in result.stderr
