"""`estimate --data URL`: where the data lives, from the provider (S3 through moto) or
the table of well-known datasets, and the transfer each option implies."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from decimal import Decimal

import boto3
import pytest

from costguard.errors import InputError
from costguard.pricing.datasets import known_region, parse_data_url
from costguard.pricing.locate import locate


@pytest.fixture
def silent_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An S3 endpoint on loopback that accepts connections and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        yield url


def make_bucket(name: str, region: str) -> None:
    client = boto3.client("s3", region_name=region)
    client.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": region})


@pytest.mark.parametrize("region", ["us-west-2", "eu-west-1"])
def test_a_bucket_is_located_by_s3(run_cli, aws_env: str, region: str) -> None:
    make_bucket("lab-data", region)
    result = run_cli(
        "estimate",
        "--gpu",
        "a10g",
        "--hours",
        "8",
        "--data",
        "s3://lab-data/run1",
        "--data-gb",
        "500",
        "--format",
        "json",
        "--top",
        "0",
    )
    assert result.exit_code == 0, result.stderr
    document = result.json()
    assert document["query"]["data_region"] == f"aws:{region}"
    assert f"S3 says bucket lab-data is in {region}" in document["query"]["data"]
    by_place = {(o["region"], o["market"]): o for o in document["options"]}
    assert Decimal(by_place[(region, "on-demand")]["data_transfer_usd"]) == 0
    assert all(
        Decimal(o["data_transfer_usd"]) > 0 for o in document["options"] if o["region"] != region
    )
    assert any("next to the data" in note for note in document["notes"])


def test_well_known_datasets_are_located_offline(silent_endpoint: str) -> None:
    mur = locate("s3://mur-sst/zarr-v1", timeout_s=0.5)  # S3 does not answer: the table does
    assert (mur.provider, mur.region) == ("aws", "us-west-2")
    assert "registry.opendata.aws/mur" in mur.how
    era5 = locate("https://cpdataeuwest.blob.core.windows.net/era5/2020/x.zarr")
    assert (era5.provider, era5.region) == ("azure", "westeurope")
    arco = locate("gs://gcp-public-data-arco-era5/ar/full.zarr")
    assert arco.provider == "gcp"
    with pytest.raises(InputError) as info:
        locate("s3://someone-elses-bucket/x", timeout_s=0.5)
    assert "--data-region" in (info.value.hint or "")
    assert "0.5 s" in (info.value.hint or "")


def test_url_forms() -> None:
    assert parse_data_url("https://mur-sst.s3.amazonaws.com/zarr-v1").bucket == "mur-sst"
    assert parse_data_url("https://s3.us-west-2.amazonaws.com/mur-sst/x").region == "us-west-2"
    assert parse_data_url("https://storage.googleapis.com/bucket/x").provider == "gcp"
    assert parse_data_url("az://container/path").provider == "azure"
    https_mur = parse_data_url("https://mur-sst.s3.amazonaws.com/zarr-v1")
    assert known_region(https_mur) is not None
    with pytest.raises(InputError):
        parse_data_url("ftp://example.org/data")


def test_unknown_data_asks_for_the_region(run_cli, silent_endpoint: str) -> None:
    result = run_cli("estimate", "--gpu", "a10g", "--hours", "1", "--data", "gs://my-lab/x")
    assert result.exit_code == 2
    assert "--data-region" in result.stderr


def test_data_region_given_wins_without_a_lookup(run_cli, silent_endpoint: str) -> None:
    result = run_cli(
        "estimate",
        "--gpu",
        "a10g",
        "--hours",
        "1",
        "--data",
        "s3://my-lab/x",
        "--data-region",
        "us-east-1",
        "--data-gb",
        "10",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.stderr
    assert result.json()["query"]["data_region"] == "aws:us-east-1"
