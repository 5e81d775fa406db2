"""How costguard reads FOCUS Parquet fast (benchmarks/spend.py) without giving up an exact
cent: float costs converted as integers only where that is exact, text read as
dictionaries (and again as plain text where a writer gave the dictionary up), the next
batch read while one is summed, in memory that does not grow with the file, timestamps in
any zone counted in UTC. Each file is built here in the
FOCUS 1.0 Parquet types of AWS Data Exports (costs double, periods timestamps, Tags a map),
and each total is checked against the Decimal of each float's shortest text."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from costguard.billing import exports
from costguard.billing.exports import read_spend
from costguard.billing.spend import report
from tests.helpers.waiting import wait_for

UTC = ZoneInfo("UTC")
NOVEMBER = datetime(2026, 11, 1, tzinfo=UTC)
TAGS = pa.map_(pa.string(), pa.string())


def focus(path: Path, rows: list[dict[str, Any]], **options: Any) -> Path:
    """A FOCUS Parquet file of ``rows`` (``cost``, ``tags``, optional ``day`` and
    ``effective``), billed in USD in November 2026."""
    zone = rows[0].get("day", NOVEMBER).tzinfo
    table = pa.table(
        {
            "BilledCost": pa.array([r["cost"] for r in rows], pa.float64()),
            "EffectiveCost": pa.array([r.get("effective", r["cost"]) for r in rows], pa.float64()),
            "BillingCurrency": ["USD"] * len(rows),
            "BillingPeriodStart": pa.array([NOVEMBER] * len(rows), pa.timestamp("ms", "UTC")),
            "ChargePeriodStart": pa.array(
                [r.get("day", NOVEMBER) for r in rows], pa.timestamp("ms", str(zone))
            ),
            "ServiceName": ["Amazon Elastic Compute Cloud"] * len(rows),
            "SubAccountId": ["111122223333"] * len(rows),
            "Tags": pa.array([list(r["tags"].items()) for r in rows], TAGS),
        }
    )
    pq.write_table(table, path, **options)
    return path


def shortest(rows: list[dict[str, Any]], figure: str = "cost") -> dict[str | None, Decimal]:
    """Per job, the sum of each amount's shortest decimal text (what the file means)."""
    sums: dict[str | None, Decimal] = defaultdict(Decimal)
    for row in rows:
        sums[row["tags"].get("costguard:job")] += Decimal(repr(row.get(figure, row["cost"])))
    return dict(sums)


def billed(path: Path, by: str = "job", *, job: str | None = None) -> dict[str | None, Decimal]:
    spend = report(read_spend([str(path)], by, job=job), by)
    return {g.key: g.billed_usd for g in spend.groups}


@pytest.mark.parametrize(
    "odd",
    [
        0.12345678901234,  # more than 10 places
        123456.78,  # a line item over 10**5
        1e-13,
        -0.00000000005,  # 11 places
    ],
)
def test_float_costs_sum_exactly_with_amounts_integers_cannot_hold(
    tmp_path: Path, odd: float
) -> None:
    """Batches of 10-place amounts are summed as integers; a batch with one amount that
    is not (more places, too large) is read through text, and both are exact."""
    plain = [0.1, 0.2, 1.0000000001, 32.7726, -0.0000000001, 0.1234567891]
    rows = [
        {"cost": plain[i % len(plain)], "tags": {"costguard:job": f"j{i % 3}"}} for i in range(60)
    ]
    rows[45]["cost"] = odd  # in the second row group only
    path = focus(tmp_path / "focus.parquet", rows, row_group_size=30)
    assert billed(path) == shortest(rows)


def test_tags_read_as_dictionaries_across_row_groups_and_a_dictionary_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches never span two row groups (pyarrow returns no nested column of two
    dictionaries), and a column chunk whose writer gave its dictionary up (too many
    distinct values) reads as one dictionary all the same."""
    rows = [
        {"cost": 0.5, "tags": {"costguard:job": f"job-{i:04d}-{'x' * 40}", "env": "dev"}}
        for i in range(3000)
    ]
    rows += [{"cost": 0.25, "tags": {}}] * 10
    path = focus(
        tmp_path / "focus.parquet",
        rows,
        row_group_size=1000,
        dictionary_pagesize_limit=4096,
        write_batch_size=128,
    )
    monkeypatch.setattr(exports, "PARQUET_BATCH_ROWS", 1500)
    sums = billed(path)
    assert sums == shortest(rows)
    assert sums[None] == Decimal("2.5")


def test_batches_read_ahead_add_up_as_read_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows: list[dict[str, Any]] = [
        {
            "cost": round(0.01 * (i % 97), 2),
            "effective": round(0.009 * (i % 89), 3),
            "tags": {"costguard:job": f"j{i % 5}", "costguard:owner": f"u{i % 2}"} if i % 7 else {},
            "day": NOVEMBER + timedelta(hours=i),
        }
        for i in range(720)
    ]
    path = focus(tmp_path / "focus.parquet", rows, row_group_size=90)
    assert pq.ParquetFile(path).metadata.num_row_groups == 8
    monkeypatch.setattr(exports, "PARQUET_BATCH_ROWS", 40)
    parallel = [report(read_spend([str(path)], by), by) for by in ("job", "owner", "day")]
    job = report(read_spend([str(path)], "day", job="j3"), "day")
    monkeypatch.setattr(exports, "PARQUET_AHEAD", 5)
    assert parallel == [report(read_spend([str(path)], by), by) for by in ("job", "owner", "day")]
    assert job == report(read_spend([str(path)], "day", job="j3"), "day")
    assert {g.key: g.billed_usd for g in parallel[0].groups} == shortest(rows)
    effective = {g.key: g.effective_usd for g in parallel[0].groups}
    assert effective == shortest(rows, "effective")
    assert (parallel[0].first_day, parallel[0].last_day) == ("2026-11-01", "2026-11-30")
    assert job.rows == len([r for r in rows if r["tags"].get("costguard:job") == "j3"])


def test_charges_stamped_in_another_zone_count_on_their_utc_day(tmp_path: Path) -> None:
    """2026-11-30 22:00 in New York is 2026-12-01 03:00 UTC: December's first day."""
    new_york = ZoneInfo("America/New_York")
    rows = [
        {
            "cost": 1.5,
            "tags": {"costguard:job": "a"},
            "day": datetime(2026, 11, 30, 22, tzinfo=new_york),
        },
        {
            "cost": 2.0,
            "tags": {"costguard:job": "a"},
            "day": datetime(2026, 11, 2, 9, tzinfo=new_york),
        },
    ]
    path = focus(tmp_path / "focus.parquet", rows)
    days = report(read_spend([str(path)], "day"), "day")
    assert {g.key: g.billed_usd for g in days.groups} == {
        "2026-12-01": Decimal("1.5"),
        "2026-11-02": Decimal(2),
    }
    assert (days.first_day, days.last_day) == ("2026-11-02", "2026-12-01")


def test_periods_written_as_text_read_as_text(tmp_path: Path) -> None:
    """A Parquet export whose periods are ISO text (a writer that kept the CSV's strings)
    reads like one with timestamps: text is read as dictionaries, the days as text."""
    rows: list[dict[str, Any]] = [
        {"cost": 1.25, "tags": {"costguard:job": "a"}, "day": NOVEMBER + timedelta(days=2)},
        {"cost": 0.5, "tags": {}, "day": NOVEMBER + timedelta(days=4)},
    ]
    stamped = pq.read_table(focus(tmp_path / "stamped.parquet", rows))
    column = stamped.schema.get_field_index("ChargePeriodStart")
    texts = pa.array([r["day"].strftime("%Y-%m-%dT%H:%M:%SZ") for r in rows])
    path = tmp_path / "text.parquet"
    pq.write_table(stamped.set_column(column, "ChargePeriodStart", texts), path)
    assert billed(path, "day") == {"2026-11-03": Decimal("1.25"), "2026-11-05": Decimal("0.5")}
    assert billed(path, "service", job="a") == {"Amazon Elastic Compute Cloud": Decimal("1.25")}


def test_an_error_in_the_batch_read_ahead_is_raised_and_the_reading_stops() -> None:
    """The thread reading ahead gives its error to the reader; a reader that leaves early
    (an error of its own, Ctrl-C) stops it, and the batches' file is closed."""
    closed = []

    def batches(fail_at: int | None) -> Any:
        try:
            for n in range(1000):
                if n == fail_at:
                    msg = "a corrupt page"
                    raise OSError(msg)
                yield n
        finally:
            closed.append(fail_at)

    with pytest.raises(OSError, match="a corrupt page"):
        list(exports._read_ahead(batches(3), 1))
    read = exports._read_ahead(batches(None), 1)
    assert [next(read), next(read)] == [0, 1]
    read.close()  # the reader left: the thread stops at its next batch
    wait_for(lambda: len(closed) >= 2, "both readers' batches closed", timeout_s=10)
    assert closed == [3, None]
    wait_for(
        lambda: not [t for t in threading.enumerate() if t.name == "costguard-read-ahead"],
        "the read-ahead threads ended",
        timeout_s=10,
    )


PEAK = """
import sys
import pyarrow as pa
from costguard.billing import exports
exports.for_a_command()
tally = exports.read_spend([sys.argv[1]], "job")
print(sum(tally.counts.values()), pa.default_memory_pool().max_memory(), "pandas" in sys.modules)
"""


def many_rows(path: Path, rows: int) -> Path:
    """``rows`` FOCUS charges of 2,000 resources in row groups of 500,000 (as AWS Data
    Exports write them), float costs of 10 places, a Name tag each and a job tag."""
    import numpy as np

    random = np.random.default_rng(49)
    tags = pa.array(
        [[("Name", f"node-{r:04d}"), ("costguard:job", f"job-{r % 40:02d}")] for r in range(2000)],
        TAGS,
    )
    with pq.ParquetWriter(path, focus_schema()) as writer:
        for first in range(0, rows, 500_000):
            n = min(500_000, rows - first)
            cost = pa.array(random.integers(0, 10**10, n) / 10**10)
            writer.write_table(
                pa.table(
                    {
                        "BilledCost": cost,
                        "EffectiveCost": cost,
                        "BillingCurrency": pa.array(["USD"] * n),
                        "BillingPeriodStart": pa.array([NOVEMBER] * n, pa.timestamp("ms", "UTC")),
                        "ChargePeriodStart": pa.array([NOVEMBER] * n, pa.timestamp("ms", "UTC")),
                        "ServiceName": pa.array(["Amazon Elastic Compute Cloud"] * n),
                        "SubAccountId": pa.array(["111122223333"] * n),
                        "Tags": tags.take(pa.array(random.integers(0, 2000, n))),
                    },
                    schema=focus_schema(),
                )
            )
    return path


def focus_schema() -> pa.Schema:
    return pa.schema(
        [
            ("BilledCost", pa.float64()),
            ("EffectiveCost", pa.float64()),
            ("BillingCurrency", pa.string()),
            ("BillingPeriodStart", pa.timestamp("ms", "UTC")),
            ("ChargePeriodStart", pa.timestamp("ms", "UTC")),
            ("ServiceName", pa.string()),
            ("SubAccountId", pa.string()),
            ("Tags", TAGS),
        ]
    )


@pytest.mark.slow
def test_a_parquet_export_is_read_in_memory_that_does_not_grow_with_it(tmp_path: Path) -> None:
    """Issue 49: a 10-million-row Parquet export peaked at 2.6-2.7x DuckDB's memory (row
    groups of 512 Ki-row batches read four at a time). pyarrow's peak stays that of a
    couple of small batches, whatever the file's size (1 and 2 million rows), and far
    under one row group's; and the command's process never loads pandas (50 MiB)."""
    peaks = []
    for rows in (1_000_000, 2_000_000):
        path = many_rows(tmp_path / f"focus-{rows}.parquet", rows)
        out = subprocess.run(
            [sys.executable, "-c", PEAK, str(path)],
            capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
        count, peak, pandas = out.stdout.split()
        assert int(count) == rows
        assert pandas == "False"
        peaks.append(int(peak))
    assert peaks[1] < peaks[0] * 1.25, peaks
    assert peaks[1] < 48 * 2**20, peaks  # one row group's columns decoded: about 90 MiB
