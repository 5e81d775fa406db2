"""costguard spend --job: a launched job's estimate and its controller's running cost
next to what the export billed under its costguard:job tag (job.json written by the
launcher's own save_job, the export tests/billing/data/focus_handmade.csv)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

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
        # the bucket (11-04) in the job's AWS account; not Azure's untagged disk (11-07)
        "untagged": Decimal("0.023"),
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


#: One job's instance-hours as a bill shows them, in account 111122223333: an attempt ran
#: 2026-11-05 10:00 to 13:00 UTC; the instance was billed from 10:00 to 14:30 (left up 1.5
#: hours after the attempt ended, billed by the second), and the spot price moved at 12:00.
#: Account 444455556666, in the same export, has untagged charges the same day.
JOB_ACCOUNT, OTHER_ACCOUNT = "111122223333", "444455556666"
PRICE_MOVE = Decimal("0.0123")


def bill_row(
    at: int, hours: str, usd: Decimal, job: str, kind: str = "compute", resource: str = ""
) -> dict[str, Any]:
    """One row of a bill: the hour it starts on 2026-11-05 (UTC), the hours billed, the
    cost, the job tag, what it is, the instance (in the job's account)."""
    return {
        "start": datetime(2026, 11, 5, at, tzinfo=UTC),
        "hours": Decimal(hours),
        "usd": usd,
        "account": JOB_ACCOUNT,
        "job": job,
        "kind": kind,
        "resource": resource,
        "currency": "USD",
    }


def job_rows(price: Decimal) -> list[dict[str, Any]]:
    """The export's rows for bert-ft and around it."""
    moved = price + PRICE_MOVE

    def hour(at: int, hours: str, usd: Decimal, kind: str = "compute") -> dict[str, Any]:
        return bill_row(at, hours, usd, "bert-ft", kind)

    return [
        hour(10, "1", price),
        hour(11, "1", price),
        hour(12, "1", moved),
        hour(13, "1", moved),
        hour(14, "0.5", moved / 2),
        hour(10, "1", Decimal("0.02"), "storage"),
        {**hour(11, "1", Decimal("0.09"), "network"), "job": None},  # its NAT gateway
        {**hour(11, "1", Decimal("5.00"), "network"), "job": None, "account": OTHER_ACCOUNT},
        {**hour(11, "1", Decimal("7.00"), "network"), "job": None, "currency": "EUR"},
    ]


_FOCUS_WORDS = {
    "compute": ("Compute", "g4dn.xlarge spot instance hour", "Hours"),
    "storage": ("Storage", "EBS gp3 volume", "GB-Months"),
    "network": ("Networking", "NAT gateway hour", "Hours"),
}


def focus_export(rows: list[dict[str, Any]], path: Path) -> Path:
    """The rows as a FOCUS 1.0 CSV (AWS Data Exports' column names and units)."""
    lines = []
    for row in rows:
        category, description, unit = _FOCUS_WORDS[row["kind"]]
        end = row["start"] + timedelta(hours=1)
        tags = {"costguard:job": row["job"]} if row["job"] else {}
        lines.append(
            {
                "BilledCost": str(row["usd"]),
                "EffectiveCost": str(row["usd"]),
                "BillingCurrency": row["currency"],
                "BillingPeriodStart": row["start"].strftime("%Y-%m-01T00:00:00Z"),
                "ChargePeriodStart": row["start"].strftime("%Y-%m-%dT%H:%M:%SZ"),
                "ChargePeriodEnd": end.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "ChargeCategory": "Usage",
                "ServiceName": "Amazon Elastic Compute Cloud",
                "ServiceCategory": category,
                "ChargeDescription": description,
                "SubAccountId": row["account"],
                "ResourceId": row["resource"],
                "PricingQuantity": str(row["hours"]),
                "PricingUnit": unit,
                "Tags": json.dumps(tags),
            }
        )
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, list(lines[0]))
        writer.writeheader()
        writer.writerows(lines)
    return path


_CUR_WORDS = {
    "compute": ("AmazonEC2", "USE1-SpotUsage:g4dn.xlarge", "Hrs"),
    "storage": ("AmazonEC2", "USE1-EBS:VolumeUsage.gp3", "GB-Mo"),
    "network": ("AmazonEC2", "USE1-NatGateway-Hours", "Hrs"),
}


def cur_export(rows: list[dict[str, Any]], path: Path) -> Path:
    """The rows as AWS CUR 2.0 Parquet (its data dictionary's columns and units)."""
    stamp = pa.timestamp("ms", "UTC")
    words = [_CUR_WORDS[row["kind"]] for row in rows]
    table = pa.table(
        {
            "bill_billing_period_start_date": pa.array(
                [r["start"].replace(day=1, hour=0) for r in rows], stamp
            ),
            "line_item_usage_start_date": pa.array([r["start"] for r in rows], stamp),
            "line_item_usage_end_date": pa.array(
                [r["start"] + timedelta(hours=1) for r in rows], stamp
            ),
            "line_item_line_item_type": ["Usage"] * len(rows),
            "line_item_product_code": [w[0] for w in words],
            "line_item_usage_type": [w[1] for w in words],
            "pricing_unit": [w[2] for w in words],
            "line_item_usage_amount": pa.array([float(r["hours"]) for r in rows]),
            "line_item_usage_account_id": [r["account"] for r in rows],
            "line_item_resource_id": [r["resource"] for r in rows],
            "line_item_unblended_cost": pa.array([float(r["usd"]) for r in rows]),
            "line_item_currency_code": [r["currency"] for r in rows],
            "resource_tags": pa.array(
                [[("user_costguard_job", r["job"])] if r["job"] else [] for r in rows],
                pa.map_(pa.string(), pa.string()),
            ),
        }
    )
    pq.write_table(table, path)
    return path


_GCP_WORDS = {
    "compute": ("Compute Engine", "N1 Predefined Instance Core running in Americas", "hour"),
    "storage": ("Compute Engine", "Balanced PD Capacity", "gibibyte month"),
    "network": ("Networking", "Cloud NAT Gateway uptime", "hour"),
}


def gcp_export(rows: list[dict[str, Any]], path: Path) -> Path:
    """The rows as the GCP standard usage cost export in JSON lines (its schema's fields):
    a VM's hour as two SKUs, its 4 cores (core-hours) and its memory (GiB-hours)."""

    def line(row: dict[str, Any], sku: str, usd: Decimal, amount: Decimal, unit: str) -> str:
        service, _, _ = _GCP_WORDS[row["kind"]]
        end = row["start"] + timedelta(hours=1)
        labels = [{"key": "costguard-job", "value": row["job"]}] if row["job"] else []
        return json.dumps(
            {
                "service": {"description": service},
                "sku": {"description": sku},
                "usage_start_time": row["start"].strftime("%Y-%m-%d %H:%M:%S UTC"),
                "usage_end_time": end.strftime("%Y-%m-%d %H:%M:%S UTC"),
                "project": {"id": f"lab-{row['account']}"},
                "labels": labels,
                "cost": float(usd),
                "currency": row["currency"],
                "usage": {"amount_in_pricing_units": float(amount), "pricing_unit": unit},
                "credits": [],
                "invoice": {"month": row["start"].strftime("%Y%m")},
                "cost_type": "regular",
            }
        )

    lines = []
    for row in rows:
        _, sku, unit = _GCP_WORDS[row["kind"]]
        if row["kind"] != "compute":
            lines.append(line(row, sku, row["usd"], row["hours"], unit))
            continue
        cores = row["usd"] * Decimal("0.7")
        lines.append(line(row, sku, cores, 4 * row["hours"], unit))
        memory = sku.replace("Core", "Ram")
        lines.append(line(row, memory, row["usd"] - cores, 15 * row["hours"], "gibibyte hour"))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("write", "suffix"),
    [(focus_export, ".csv"), (cur_export, ".parquet"), (gcp_export, ".jsonl")],
    ids=["focus", "cur2", "gcp"],
)
def test_idle_time_and_price_changes_are_named_apart(
    run_cli: Callable[..., Any],
    tmp_path: Path,
    catalog: Catalog,
    write: Callable[[list[dict[str, Any]], Path], Path],
    suffix: str,
) -> None:
    """Idle time: the billed hours no attempt ran, at the price the estimate used; price
    changes: the billed hours at the billed price less the estimate's. With the other
    gaps they add up to the bill exactly, and the untagged charges are the job's
    account's only."""
    start = datetime(2026, 11, 5, 10, tzinfo=UTC).timestamp()
    url, running = launched(tmp_path, catalog, "bert-ft", start=start, hours=3)
    price = running / 3  # the offer's price: what the estimate used
    export = write(job_rows(price), tmp_path / f"bill{suffix}")
    document = spend(run_cli, str(export), "--job", url)
    gaps = {g["kind"]: Decimal(g["usd"]) for g in document["gaps"]}
    assert gaps == {
        "idle time": Decimal("1.5") * price,  # 13:00 to 14:30, no attempt running
        "price changes": Decimal("2.5") * PRICE_MOVE,  # 12:00 to 14:30 at the moved price
        "storage": Decimal("0.02"),
        # the job account's NAT gateway in dollars: not the other account's, not euros
        "untagged": Decimal("0.09"),
    }
    billed = Decimal(document["total_billed_usd"])
    assert billed == 2 * price + Decimal("2.5") * (price + PRICE_MOVE) + Decimal("0.02")
    named = sum(v for k, v in gaps.items() if k != "untagged")
    assert Decimal(document["running_cost_usd"]) + named == billed
    notes = {g["kind"]: g["note"] for g in document["gaps"]}
    assert "4.5 instance-hours billed, 3 run by the job's attempts" in notes["idle time"]
    assert f"the estimate's {price.normalize()}/h" in notes["price changes"]
    account = f"lab-{JOB_ACCOUNT}" if write is gcp_export else JOB_ACCOUNT  # a GCP project
    assert f"in the job's account {account}" in notes["untagged"]
    table = run_cli("jobs", "status", url, "--spend", str(export))
    assert table.exit_code == 0, table.stderr
    assert "idle time: $0.09, 4.5 instance-hours billed" in table.stdout
    assert "price changes: $0.03, the 4.5 billed hours cost" in table.stdout


@pytest.mark.parametrize(
    ("write", "suffix"), [(focus_export, ".csv"), (cur_export, ".parquet")], ids=["focus", "cur2"]
)
def test_each_billed_hour_is_priced_at_the_attempt_running_then(
    run_cli: Callable[..., Any],
    tmp_path: Path,
    catalog: Catalog,
    write: Callable[[list[dict[str, Any]], Path], Path],
    suffix: str,
) -> None:
    """Attempt 1 ran 10:00 to 11:30 on one instance at its offer's price, attempt 2 11:30
    to 13:00 on another at a second offer's, both billed by the second: the hour both
    instances share is 1 instance-hour, each part at its own attempt's price. A bill of
    exactly those hours names no idle time and no price change; a cent more on attempt
    2's last hour is a price change of a cent."""
    store = Store.open(tmp_path / "ckpt")
    first, second = find_offers(catalog, gpu="T4", provider="local")[:2]
    day = datetime(2026, 11, 5, tzinfo=UTC).timestamp()
    attempts = tuple(
        Attempt(
            n,
            offer,
            day + start * 3600,
            handle=Handle("local", offer.region, f"local-{n}", extra={"pid": "1"}),
            ended_unix=day + end * 3600,
            outcome=AttemptOutcome.SUCCEEDED,
            exit_code=0,
        )
        for n, offer, start, end in ((1, first, 10, 11.5), (2, second, 11.5, 13))
    )
    save_job(store, Job(spec(store.url, job_id="swap"), attempts=attempts, status="succeeded"))

    p1, p2 = first.usd_per_hour, second.usd_per_hour
    rows = [
        bill_row(10, "1", p1, "swap", resource="i-1"),
        bill_row(11, "0.5", p1 / 2, "swap", resource="i-1"),
        bill_row(11, "0.5", p2 / 2, "swap", resource="i-2"),
        bill_row(12, "1", p2, "swap", resource="i-2"),
    ]
    exact_bill = spend(run_cli, str(write(rows, tmp_path / f"a{suffix}")), "--job", store.url)
    assert exact_bill["gaps"] == []
    assert Decimal(exact_bill["running_cost_usd"]) == Decimal(exact_bill["total_billed_usd"])
    rows[-1]["usd"] += Decimal("0.01")
    dearer = spend(run_cli, str(write(rows, tmp_path / f"b{suffix}")), "--job", store.url)
    assert [(g["kind"], g["usd"]) for g in dearer["gaps"]] == [("price changes", "0.01")]


def test_the_hours_of_other_months_are_named_apart(
    run_cli: Callable[..., Any], tmp_path: Path, catalog: Catalog
) -> None:
    """A job ran 2026-10-31 22:00 to 2026-11-01 02:00 UTC, billed hour by hour at its
    price in October's bill and November's: November's report counts November's two
    hours, the controller's October hours are a gap of their own (not idle time)."""
    start = datetime(2026, 10, 31, 22, tzinfo=UTC).timestamp()
    url, running = launched(tmp_path, catalog, "across", start=start, hours=4)
    price = running / 4
    rows = [bill_row(0, "1", price, "across") for _ in range(4)]
    for row, hour in zip(rows, (-2, -1, 0, 1), strict=True):
        row["start"] = datetime(2026, 11, 1, tzinfo=UTC) + timedelta(hours=hour)
    export = str(focus_export(rows, tmp_path / "bill.csv"))
    november = spend(run_cli, export, "--job", url, "--month", "2026-11")
    assert Decimal(november["total_billed_usd"]) == 2 * price
    gaps = [(g["kind"], Decimal(g["usd"])) for g in november["gaps"]]
    assert gaps == [("other months", -2 * price)]
    assert "hours outside 2026-11" in november["gaps"][0]["note"]
    both = spend(run_cli, export, "--job", url)
    assert both["gaps"] == []


def test_spend_job_of_an_array_sums_every_task(
    run_cli: Callable[..., Any], tmp_path: Path, catalog: Catalog
) -> None:
    """`spend --job URL` at an array's URL: the charges tagged with any of its tasks' job
    ids (not another array's), next to the running cost of every task's attempts."""
    from costguard.spot import array
    from costguard.spot.sweep import task_specs

    array_id = "cg-ana-20261103-100000-abc123"
    url = str(tmp_path / "sweep")
    record = array.ArrayRecord(array_id, url, "0-1", (0, 1), 2, 1000.0)
    offer = find_offers(catalog, gpu="T4", provider="local")[0]
    start = datetime(2026, 11, 3, 10, tzinfo=UTC).timestamp()
    running = Decimal(0)
    for index, task in zip(record.indexes, task_specs(spec(url, job_id=array_id), record),
                           strict=True):  # fmt: skip
        attempt = Attempt(
            1, offer, start + index * 3600,
            handle=Handle("local", offer.region, f"local-{index}", extra={"pid": "1"}),
            ended_unix=start + (index + 1) * 3600, outcome=AttemptOutcome.SUCCEEDED, exit_code=0,
        )  # fmt: skip
        save_job(Store.open(task.checkpoint_url), Job(task, (attempt,), status="succeeded"))
        running += offer.usd_per_hour
    array.write_record(Store.open(url), record)
    # The handmade export's llama-ft charges, as the array's two tasks' (its first spot
    # hour task 0's, the rest task 1's), and another array's task's charge beside them.
    with HANDMADE.open(newline="") as source:
        rows = list(csv.DictReader(source))
    first = True
    for row in rows:
        if '"llama-ft"' in row["Tags"]:
            number = 0 if first else 1
            first = False
            row["Tags"] = row["Tags"].replace('"llama-ft"', f'"{array_id}-t{number}"')
    other = {**rows[0], "BilledCost": "5", "EffectiveCost": "5",
             "Tags": '{"costguard:job": "cg-ana-20261103-100000-fff999-t0"}'}  # fmt: skip
    export = tmp_path / "export.csv"
    with export.open("w", newline="") as target:
        writer = csv.DictWriter(target, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows([*rows, other])
    document = spend(run_cli, str(export), "--job", url, "--month", "2026-11")
    assert document["job_id"] == array_id
    assert groups(document) == {"Amazon Elastic Compute Cloud": Decimal("0.3817")}
    assert document["running_cost_usd"] == str(running.normalize())
    assert Decimal(document["gap_usd"]) == Decimal("0.3817") - running


def test_a_gangs_bill_is_every_nodes_and_so_is_its_running_cost(
    run_cli: Callable[..., Any], tmp_path: Path, catalog: Catalog
) -> None:
    """`launch --nodes 2`: one attempt of 2 hours on two instances runs 4 instance-hours;
    the running cost and the hours run count both nodes, so a bill of those 4 hours and
    one more on node a (left up an hour) names that one hour as idle time, no more."""
    store = Store.open(tmp_path / "ckpt")
    offer = find_offers(catalog, gpu="T4", provider="local")[0]
    start = datetime(2026, 11, 5, 10, tzinfo=UTC).timestamp()
    nodes = tuple(Handle("local", offer.region, f"local-{n}", extra={"pid": "1"}) for n in (1, 2))
    attempt = Attempt(1, offer, start, handle=nodes[0], ended_unix=start + 2 * 3600,
                      outcome=AttemptOutcome.SUCCEEDED, exit_code=0, node_count=2,
                      nodes=nodes)  # fmt: skip
    gang = spec(store.url, job_id="gang-ft", nodes=2, sync_dir=None)
    save_job(store, Job(gang, attempts=(attempt,), status="succeeded"))
    price = offer.usd_per_hour
    rows = [bill_row(at, "1", price, "gang-ft", resource=node) for at in (10, 11) for node in "ab"]
    rows.append(bill_row(12, "1", price, "gang-ft", resource="a"))
    document = spend(run_cli, str(focus_export(rows, tmp_path / "bill.csv")), "--job", store.url)
    assert Decimal(document["total_billed_usd"]) == 5 * price
    assert Decimal(document["running_cost_usd"]) == 4 * price
    gaps = {g["kind"]: (Decimal(g["usd"]), g["note"]) for g in document["gaps"]}
    assert list(gaps) == ["idle time"]
    assert gaps["idle time"][0] == price
    assert "5 instance-hours billed, 4 run by the job's attempts: 1 h" in gaps["idle time"][1]
