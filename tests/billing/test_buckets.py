"""costguard spend reads exports in place in a bucket: S3 through moto's server over HTTP
(the standard AWS_ENDPOINT_URL), as AWS Data Exports deliver them
(``s3://bucket/prefix/export-name/data/BILLING_PERIOD=YYYY-MM/...``), and refuses a bucket
path with nothing there."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pyarrow.parquet as pq
from botocore.config import Config

from tests.billing.test_cur_gcp import cur2_table
from tests.billing.test_focus import HANDMADE, groups, spend

PREFIX = "exports/costguard-focus/data/BILLING_PERIOD=2026-11"


def test_spend_reads_focus_csv_gz_and_cur_parquet_in_an_s3_bucket(
    aws_env: str, run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    s3 = boto3.client("s3", config=Config(retries={"max_attempts": 1}))
    s3.create_bucket(Bucket="lab-bills")
    s3.put_object(
        Bucket="lab-bills",
        Key=f"{PREFIX}/costguard-focus-00001.csv.gz",
        Body=gzip.compress(HANDMADE.read_bytes()),
    )
    s3.put_object(Bucket="lab-bills", Key=f"{PREFIX}/costguard-focus-Manifest.json", Body=b"{}")
    local = tmp_path / "cur2.parquet"
    pq.write_table(cur2_table(), local)
    s3.put_object(Bucket="lab-bills", Key="cur2/data/cur2-00001.parquet", Body=local.read_bytes())

    folder = spend(run_cli, "s3://lab-bills/exports/", "--by", "job", "--month", "2026-11")
    assert folder["files"] == [f"s3://lab-bills/{PREFIX}/costguard-focus-00001.csv.gz"]
    assert folder["total_billed_usd"] == "55.4147"
    assert groups(folder)["llama-ft"].to_eng_string() == "0.3817"

    parquet = spend(run_cli, "s3://lab-bills/cur2/data/*.parquet", "--by", "owner")
    assert str(groups(parquet)["ana"]) == "1.306"


def test_an_empty_bucket_prefix_is_refused(aws_env: str, run_cli: Callable[..., Any]) -> None:
    s3 = boto3.client("s3", config=Config(retries={"max_attempts": 1}))
    s3.create_bucket(Bucket="lab-bills")
    result = run_cli("spend", "s3://lab-bills/nothing-here/")
    assert result.exit_code == 2
    assert "Error: no billing export files at s3://lab-bills/nothing-here/" in result.stderr
    assert "Hint: " in result.stderr
