"""costguard spend reads exports in place in a bucket: S3 through moto's server over HTTP
(the standard AWS_ENDPOINT_URL), as AWS Data Exports deliver them
(``s3://bucket/prefix/export-name/data/BILLING_PERIOD=YYYY-MM/...``), Azure Blob through
Azurite and GCS through gcp-storage-emulator (the ``backend`` fixture of
tests/helpers/stores.py), and refuses a bucket path with nothing there."""

from __future__ import annotations

import gzip
import importlib
import json
import os
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3
import pyarrow.parquet as pq
import pytest
from botocore.config import Config

from costguard.checkpoint.store import storage_options_from_env
from tests.billing.test_cur_gcp import cur2_table
from tests.billing.test_focus import HANDMADE, groups, spend
from tests.helpers.processes import free_port
from tests.helpers.stores import Backend

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


@pytest.mark.parametrize("backend", ["azure", "gcs"], indirect=True)
def test_spend_reads_exports_in_azure_blob_and_gcs_buckets(
    backend: Backend, run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    """Azure Cost Management writes its exports to a storage container, GCP's BigQuery
    export is extracted to a bucket: a folder of CSV.gz and Parquet read in place."""
    local = tmp_path / "cur2.parquet"
    pq.write_table(cur2_table(), local)
    options = storage_options_from_env() or {}
    fsspec = importlib.import_module("fsspec")  # untyped; mypy need not know it
    files = {
        "focus/2026-11/part-0.csv.gz": gzip.compress(HANDMADE.read_bytes()),
        "focus/2026-11/part-1.parquet": local.read_bytes(),
        "focus/2026-11/manifest.json": b"{}",
    }
    for name, body in files.items():
        with fsspec.open(f"{backend.url}/{name}", "wb", **options) as out:
            out.write(body)
    document = spend(run_cli, f"{backend.url}/focus/", "--by", "owner", "--month", "2026-11")
    assert [f.rsplit("/", 1)[-1] for f in document["files"]] == ["part-0.csv.gz", "part-1.parquet"]
    assert document["files"][0].startswith(backend.url.split("://")[0] + "://")
    assert groups(document)["ana"] == Decimal("2.3017") + Decimal("1.306")
    missing = run_cli("spend", f"{backend.url}/nothing-here/")
    assert missing.exit_code == 2
    assert "Error: no billing export files at" in missing.stderr


def test_an_empty_bucket_prefix_is_refused(aws_env: str, run_cli: Callable[..., Any]) -> None:
    s3 = boto3.client("s3", config=Config(retries={"max_attempts": 1}))
    s3.create_bucket(Bucket="lab-bills")
    result = run_cli("spend", "s3://lab-bills/nothing-here/")
    assert result.exit_code == 2
    assert "Error: no billing export files at s3://lab-bills/nothing-here/" in result.stderr
    assert "Hint: " in result.stderr


def test_alarm_status_sets_an_exports_month_against_the_budget(
    aws_env: str, run_cli: Callable[..., Any], monkeypatch: Any
) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # moto answers unimplemented calls with 500
    assert run_cli("alarm", "--budget", "200", "--email", "me@uni.edu").exit_code == 0
    document = run_cli("alarm", "status", "--export", str(HANDMADE), "--format", "json").json()
    assert document["export"] == {
        "period": "2026-11",  # the export's latest billing month
        "currency": "USD",
        "billed_usd": "55.4147",
        "budget_usd": "200",
        "percent_of_budget": "27.7",
        "charges_to": "2026-11-07",
        "charges": 14,
        "charges_in_export": 15,
    }
    table = run_cli("alarm", "status", "--export", str(HANDMADE))
    assert table.exit_code == 0, table.stderr
    assert (
        "Billed in 2026-11, the export's latest month (14 of its 15 charges, to 2026-11-07): "
        "$55.41, 28% of the $200.00"
    ) in table.stdout
    refused = run_cli("alarm", "status", "--export", str(HANDMADE.with_name("nope.csv")))
    assert refused.exit_code == 2
    assert "nope.csv does not exist" in refused.stderr


#: Where each backend's endpoint or credentials live in the environment, and the same as
#: fsspec options (s3fs, adlfs, gcsfs keyword arguments).
_ONLY_IN_OPTIONS = {
    "s3": ("AWS_ENDPOINT_URL", "endpoint_url"),
    "azure": ("AZURE_STORAGE_CONNECTION_STRING", "connection_string"),
    "gcs": ("STORAGE_EMULATOR_HOST", "endpoint_url"),
}


@pytest.mark.parametrize("backend", ["s3", "azure", "gcs"], indirect=True)
def test_spend_reads_buckets_with_the_storage_options_of_costguard_storage_options(
    backend: Backend, run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """COSTGUARD_STORAGE_OPTIONS, the JSON fsspec options the checkpoint store takes, is
    what spend reads a bucket with too: the endpoint (S3, GCS) or the connection string
    (Azure) is given there alone, not in the variables the SDKs read."""
    variable, option = _ONLY_IN_OPTIONS[backend.name]
    options = {**(storage_options_from_env() or {}), option: os.environ[variable]}
    if backend.name == "gcs":
        options["token"] = "anon"
    fsspec = importlib.import_module("fsspec")  # untyped; mypy need not know it
    url = f"{backend.url}/focus/part-0.csv"
    with fsspec.open(url, "wb", **options) as out:
        out.write(HANDMADE.read_bytes())
    monkeypatch.delenv(variable)
    monkeypatch.setenv("COSTGUARD_STORAGE_OPTIONS", json.dumps(options))
    document = spend(run_cli, f"{backend.url}/focus/", "--by", "owner", "--month", "2026-11")
    assert document["files"] == [url]
    assert groups(document)["ana"] == Decimal("2.3017")


def test_a_bucket_that_does_not_answer_is_said_so(
    aws_env: str, run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endpoint in COSTGUARD_STORAGE_OPTIONS where nothing listens: a one-line error
    naming the URL and where the endpoint came from, not a crash."""
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    closed = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("COSTGUARD_STORAGE_OPTIONS", json.dumps({"endpoint_url": closed}))
    result = run_cli("spend", "s3://lab-bills/focus/")
    assert result.exit_code == 1
    assert "Error: could not read s3://lab-bills/focus/: " in result.stderr
    assert "COSTGUARD_STORAGE_OPTIONS" in result.stderr
    assert "unexpected" not in result.stderr
