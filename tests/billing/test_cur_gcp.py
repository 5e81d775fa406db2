"""costguard spend over the clouds' native exports, built by hand in their documented shapes.

- AWS CUR 2.0 (Parquet): column names and types from the CUR 2.0 data dictionary
  (docs.aws.amazon.com/cur/latest/userguide/table-dictionary-cur2.html): costs as double,
  ``line_item_usage_start_date`` and ``bill_billing_period_start_date`` as timestamps,
  ``resource_tags`` a ``map<string, string>`` whose user tag keys are ``user_`` and the key
  with other characters as ``_`` (``user_costguard_job``; the Data Exports "Resource tags
  columns" page and public Athena queries such as ``resource_tags['user_cost_center']``);
  the newer ``tags`` column prefixes resource tags ``resourceTags/`` ("Tags Column" page).
  Amortisation: savings plan and reservation line item types with their effective-cost
  columns, as the dictionary's savings plan and reservation sections name them.
- GCP standard usage cost export (tests/billing/data/gcp_billing_export.jsonl, its source
  in SOURCES.md), and the same rows saved as Parquet as BigQuery writes its types
  (FLOAT64 cost, TIMESTAMP usage_start_time, REPEATED RECORD labels and credits).
- FOCUS as Parquet: AWS Data Exports' Tags map, and GCP's FOCUS view's Tags records
  (data/SOURCES.md, "Tag spellings").
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq
import pytest

from costguard.billing.spend import CUR2
from tests.billing.test_focus import groups, spend

DATA = Path(__file__).parent / "data"
GCP_JSONL = DATA / "gcp_billing_export.jsonl"

JOB = {"costguard:job": "llama-ft", "costguard:owner": "ana", "env": "dev"}
BERT = {"costguard:job": "bert-sweep", "costguard:owner": "li"}
WHISPER = {"costguard:job": "whisper-eval", "costguard:owner": "ana"}
#: (line item type, product, unblended cost, tags, amortisation columns)
CUR_ROWS: list[tuple[str, str, float, dict[str, str], dict[str, float]]] = [
    ("Usage", "AmazonEC2", 1.006, JOB, {}),
    ("Usage", "AmazonEC2", 0.1, JOB, {}),  # 0.1 + 0.2 is 0.30000000000000004 as floats
    ("Usage", "AmazonEC2", 0.2, JOB, {}),
    (
        "SavingsPlanCoveredUsage",
        "AmazonEC2",
        32.7726,
        BERT,
        {"savings_plan_savings_plan_effective_cost": 21.958},
    ),
    ("SavingsPlanNegation", "AmazonEC2", -32.7726, BERT, {}),
    (
        "SavingsPlanRecurringFee",
        "ComputeSavingsPlans",
        73.0,
        {},
        {"savings_plan_total_commitment_to_date": 73.0, "savings_plan_used_commitment": 21.958},
    ),
    ("Tax", "AmazonEC2", 4.12, {}, {}),
    ("Credit", "AmazonEC2", -25.0, {}, {}),
    ("DiscountedUsage", "AmazonEC2", 0.0, WHISPER, {"reservation_effective_cost": 0.5}),
    (
        "RIFee",
        "AmazonEC2",
        10.0,
        {},
        {
            "reservation_unused_amortized_upfront_fee_for_billing_period": 1.0,
            "reservation_unused_recurring_fee": 2.0,
        },
    ),
    ("Fee", "AmazonEC2", 100.0, {}, {"reservation_reservation_a_r_n": 1.0}),
]
#: The amounts of the amortisation columns (the dictionary's names, as CUR2 lists them).
AMORTISATION = tuple(c for c in CUR2.optional if c != "reservation_reservation_a_r_n")


def resource_tags_key(tag: str) -> str:
    """A user tag's key in CUR 2.0's ``resource_tags``: ``user_``, other characters as ``_``."""
    return "user_" + re.sub(r"[^A-Za-z0-9]", "_", tag)


def cur2_table(
    tags_column: str = "resource_tags", spell: Callable[[str], str] = resource_tags_key
) -> pa.Table:
    n = len(CUR_ROWS)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    tags = [[(spell(k), v) for k, v in row[3].items()] for row in CUR_ROWS]
    columns: dict[str, Any] = {
        "identity_line_item_id": [f"id{i}" for i in range(n)],
        "bill_billing_period_start_date": pa.array([start] * n, pa.timestamp("ms", "UTC")),
        "line_item_usage_start_date": pa.array(
            [datetime(2026, 11, 3 + i % 4, 10, tzinfo=UTC) for i in range(n)],
            pa.timestamp("ms", "UTC"),
        ),
        "line_item_line_item_type": [row[0] for row in CUR_ROWS],
        "line_item_product_code": [row[1] for row in CUR_ROWS],
        "line_item_usage_account_id": ["111122223333"] * n,
        "line_item_unblended_cost": pa.array([row[2] for row in CUR_ROWS], pa.float64()),
        "line_item_currency_code": ["USD"] * n,
        "line_item_resource_id": [f"i-{i:017x}" for i in range(n)],
        tags_column: pa.array(tags, pa.map_(pa.string(), pa.string())),
        "product": pa.array(
            [[("product_name", "Amazon Elastic Compute Cloud")]] * n,
            pa.map_(pa.string(), pa.string()),
        ),
    }
    for name in AMORTISATION:
        columns[name] = pa.array([row[4].get(name, 0.0) for row in CUR_ROWS], pa.float64())
    columns["reservation_reservation_a_r_n"] = [
        "arn:aws:ec2:us-east-1:111122223333:reserved-instances/ri-1"
        if "reservation_reservation_a_r_n" in row[4]
        else ""
        for row in CUR_ROWS
    ]
    return pa.table(columns)


@pytest.fixture
def cur2(tmp_path: Path) -> Path:
    path = tmp_path / "cur2" / "data" / "BILLING_PERIOD=2026-11" / "cur2-00001.snappy.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(cur2_table(), path)
    return path


def test_cur2_groups_by_the_resource_tags_map_with_amortisation(
    run_cli: Callable[..., Any], cur2: Path
) -> None:
    document = spend(run_cli, str(cur2), "--by", "job")
    assert groups(document) == {
        "llama-ft": Decimal("1.306"),  # exact: not 1.3060000000000003
        "bert-sweep": Decimal(0),  # covered usage and its negation
        "whisper-eval": Decimal(0),
        None: Decimal("162.12"),
    }
    assert groups(document, "effective_usd") == {
        "llama-ft": Decimal("1.306"),
        "bert-sweep": Decimal("21.958"),
        "whisper-eval": Decimal("0.5"),
        None: Decimal("33.162"),  # unused plan 51.042, tax, credit, unused RI 3, upfront 0
    }
    assert document["period"] == "2026-11"
    assert (document["charges_from"], document["charges_to"]) == ("2026-11-03", "2026-11-06")
    by_service = groups(spend(run_cli, str(cur2), "--by", "service"))
    assert by_service["ComputeSavingsPlans"] == Decimal(73)


def test_cur2_tags_column_with_resource_tags_prefix(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    path = tmp_path / "cur2.parquet"
    pq.write_table(cur2_table("tags", lambda tag: f"resourceTags/{tag}"), path)
    assert "resource_tags" not in pq.read_schema(path).names
    document = spend(run_cli, str(path), "--by", "owner")
    assert groups(document)["ana"] == Decimal("1.306")
    assert groups(document)["li"] == Decimal(0)


def test_only_the_needed_columns_are_read(
    run_cli: Callable[..., Any], cur2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[list[str]] = []
    original = pq.ParquetFile.iter_batches

    def recording(self: pq.ParquetFile, *args: Any, **kwargs: Any) -> Any:
        asked.append(list(kwargs["columns"]))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", recording)
    spend(run_cli, str(cur2), "--by", "job")
    assert asked
    assert "line_item_resource_id" not in asked[0]
    assert "product" not in asked[0]
    assert "identity_line_item_id" not in asked[0]
    assert {"resource_tags", "line_item_unblended_cost"} <= set(asked[0])


GCP_JOBS = {
    # L4 hour less its spot discount, core, ram; the disk's free-trial credit cancels it
    "bert-sweep": Decimal("0.468"),
    "llama-ft": Decimal("0.355"),  # less a committed use and a sustained use discount
    None: Decimal("0.336"),  # storage without labels, tax; project labels are not resource's
}


def gcp_parquet(path: Path) -> Path:
    rows = [json.loads(line) for line in GCP_JSONL.read_text().splitlines()]
    for row in rows:
        for field in ("usage_start_time", "usage_end_time", "export_time"):
            row[field] = datetime.fromisoformat(row[field].removesuffix(" UTC")).replace(tzinfo=UTC)
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, path)
    assert pa.types.is_floating(table.schema.field("cost").type)
    assert pa.types.is_timestamp(table.schema.field("usage_start_time").type)
    return path


def test_gcp_export_as_jsonl_adds_credits_and_reads_resource_labels(
    run_cli: Callable[..., Any],
) -> None:
    document = spend(run_cli, str(GCP_JSONL), "--by", "job")
    assert groups(document) == GCP_JOBS
    assert document["total_billed_usd"] == "1.159"
    assert document["period"] == "2026-11"
    services = groups(spend(run_cli, str(GCP_JSONL), "--by", "service"))
    assert services == {
        "Compute Engine": Decimal("0.823"),
        "Cloud Storage": Decimal("0.026"),
        "Invoice": Decimal("0.31"),
    }
    assert groups(spend(run_cli, str(GCP_JSONL), "--by", "project")) == {
        "my-lab-project": Decimal("1.159")
    }


def test_gcp_export_as_parquet(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    path = gcp_parquet(tmp_path / "gcp.parquet")
    document = spend(run_cli, str(path), "--by", "job")
    assert groups(document) == GCP_JOBS
    days = groups(spend(run_cli, str(path), "--by", "day"))
    assert days == {"2026-11-06": Decimal("0.494"), "2026-11-07": Decimal("0.665")}


def test_exports_of_several_clouds_add_up(run_cli: Callable[..., Any], cur2: Path) -> None:
    document = spend(run_cli, str(cur2), str(GCP_JSONL), "--by", "owner")
    assert groups(document)["ana"] == Decimal("1.306") + Decimal("0.355")
    assert groups(document)["li"] == Decimal("0.468")


def focus_parquet(path: Path, tags: Callable[[dict[str, str]], list[Any]], kind: Any) -> Path:
    """focus_handmade.csv as Parquet, each row's Tags object made ``tags(object)`` of
    type ``kind``: costs double, periods timestamp_milliseconds."""
    csv_rows = pa.csv.read_csv(
        DATA / "focus_handmade.csv",
        convert_options=pa.csv.ConvertOptions(
            column_types={"BilledCost": pa.float64(), "EffectiveCost": pa.float64()},
            null_values=["", "NULL"],
            strings_can_be_null=True,
        ),
    )
    cells = [tags(json.loads(text) if text else {}) for text in csv_rows["Tags"].to_pylist()]
    table = csv_rows.drop_columns(["Tags"]).append_column("Tags", pa.array(cells, kind))
    for name in ("BillingPeriodStart", "ChargePeriodStart"):
        index = table.schema.get_field_index(name)
        table = table.set_column(index, name, table[name].cast(pa.timestamp("ms", "UTC")))
    pq.write_table(table, path)
    return path


def test_focus_as_parquet_with_a_tags_map(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    """AWS Data Exports' FOCUS 1.0 Parquet types (FOCUS 1.0 with AWS columns, the Data
    Exports table dictionary); Tags as a map of the keys as written."""
    kind = pa.map_(pa.string(), pa.string())
    path = focus_parquet(tmp_path / "focus.parquet", lambda tags: list(tags.items()), kind)
    document = spend(run_cli, str(path), "--by", "job", "--month", "2026-11")
    assert document["total_billed_usd"] == "55.4147"
    assert groups(document)["llama-ft"] == Decimal("0.3817")
    assert groups(document, "effective_usd")["bert-sweep"] == Decimal("22.818")


#: The Tags of GCP's FOCUS view of the detailed export (Google's FOCUS 1.0 BigQuery view
#: template, query of 2024-03-19): one record per resource label (``x_type`` "label"),
#: system label, project label (``x_inherited`` true) and Resource Manager tag.
GCP_FOCUS_TAG = pa.struct(
    [
        ("key", pa.string()),
        ("value", pa.string()),
        ("x_type", pa.string()),
        ("x_inherited", pa.bool_()),
        ("x_namespace", pa.string()),
    ]
)


def gcp_focus_tags(labels: dict[str, str]) -> list[dict[str, Any]]:
    """A row's labels as the view lists them, then its project's labels: the project names
    an owner and a job of its own, which no charge's resource carries."""
    project = {"costguard-owner": "lab-admin", "costguard-job": "project-wide", "team": "ml"}
    return [
        {"key": key, "value": value, "x_type": kind, "x_inherited": kind != "label"}
        | {"x_namespace": "n/a"}
        for kind, pairs in (("label", labels), ("project_label", project))
        for key, value in pairs.items()
    ]


def test_gcp_focus_views_inherited_project_labels_are_not_the_charges_tags(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    """As in the native export, where only a resource's ``labels`` count: the project's
    labels the view adds to every row (``x_inherited``) neither tag an untagged charge nor
    override the resource's own ``costguard-owner``."""
    path = focus_parquet(tmp_path / "gcp_focus.parquet", gcp_focus_tags, pa.list_(GCP_FOCUS_TAG))
    for by in ("job", "owner"):
        ours = groups(spend(run_cli, str(path), "--by", by, "--month", "2026-11"))
        written = DATA / "focus_handmade.csv"  # the same rows without the project's labels
        assert ours == groups(spend(run_cli, str(written), "--by", by, "--month", "2026-11"))
        assert not {"lab-admin", "project-wide"} & set(ours)


def test_tag_keys_in_any_case_and_punctuation_are_the_tag(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    """The rule of costguard.billing.spend.tag_key on a map column: case and punctuation
    aside, ``COSTGUARD-JOB`` is the job tag; ``costguard:jobs`` and a value-less key are not."""
    path = tmp_path / "cur2.parquet"
    table = cur2_table()
    spellings = ["COSTGUARD-JOB", "user_Costguard_Job", "costguard:jobs", "costguard:job"]
    tags = [[(spellings[i % 4], f"j{i % 4}")] for i in range(table.num_rows)]
    tags[-1] = [("costguard:job", " ")]
    index = table.schema.get_field_index("resource_tags")
    table = table.set_column(
        index, "resource_tags", pa.array(tags, pa.map_(pa.string(), pa.string()))
    )
    pq.write_table(table, path)
    keys = set(groups(spend(run_cli, str(path), "--by", "job")))
    assert keys == {"j0", "j1", "j3", None}
