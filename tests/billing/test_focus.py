"""costguard spend over FOCUS 1.0 exports: the FinOps Foundation's real sample (AWS,
Microsoft, Oracle rows) against pandas to the cent, and hand-built exports following the
FOCUS 1.0 columns (focus.finops.org, FOCUS 1.0: BilledCost, EffectiveCost, ChargeCategory,
ChargeClass, CommitmentDiscountId, Tags) for each cloud's tag spelling, refunds, credits,
tax, an amortised savings plan and a second currency (tests/billing/data/SOURCES.md)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "focus_sample.csv.gz"
HANDMADE = DATA / "focus_handmade.csv"
EUR = DATA / "focus_second_currency.csv"
CENT = Decimal("0.005")


def spend(run_cli: Callable[..., Any], *args: str) -> dict[str, Any]:
    result = run_cli("spend", *args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    return result.json()


def groups(document: dict[str, Any], figure: str = "billed_usd") -> dict[str | None, Decimal]:
    return {g["key"]: Decimal(g[figure]) for g in document["groups"]}


def sample_frame(path: Path = SAMPLE) -> pd.DataFrame:
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    frame["billed"] = frame["BilledCost"].astype(float)
    frame["effective"] = frame["EffectiveCost"].astype(float)
    return frame


def assert_to_the_cent(ours: dict[str | None, Decimal], theirs: dict[Any, float]) -> None:
    assert set(ours) == set(theirs)
    for key, amount in theirs.items():
        assert abs(ours[key] - Decimal(repr(amount))) < CENT, key


@pytest.mark.parametrize(
    ("by", "column"),
    [("service", "ServiceName"), ("project", "SubAccountId"), ("day", "ChargePeriodStart")],
)
def test_the_real_sample_matches_pandas_to_the_cent(
    run_cli: Callable[..., Any], by: str, column: str
) -> None:
    document = spend(run_cli, str(SAMPLE), "--by", by, "--month", "2024-09")
    frame = sample_frame()
    frame = frame[frame["BillingPeriodStart"].str.startswith("2024-09")]
    keys = frame[column].str[:10] if by == "day" else frame[column]
    keys = keys.where(~keys.isin(["", "NULL"]), None)
    for figure, name in (("billed_usd", "billed"), ("effective_usd", "effective")):
        theirs = frame.groupby(keys.fillna("\0"), dropna=False)[name].sum().to_dict()
        theirs = {None if k == "\0" else k: v for k, v in theirs.items()}
        assert_to_the_cent(groups(document, figure), theirs)
    assert Decimal(document["total_billed_usd"]) == sum(groups(document).values())
    assert document["rows"] == 999  # the charges of 2024-09: one row is of 2024-10
    assert document["period"] == "2024-09"
    assert document["currency"] == "USD"


def test_the_real_sample_sums_exactly(run_cli: Callable[..., Any]) -> None:
    """The exact decimals of the file, summed as decimals: not a float's rounding."""
    document = spend(run_cli, str(SAMPLE), "--by", "service", "--month", "2024-09")
    rows = pd.read_csv(SAMPLE, dtype=str, keep_default_na=False)
    rows = rows[rows["BillingPeriodStart"].str.startswith("2024-09")]
    exact = sum((Decimal(v) for v in rows["BilledCost"]), Decimal(0))
    assert Decimal(document["total_billed_usd"]) == exact


@pytest.mark.parametrize(
    ("real", "spelled"),
    [
        # AWS (and Oracle) rows: user tag keys as written, no "user:" prefix
        ("application", "costguard:job"),
        # Azure rows: keys as written, case kept ...
        ("CostAllocationTest", "costguard:job"),
        # ... and whitespace too: the sample holds both "org" and " org"
        (" org", " costguard:job"),
    ],
)
def test_the_real_samples_tags_group_by_job_when_spelled_as_costguards(
    run_cli: Callable[..., Any], tmp_path: Path, real: str, spelled: str
) -> None:
    """One of the sample's own tag keys renamed to costguard's, in that cloud's real
    spelling: the groups are pandas' groups of that tag, and rows without it are the
    untagged line."""
    text = gzip.decompress(SAMPLE.read_bytes()).decode()
    renamed = tmp_path / "focus.csv"
    renamed.write_text(text.replace(f'""{real}""', f'""{spelled}""'))
    document = spend(run_cli, str(renamed), "--by", "job", "--month", "2024-09")
    frame = sample_frame(renamed)
    frame = frame[frame["BillingPeriodStart"].str.startswith("2024-09")]

    def job(tags: str) -> str:
        found = json.loads(tags).get(spelled) if tags not in ("", "NULL") else None
        return found.strip() if found and found.strip() else "\0"

    theirs = frame.groupby(frame["Tags"].map(job))["billed"].sum().to_dict()
    theirs = {None if k == "\0" else k: v for k, v in theirs.items()}
    assert len(theirs) > 1
    assert_to_the_cent(groups(document), theirs)
    assert document["groups"][-1]["key"] is None  # the untagged line comes last


def test_every_real_tag_key_of_the_sample_is_read_as_spelled() -> None:
    """Each of the 31 keys the real sample's AWS, Azure and OCI rows spell (``ms:Department``,
    ``Cost department``, ``aks-managed-poolName``, `` org``...), asked for as written, is
    found on exactly the rows whose JSON holds it, with its value."""
    from pyarrow import csv

    from costguard.billing import exports
    from costguard.tags import tag_key

    column = csv.read_csv(SAMPLE, convert_options=csv.ConvertOptions(include_columns=["Tags"]))
    cells = [json.loads(c) if c != "NULL" else {} for c in column["Tags"].to_pylist()]
    keys = {key for cell in cells for key in cell}
    assert {"application", "business_unit", "ms:Department", " org"} <= keys
    assert len(keys) == 31
    for key in keys:
        found = exports._tag_values(column["Tags"], exports.TagMemo(key)).to_pylist()
        # "org" and " org" are one key to costguard; the sample gives both the same value
        theirs = [
            next((v.strip() for k, v in cell.items() if tag_key(k) == tag_key(key)), None)
            for cell in cells
        ]
        assert found == [t or None for t in theirs], key


def test_each_clouds_tag_spelling_credits_refunds_and_amortisation(
    run_cli: Callable[..., Any],
) -> None:
    document = spend(run_cli, str(HANDMADE), "--by", "job", "--month", "2026-11")
    assert groups(document) == {
        # AWS: two spot hours, the job's volume, one hour refunded (ChargeClass Correction)
        "llama-ft": Decimal("0.3817"),
        # the savings plan's covered hour bills 0; GCP labels spell costguard-job
        "bert-sweep": Decimal("0.86"),
        "whisper-eval": Decimal("1.92"),  # Azure
        # S3, the savings plan fee, the credit, tax, a disk costguard did not tag
        None: Decimal("52.253"),
    }
    assert groups(document, "effective_usd") == {
        "llama-ft": Decimal("0.3817"),
        "bert-sweep": Decimal("22.818"),  # the covered hour at its amortised 21.958
        "whisper-eval": Decimal("1.92"),
        None: Decimal("-20.747"),  # the plan's fee is spread over the usage it covers
    }
    assert document["total_billed_usd"] == "55.4147"
    assert document["total_effective_usd"] == "4.3727"
    # the days charged in the month asked (the export's October hour is not)
    assert (document["charges_from"], document["charges_to"]) == ("2026-11-01", "2026-11-07")


def test_owner_project_and_service_groupings(run_cli: Callable[..., Any]) -> None:
    owners = groups(spend(run_cli, str(HANDMADE), "--by", "owner", "--month", "2026-11"))
    assert owners == {"ana": Decimal("2.3017"), "li": Decimal("0.86"), None: Decimal("52.253")}
    projects = groups(spend(run_cli, str(HANDMADE), "--by", "project", "--month", "2026-11"))
    assert projects["my-lab-project"] == Decimal("0.86")
    assert projects["111122223333"] == Decimal("52.5247")
    services = groups(spend(run_cli, str(HANDMADE), "--by", "service", "--month", "2026-11"))
    assert services["Compute Savings Plans"] == Decimal(73)


def test_without_a_month_every_billing_period_is_summed(run_cli: Callable[..., Any]) -> None:
    document = spend(run_cli, str(HANDMADE), "--by", "job")
    assert document["period"] == "2026-10/2026-11"
    assert groups(document)["llama-ft"] == Decimal("0.6834")


def test_a_month_the_export_does_not_cover_is_refused(run_cli: Callable[..., Any]) -> None:
    result = run_cli("spend", str(HANDMADE), "--month", "2026-12")
    assert result.exit_code == 2
    assert "Error: the export does not cover 2026-12" in result.stderr
    assert "2026-10, 2026-11" in result.stderr
    assert "Hint: " in result.stderr


def test_mixed_currencies_are_refused_without_currency(run_cli: Callable[..., Any]) -> None:
    result = run_cli("spend", str(HANDMADE), str(EUR), "--month", "2026-11")
    assert result.exit_code == 2
    assert "Error: the export mixes currencies (EUR, USD)" in result.stderr
    assert "Hint: report one with --currency EUR" in result.stderr
    euros = spend(run_cli, str(HANDMADE), str(EUR), "--month", "2026-11", "--currency", "EUR")
    assert euros["currency"] == "EUR"
    assert groups(euros) == {"whisper-eval": Decimal("2.75"), None: Decimal("0.045")}
    dollars = spend(run_cli, str(HANDMADE), str(EUR), "--month", "2026-11", "--currency", "USD")
    assert dollars["total_billed_usd"] == "55.4147"
    unknown = run_cli("spend", str(EUR), "--currency", "GBP")
    assert unknown.exit_code == 2
    assert "no charges in GBP" in unknown.stderr


@pytest.mark.parametrize(
    ("header", "missing"),
    [
        ("date,amount,description\n2026-11-01,3.2,coffee\n", "BilledCost, BillingCurrency"),
        (
            "BilledCost,EffectiveCost,BillingCurrency,BillingPeriodStart,ChargePeriodStart\n"
            "1,1,USD,2026-11-01,2026-11-01\n",
            "lacks the column(s) Tags that --by job needs",
        ),
    ],
)
def test_a_file_that_is_not_a_billing_export_is_refused_naming_the_columns(
    run_cli: Callable[..., Any], tmp_path: Path, header: str, missing: str
) -> None:
    path = tmp_path / "export.csv"
    path.write_text(header)
    result = run_cli("spend", str(path), "--by", "job")
    assert result.exit_code == 2
    assert missing in result.stderr
    assert result.stderr.startswith("Error: ")
    assert "Hint: costguard spend reads FOCUS 1.0 exports" in result.stderr


def test_a_missing_file_or_folder_an_empty_folder_and_an_empty_glob_are_refused(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    """A path that is not there says so (issue 49: a missing folder said "no billing
    export files"); an empty folder or glob says there are no export files in it."""
    (tmp_path / "empty").mkdir()
    for source, said in (
        (tmp_path / "nope.csv", "nope.csv does not exist"),
        (tmp_path / "cur2" / "data", "cur2/data does not exist"),
        (tmp_path / "*.parquet", "no billing export files at"),
        (tmp_path / "empty", "no billing export files at"),
    ):
        result = run_cli("spend", str(source))
        assert result.exit_code == 2
        assert f"Error: {tmp_path}" in result.stderr or "Error: no billing" in result.stderr
        assert said in result.stderr, source


def test_folders_and_globs_read_every_data_file_once(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    folder = tmp_path / "exports" / "BILLING_PERIOD=2026-11"
    folder.mkdir(parents=True)
    shutil.copy(HANDMADE, folder / "part-1.csv")
    with gzip.open(folder / "part-2.csv.gz", "wb") as gz:
        gz.write(HANDMADE.read_bytes())
    (folder / "export-Manifest.json").write_text('{"reportId": "x"}')
    by_folder = spend(run_cli, str(tmp_path / "exports"), "--month", "2026-11")
    assert by_folder["total_billed_usd"] == str(2 * Decimal("55.4147"))
    assert len(by_folder["files"]) == 2
    by_glob = spend(run_cli, str(folder / "*.csv*"), "--month", "2026-11")
    assert by_glob["total_billed_usd"] == by_folder["total_billed_usd"]


def test_table_and_csv_outputs(run_cli: Callable[..., Any]) -> None:
    table = run_cli("spend", str(HANDMADE), "--month", "2026-11")
    assert table.exit_code == 0, table.stderr
    assert "(untagged)" in table.stdout
    assert "$55.41" in table.stdout
    assert "-$20.75" in table.stdout  # the untagged line's effective cost: credit, no fee
    assert "llama-ft" in table.stdout
    rows = run_cli("spend", str(HANDMADE), "--month", "2026-11", "--format", "csv")
    assert rows.exit_code == 0, rows.stderr
    lines = rows.stdout.splitlines()
    assert lines[0] == "key,billed_usd,effective_usd"
    assert "llama-ft,0.3817,0.3817" in lines
    assert ",52.253,-20.747" in lines  # the untagged line: an empty key


STREAM = """
import sys
import pyarrow as pa
from costguard.billing import exports
exports.CSV_BLOCK_BYTES = 1 << 20
tally = exports.read_spend([sys.argv[1]], "job")
print(sum(tally.counts.values()), pa.default_memory_pool().max_memory())
"""


def test_a_csv_gz_export_is_streamed_in_bounded_memory(tmp_path: Path) -> None:
    """CSV.gz read in 1 MiB blocks: pyarrow's peak does not grow with the file (60 MB and
    150 MB uncompressed) and stays a fraction of it, where reading it whole would hold
    all of it."""
    header, *rows = HANDMADE.read_text().splitlines()
    body = "\n".join(rows[:-1]) + "\n"
    peaks = []
    for size in (60_000_000, 150_000_000):
        path = tmp_path / f"big-{size}.csv.gz"
        copies = size // len(body) + 1
        with gzip.open(path, "wt", compresslevel=1) as gz:
            gz.write(header + "\n")
            for _ in range(copies):
                gz.write(body)
        out = subprocess.run(
            [sys.executable, "-c", STREAM, str(path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        count, peak = map(int, out.stdout.split())
        assert count == copies * len(rows[:-1])
        peaks.append(peak)
    assert peaks[1] < peaks[0] * 1.25, peaks
    assert peaks[1] < 150_000_000 / 3, peaks


def test_the_notebook_api_returns_a_dataframe_of_exact_decimals() -> None:
    import costguard

    frame = costguard.spend(str(HANDMADE), by="owner", month="2026-11")
    assert list(frame.columns) == ["key", "billed_usd", "effective_usd"]
    keys = [None if pd.isna(k) else k for k in frame["key"]]  # untagged: pandas' missing
    assert dict(zip(keys, frame["billed_usd"], strict=True)) == {
        "ana": Decimal("2.3017"),
        "li": Decimal("0.86"),
        None: Decimal("52.253"),
    }
    assert frame.attrs["total_billed_usd"] == Decimal("55.4147")
    assert (frame.attrs["currency"], frame.attrs["period"]) == ("USD", "2026-11")


def test_plot_draws_the_spend_to_date_against_the_budget(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    """November's charges day by day (the fee, credit and tax on the 1st, the jobs' days
    after): the line climbs to the month's 55.4147 and the budget line sits at 100."""
    from costguard.plots import BUDGET_COLOR, COST_COLOR
    from tests.helpers.output import read_png
    from tests.test_plots import height_of, rgb

    picture = tmp_path / "nov.png"
    result = run_cli(
        "spend", str(HANDMADE), "--month", "2026-11", "--plot", str(picture), "--budget", "100"
    )
    assert result.exit_code == 0, result.stderr
    assert f"Picture: {picture}" in result.stderr
    png = read_png(picture)
    top = 150.0  # _top: a round number 10% above the budget
    red = png.rows_with(rgb(BUDGET_COLOR), least=png.width // 3)
    assert height_of(png, sum(red) / len(red)) == pytest.approx(100 / top, abs=0.01)
    blue = rgb(COST_COLOR)
    highest = min(y for y, row in enumerate(png.rows) if blue in row)
    assert height_of(png, highest) == pytest.approx(55.4147 / top, abs=0.015)
    alone = run_cli("spend", str(HANDMADE), "--budget", "100")
    assert alone.exit_code == 2
    assert "Error: --budget is the line --plot draws" in alone.stderr
