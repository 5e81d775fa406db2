"""Ask the provider where a bucket is (``estimate --data URL``). I/O at the edge.

S3 answers an anonymous ``HEAD`` on a bucket with its region in the
``x-amz-bucket-region`` header (on 200, and on 403 for a private bucket), so no SDK and
no credentials are needed; ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` point it at
another endpoint (path-style). Cloud Storage and Azure Blob do not tell an anonymous
caller where a bucket is: for them, and when S3 cannot be reached within
:data:`TIMEOUT_S`, :func:`locate` falls back to the table of well-known datasets, or
asks for ``--data-region``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from costguard.errors import InputError
from costguard.pricing.datasets import DataLocation, known_region, parse_data_url

#: One short timeout for the lookup: an estimate must not hang on a slow network.
TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class Located:
    """Where the data is, and how that was found out."""

    provider: str
    region: str
    how: str  # in words, for the estimate's notes


def s3_bucket_region(bucket: str, timeout_s: float = TIMEOUT_S) -> str | None:
    """The region S3 says ``bucket`` is in, or ``None`` (no such bucket, no answer)."""
    # Imported here: urllib.request pulls in http.client, email and ssl, a third of the
    # start-up of a `costguard estimate` that looks nothing up.
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    quoted = quote(bucket, safe="")
    # An endpoint of one's own is addressed path-style; AWS's own, virtual-host style.
    url = f"{endpoint.rstrip('/')}/{quoted}" if endpoint else f"https://{quoted}.s3.amazonaws.com/"
    if urlsplit(url).scheme not in ("http", "https"):
        return None
    request = urllib.request.Request(url, method="HEAD")  # noqa: S310 - http(s) only
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            region = response.headers.get("x-amz-bucket-region")
    except urllib.error.HTTPError as exc:
        region = exc.headers.get("x-amz-bucket-region") if exc.headers else None
    except (urllib.error.URLError, TimeoutError, OSError):
        return None
    return str(region) if region else None


def locate(url: str, *, timeout_s: float = TIMEOUT_S) -> Located:
    """Where the data at ``url`` is: the region in the URL, else the provider's answer
    (S3), else the table of well-known datasets; :class:`InputError` asking for
    ``--data-region`` when none knows."""
    location: DataLocation = parse_data_url(url)
    if location.region:
        return Located(location.provider, location.region, f"{url} names its region")
    if location.provider == "aws":
        region = s3_bucket_region(location.bucket, timeout_s)
        if region:
            return Located("aws", region, f"S3 says bucket {location.bucket} is in {region}")
    known = known_region(location)
    if known is not None:
        return Located(
            known.provider, known.region, f"{known.name} is in {known.region} ({known.source})"
        )
    msg = f"cannot find out which region {url} is in"
    hint = "give it: --data-region REGION (the bucket's region, e.g. us-west-2)"
    if location.provider == "aws":
        hint = f"S3 did not answer within {timeout_s:g} s, and it is not a known dataset: {hint}"
    raise InputError(msg, hint=hint)
