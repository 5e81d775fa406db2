"""Where data lives, from its URL: compute next to the data pays no transfer. Pure.

``s3://bucket/key``, ``gs://bucket/key``, ``az://container/path`` (or ``abfs://``) and the
https forms of the three object stores are read into a :class:`DataLocation` (provider,
bucket, and the region when the URL itself says it, as ``s3.us-west-2.amazonaws.com``
does). :func:`known_region` looks the URL up in ``datasets.csv``, a table of well-known
public datasets with their regions and sources (AWS Open Data, Google public datasets,
Microsoft Planetary Computer), for when the provider cannot be asked.
:mod:`costguard.pricing.locate` asks the provider.
"""

from __future__ import annotations

import csv
import re
import urllib.parse
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from costguard.errors import InputError
from costguard.pricing.tables import bundled_tables_dir

_S3_HOST = re.compile(
    r"(?:(?P<vhost>[a-z0-9.-]+)\.)?s3(?:[.-](?P<region>[a-z]{2}(?:-gov)?-[a-z]+-[0-9]))?"
    r"\.amazonaws\.com"
)
_AZURE_HOST = re.compile(r"(?P<account>[a-z0-9]+)\.(?:blob|dfs)\.core\.windows\.net")


@dataclass(frozen=True, slots=True)
class DataLocation:
    """Where a URL points: provider, bucket (or Azure account/container), and the region
    when the URL names it."""

    url: str
    provider: str
    bucket: str
    region: str | None = None
    key: str = ""  # the path inside the bucket

    @property
    def canonical(self) -> str:
        """The URL as ``s3://``, ``gs://`` or ``https://ACCOUNT.blob.core.windows.net/``.

        >>> parse_data_url("https://mur-sst.s3.amazonaws.com/zarr-v1").canonical
        's3://mur-sst/zarr-v1'
        """
        if self.provider == "azure":
            account, _, container = self.bucket.partition("/")
            base = f"https://{account}.blob.core.windows.net"
            return "/".join(p for p in (base, container, self.key) if p)
        scheme = "s3" if self.provider == "aws" else "gs"
        return f"{scheme}://{self.bucket}/{self.key}".rstrip("/")


@dataclass(frozen=True, slots=True)
class KnownDataset:
    """A public dataset whose region is known, with where that was read."""

    url: str
    provider: str
    region: str
    name: str
    source: str


def parse_data_url(url: str) -> DataLocation:
    """Read a data URL.

    >>> parse_data_url("s3://mur-sst/zarr-v1")  # doctest: +NORMALIZE_WHITESPACE
    DataLocation(url='s3://mur-sst/zarr-v1', provider='aws', bucket='mur-sst', region=None,
                 key='zarr-v1')
    >>> parse_data_url("https://sentinel-cogs.s3.us-west-2.amazonaws.com/x").region
    'us-west-2'
    >>> parse_data_url("https://cpdataeuwest.blob.core.windows.net/era5/x").bucket
    'cpdataeuwest/era5'
    """
    parts = urllib.parse.urlsplit(url.strip())
    scheme, host, path = parts.scheme.lower(), (parts.hostname or "").lower(), parts.path
    first, _, rest = path.lstrip("/").partition("/")
    whole = path.strip("/")
    if scheme in ("s3", "s3a") and host:
        return DataLocation(url, "aws", host, key=whole)
    if scheme == "gs" and host:
        return DataLocation(url, "gcp", host, key=whole)
    if scheme in ("az", "abfs", "abfss", "azure") and host:
        return DataLocation(url, "azure", host.split("@")[0], key=whole)
    if scheme in ("http", "https"):
        s3 = _S3_HOST.fullmatch(host)
        if s3 and s3["vhost"]:
            return DataLocation(url, "aws", s3["vhost"], s3["region"], whole)
        if s3 and first:
            return DataLocation(url, "aws", first, s3["region"], rest.strip("/"))
        if host == "storage.googleapis.com" and first:
            return DataLocation(url, "gcp", first, key=rest.strip("/"))
        azure = _AZURE_HOST.fullmatch(host)
        if azure:
            bucket = f"{azure['account']}/{first}" if first else azure["account"]
            return DataLocation(url, "azure", bucket, key=rest.strip("/"))
    msg = f"cannot tell where {url} is stored"
    raise InputError(
        msg,
        hint="use s3://bucket/..., gs://bucket/..., az://container/... or an https URL of "
        "S3, Cloud Storage or Azure Blob; or give --data-region",
    )


@cache
def known_datasets(path: Path | None = None) -> tuple[KnownDataset, ...]:
    """The table of well-known public datasets (``datasets.csv`` next to the price
    tables)."""
    path = path or bundled_tables_dir() / "datasets.csv"
    with path.open(newline="", encoding="utf-8") as handle:
        return tuple(
            KnownDataset(
                row["url"].rstrip("/"), row["provider"], row["region"], row["name"], row["source"]
            )
            for row in csv.DictReader(handle)
        )


def known_region(location: DataLocation) -> KnownDataset | None:
    """The known dataset ``location`` belongs to, by the longest matching URL prefix
    (an https URL of the same bucket counts as its ``s3://`` or ``gs://`` form).

    >>> known_region(parse_data_url("s3://mur-sst/zarr-v1")).region
    'us-west-2'
    >>> known_region(parse_data_url("s3://my-own-bucket/x")) is None
    True
    """
    forms = {location.url.rstrip("/"), location.canonical}
    best: KnownDataset | None = None
    for dataset in known_datasets():
        if dataset.provider != location.provider:
            continue
        for form in forms:
            if (form == dataset.url or form.startswith(dataset.url + "/")) and (
                best is None or len(dataset.url) > len(best.url)
            ):
                best = dataset
    return best
