"""What `costguard spend` does at the edges of its input (issue 49): sums that outgrow
decimal128 stay exact, a double of 17 digits is rounded by a stated rule instead of
refusing the file, and what is no billing export (a line over the block size, a header
field over 128 KiB, a JSON array, dates written 4/1/25, a charge without a currency, a
cost column twice, a mistyped bucket URL) is one Error and one Hint, exit 2. Times with
an offset count on their UTC day."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

HEADER = "BilledCost,EffectiveCost,BillingCurrency,BillingPeriodStart,ChargePeriodStart,Tags"
GCP = Path(__file__).parent / "data" / "gcp_billing_export.jsonl"


def focus_csv(path: Path, rows: Sequence[Sequence[str]], header: str = HEADER) -> Path:
    """A FOCUS CSV of ``rows``: (cost, currency, period, start, job) or whole lines."""
    lines = [header]
    for row in rows:
        if isinstance(row, str):
            lines.append(row)
            continue
        cost, currency, period, start, job = row
        tags = f'"{{""costguard:job"": ""{job}""}}"' if job else "NULL"
        lines.append(f"{cost},{cost},{currency},{period},{start},{tags}")
    path.write_text("\n".join(lines) + "\n")
    return path


def charge(cost: str, job: str = "j1", start: str = "2026-11-14 05:00:00") -> list[str]:
    return [cost, "USD", "2026-11-01 00:00:00", start, job]


def spend_json(run_cli: Callable[..., Any], *args: str) -> dict[str, Any]:
    result = run_cli("spend", *args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    return dict(result.json())


def refused(run_cli: Callable[..., Any], *args: str) -> str:
    """The stderr of a refused ``spend``: exit 2, one Error line and one Hint line."""
    result = run_cli("spend", *args)
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Error: "), lines
    assert "unexpected" not in lines[0], lines
    assert lines[1].startswith("Hint: "), lines
    return str(result.stderr)


@pytest.mark.parametrize(
    ("amounts", "rows", "jobs"),
    [
        (["999999999999999999"], 171, 1),  # issue 49: summed to a negative total
        # under 10**20 per group, 38 digits: Python's 28-digit context rounded them
        (["999999999999999999.999999999999999999", "0.000000000000000003"], 300, 2),
        (["-999999999999999999", "-123456789012345678.5"], 2000, 2),
    ],
)
def test_sums_past_38_digits_stay_exact(
    run_cli: Callable[..., Any], tmp_path: Path, amounts: list[str], rows: int, jobs: int
) -> None:
    """pyarrow's decimal128 sums wrap round silently past 38 digits, Python's default
    decimal context rounds past 28: every group's sum and the total are exact."""
    costs = [amounts[i % len(amounts)] for i in range(rows)]
    path = focus_csv(tmp_path / "big.csv", [charge(c, f"j{i % jobs}") for i, c in enumerate(costs)])
    document = spend_json(run_cli, str(path))
    with localcontext(prec=200):
        expected = {f"j{k}": sum(map(Decimal, costs[k::jobs]), Decimal(0)) for k in range(jobs)}
        total = sum(expected.values(), Decimal(0))
    assert {g["key"]: Decimal(g["billed_usd"]) for g in document["groups"]} == expected
    assert Decimal(document["total_billed_usd"]) == total


def test_a_double_of_17_digits_in_jsonl_is_rounded_by_the_stated_rule(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    """BigQuery writes FLOAT64 costs with 17 digits: the file is read, not refused ("requires
    scale 21"), the amount rounded half to even at the 18th place and counted."""
    lines = GCP.read_text().splitlines()
    first = json.loads(lines[0])
    first["cost"] = "COST"
    first["credits"] = [{"amount": "CREDIT", "name": "x", "type": "PROMOTION"}]
    # As BigQuery writes them (json.dumps would write each float's shortest text)
    text = json.dumps(first).replace('"COST"', "1.0000000000000002e-05")
    text = text.replace('"CREDIT"', "-3.00000000000000049e-06")
    path = tmp_path / "gcp.jsonl"
    path.write_text("\n".join([text, *lines[1:]]) + "\n")
    document = spend_json(run_cli, str(path), "--by", "project")
    rest = spend_json(run_cli, str(GCP), "--by", "project")
    old = json.loads(lines[0])
    old_cost = Decimal(repr(old["cost"])) + sum(Decimal(repr(c["amount"])) for c in old["credits"])
    # 0.000010000000000000|002 rounds down, -0.000003000000000000|49 to -0.000003
    expected = Decimal(rest["total_billed_usd"]) - old_cost + Decimal("0.000007")
    assert Decimal(document["total_billed_usd"]) == expected
    assert document["rounded_amounts"] == 2  # the cost and the credit
    assert document["rounded_to_places"] == 18
    table = run_cli("spend", str(path), "--by", "project")
    assert "2 amount(s) had more than 18 decimal places" in " ".join(table.stdout.split())


def test_a_double_of_17_digits_in_parquet_is_rounded_by_the_stated_rule(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    costs = [1.0000000000000002e-05, 0.1, 2.5]
    table = pa.table(
        {
            "BilledCost": pa.array(costs, pa.float64()),
            "EffectiveCost": pa.array(costs, pa.float64()),
            "BillingCurrency": ["USD"] * 3,
            "BillingPeriodStart": ["2026-11-01T00:00:00Z"] * 3,
            "ChargePeriodStart": ["2026-11-02T00:00:00Z"] * 3,
            "Tags": pa.array([[("costguard:job", "j1")]] * 3, pa.map_(pa.string(), pa.string())),
        }
    )
    pq.write_table(table, tmp_path / "focus.parquet")
    document = spend_json(run_cli, str(tmp_path / "focus.parquet"))
    assert document["total_billed_usd"] == "2.60001"
    # EffectiveCost equals BilledCost on every row: one amount per charge is read
    assert document["rounded_amounts"] == 1


def test_plain_amounts_say_nothing_of_rounding(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    path = focus_csv(tmp_path / "plain.csv", [charge("0.000000000000000001")])
    document = spend_json(run_cli, str(path))
    assert "rounded_amounts" not in document
    assert document["total_billed_usd"] == "0.000000000000000001"


def test_a_line_longer_than_a_block_is_read_every_time(tmp_path: Path) -> None:
    """pyarrow cannot read a row longer than its block: the file is read again in larger
    blocks (up to 64 MiB; a longer line is refused). Every time, through the CLI's own
    process (a line of 20 MiB was refused, and aborted 8 runs in 108: the reader's
    read-ahead thread outlived the file, "terminate called without an active exception",
    exit 134)."""
    rows: list[Sequence[str]] = [charge("0.1")] * 100_000
    tags = '"{""costguard:job"": ""j2"", ""x"": ""' + "y" * (20 << 20) + '""}"'
    long = ",".join(["0.25", "0.25", "USD", "2026-11-01", "2026-11-02", tags])
    read = focus_csv(tmp_path / "long.csv", [*rows, long, *rows])
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-m", "costguard", "spend", str(read), "--format", "json"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        document = json.loads(done.stdout)
        assert document["rows"] == 200_001
        assert {g["key"]: g["billed_usd"] for g in document["groups"]} == {
            "j1": "20000",
            "j2": "0.25",
        }


def test_a_header_field_over_128_kib_is_no_export(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    path = tmp_path / "wide.csv"
    path.write_text("x" * (200 << 10) + "," + HEADER + "\n1,1,USD,2026-11-01,2026-11-02,NULL\n")
    assert "is not a billing export" in refused(run_cli, str(path))


@pytest.mark.parametrize(
    "body",
    [
        "[" + GCP.read_text().splitlines()[0] + "]\n",  # an array on one line
        "[\n  " + GCP.read_text().splitlines()[0] + "\n]\n",  # pretty-printed
        "42\n",
    ],
)
def test_a_json_array_is_refused(run_cli: Callable[..., Any], tmp_path: Path, body: str) -> None:
    path = tmp_path / "bills.json"
    path.write_text(body)
    assert "not JSON lines" in refused(run_cli, str(path), "--by", "project")


@pytest.mark.parametrize(
    ("period", "start", "named"),
    [
        ("2026-11-01 00:00:00", "4/1/25", "ChargePeriodStart holds '4/1/25'"),
        ("9/1/25", "2026-11-02 00:00:00", "the billing period '9/1/25'"),
        ("2026-11-01 00:00:00", "Nov 2, 2026", "ChargePeriodStart holds 'Nov 2, 2026'"),
        ("2026-13-01 00:00:00", "2026-11-02 00:00:00", "the billing period '2026-13-01"),
    ],
)
def test_dates_not_in_iso_8601_are_refused(
    run_cli: Callable[..., Any], tmp_path: Path, period: str, start: str, named: str
) -> None:
    """A spreadsheet's 4/1/25 was a day key of its own, and --month's hint suggested
    ``9/1/25``."""
    row = f'0.5,0.5,USD,{period},"{start}",NULL'
    path = focus_csv(tmp_path / "us.csv", [charge("1"), row])
    for by in ("day", "job"):
        stderr = refused(run_cli, str(path), "--by", by)
        assert named in stderr
        assert "ISO 8601" in stderr


def test_times_with_an_offset_count_on_their_utc_day(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    rows = [
        charge("1", start="2026-11-14T23:30:00-05:00"),  # 2026-11-15 04:30 UTC
        charge("2", start="2026-11-15T01:00:00+02:00"),  # 2026-11-14 23:00 UTC
        charge("4", start="2026-11-14T12:00:00Z"),
        charge("8", start="2026-11-14 12:00:00"),  # no zone: UTC (AWS's FOCUS CSV)
        charge("16", start="2026-11-16T00:00:00.1234567+00:00"),
    ]
    document = spend_json(run_cli, str(focus_csv(tmp_path / "zones.csv", rows)), "--by", "day")
    days = {g["key"]: g["billed_usd"] for g in document["groups"]}
    assert days == {"2026-11-14": "14", "2026-11-15": "1", "2026-11-16": "16"}
    assert (document["charges_from"], document["charges_to"]) == ("2026-11-14", "2026-11-16")


def test_charges_without_a_currency_are_refused_with_a_usable_hint(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    """A NULL currency was a currency named "" (hint: ``--currency `` with nothing)."""
    row = "0.5,0.5,NULL,2026-11-01 00:00:00,2026-11-02 00:00:00,NULL"
    for rows in ([charge("1"), row], [row]):
        stderr = refused(run_cli, str(focus_csv(tmp_path / "none.csv", rows)))
        assert "1 charge(s) of the export name no currency" in stderr
        assert "--currency" not in stderr


def test_a_cost_column_twice_is_refused(run_cli: Callable[..., Any], tmp_path: Path) -> None:
    """Which BilledCost is the bill? The first was taken silently."""
    header = HEADER.replace("Tags", "BilledCost,Tags")
    path = focus_csv(
        tmp_path / "twice.csv", ["1,1,USD,2026-11-01,2026-11-02,2,NULL"], header=header
    )
    assert "has the column BilledCost 2 times" in refused(run_cli, str(path))
    values = [[1.0], [2.0], [1.0], ["USD"], ["2026-11-01"], ["2026-11-02"], ["{}"]]
    table = pa.table(
        [pa.array(v) for v in values], names=["BilledCost", "BilledCost", *HEADER.split(",")[1:]]
    )
    pq.write_table(table, tmp_path / "twice.parquet")
    assert "has the column BilledCost 2 times" in refused(run_cli, str(tmp_path / "twice.parquet"))


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("s3:/my-bills/focus/", "s3://my-bills/focus/"),
        ("s3//my-bills/focus/", "s3://my-bills/focus/"),
        ("S3://my-bills/focus/", "s3://my-bills/focus/"),
        ("gs:/my-bills/focus/", "gs://my-bills/focus/"),
    ],
)
def test_a_mistyped_bucket_url_is_caught(
    run_cli: Callable[..., Any], typed: str, meant: str
) -> None:
    """As every other command catches it (issue 49: "no billing export files")."""
    stderr = refused(run_cli, typed)
    assert "looks like a store URL but is not one" in stderr
    assert f"it probably means {meant}" in stderr


def test_a_gzipped_export_with_offsets_reads_as_the_plain_one(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    rows = [charge("1.25", start="2026-11-14T23:30:00-05:00"), charge("2", job="")]
    plain = focus_csv(tmp_path / "a.csv", rows)
    packed = tmp_path / "a.csv.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert spend_json(run_cli, str(packed))["groups"] == spend_json(run_cli, str(plain))["groups"]


def test_tags_decided_once_per_read_agree_with_a_memo_that_forgets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each distinct Tags text is decided once per read, across blocks (TagMemo); a memo
    full to its bound forgets and learns again, and the sums stay the same."""
    from costguard.billing import exports
    from costguard.billing.exports import read_spend
    from costguard.billing.spend import report

    tags = '"{{""Name"": ""n{}"", ""costguard:job"": ""j{}""}}"'
    rows = [f"1,1,USD,2026-11-01,2026-11-02,{tags.format(i % 50, i % 7)}" for i in range(4000)]
    path = focus_csv(tmp_path / "tags.csv", rows)
    monkeypatch.setattr(exports, "CSV_BLOCK_BYTES", 16 << 10)  # many blocks

    def sums() -> dict[str | None, Decimal]:
        spend = report(read_spend([str(path)], "job"), "job")
        return {g.key: g.billed_usd for g in spend.groups}

    remembered = sums()
    assert remembered == {f"j{k}": Decimal(len(range(k, 4000, 7))) for k in range(7)}
    monkeypatch.setattr(exports, "MEMO_TEXTS", 3)
    assert sums() == remembered
