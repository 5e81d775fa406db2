"""AWS prices: the Price List Query API (on-demand) and EC2 spot price history.

* On-demand: the boto3 ``pricing`` client, ``get_products`` for ``AmazonEC2`` with
  filters for Linux, shared tenancy, no pre-installed software, used capacity, the
  region (``regionCode``) and the table's instance types (``ANY_OF``), paged with
  ``NextToken``. The Price List is served from us-east-1; ``AWS_ENDPOINT_URL_PRICING``
  points boto3 elsewhere (a proxy, a test server).
* Spot: ``describe_spot_price_history`` in each region for Linux/UNIX from now, which
  answers the price in effect in each zone; the lowest over the zones is kept.

Clients come from :func:`costguard.clouds.aws.client` with one attempt and botocore's
standard mode (no client-side rate limiting): :mod:`costguard.retry`
retries throttling and 5xx with backoff, as for the other providers.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import date, datetime
from functools import partial
from pathlib import Path
from typing import Any

from costguard.clouds import aws, pages, require
from costguard.errors import CostguardError
from costguard.pricing.catalog import Market
from costguard.pricing.refresh import mirror as mirrors
from costguard.pricing.refresh.merge import FreshPrices, Target
from costguard.pricing.refresh.parse import Dated
from costguard.pricing.refresh.parse_aws import (
    AWS_LINUX_ATTRIBUTES,
    aws_offer_products,
    aws_ondemand,
    aws_prices,
    aws_spot,
)
from costguard.pricing.refresh.progress import RecordCounter
from costguard.retry import (
    API_RETRY,
    RetryPolicy,
    Transient,
    call_with_retry,
    parse_retry_after,
)
from costguard.settings import Settings

PRICING_REGION = "us-east-1"
#: Longest ``Value`` of a Price List filter; the ANY_OF list of instance types is cut
#: into chunks that fit.
FILTER_VALUE_MAX = 1024
SPOT_TYPES_PER_CALL = 100
#: A bound on every paged loop (a server that never stops paging is a fault).
MAX_PAGES = 10_000
#: What EC2 answers in an opt-in region (af-south-1, ap-east-1, me-south-1, ...) an account
#: has not enabled.
_REGION_NOT_ENABLED = {"OptInRequired", "AuthFailure", "UnrecognizedClientException"}
_THROTTLING = {
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
}


def fetch(
    target: Target,
    settings: Settings,
    *,
    now: datetime,
    mirror: Path | None = None,
    retry: RetryPolicy | None = None,
    progress: Callable[[int], object] | None = None,
) -> FreshPrices:
    """Fresh AWS prices for ``target`` from the APIs, or from ``mirror`` when given.

    Raises :class:`~costguard.errors.CostguardError` saying what failed.
    """
    del settings  # boto3 takes endpoints and credentials from the standard AWS settings
    count = RecordCounter(progress)
    dated: Dated = {}
    days: dict[str, date] = {}
    if mirror is not None:
        spot_files = mirrors.files(mirror, "aws", "spot")
        ondemand = aws_ondemand(count(_products_in(mirrors.pages(mirror, "aws", "pricing"))), dated)
        spot = aws_spot(
            count(
                record
                for page in mirrors.pages(mirror, "aws", "spot")
                for record in mirrors.records(page, "SpotPriceHistory", "AWS")
            ),
            dated,
        )
        markets = frozenset(Market) if spot_files else frozenset({Market.ON_DEMAND})
        source = f"AWS Price List and EC2 spot price history responses in {mirror / 'aws'}"
    else:
        policy = retry or API_RETRY
        try:
            pricing = aws.client("pricing", PRICING_REGION, attempts=1, mode="standard")
            ondemand = aws_ondemand(count(_live_products(pricing, target, policy)))
            spot = {}
            endpoints = set()
            not_enabled: list[str] = []
            for region in target.regions:
                ec2 = aws.client("ec2", region, attempts=1, mode="standard")
                endpoints.add(ec2.meta.endpoint_url)
                types = target.instance_types(region)
                try:
                    spot.update(aws_spot(count(_live_spot(ec2, types, now, policy))))
                except aws.errors() as exc:
                    if aws.error_code(exc) not in _REGION_NOT_ENABLED:
                        raise
                    # An opt-in region this account has not enabled: its spot prices
                    # cannot be read (on-demand comes from the Price List all the same).
                    not_enabled.append(region)
        except aws.errors() as exc:
            raise aws.translate(exc, "reading AWS prices") from None
        except (http.client.HTTPException, OSError) as exc:
            msg = f"the connection to AWS failed while reading AWS prices: {exc!r}"
            raise CostguardError(
                msg, hint="check the network, and AWS_ENDPOINT_URL* if you set them"
            ) from None
        markets = frozenset(Market)
        where = endpoints.pop() if len(endpoints) == 1 else "per-region endpoints"
        source = (
            f"AWS Price List Query API GetProducts ({pricing.meta.endpoint_url}) and "
            f"EC2 DescribeSpotPriceHistory ({where})"
        )
        if not_enabled:
            skipped = ", ".join(not_enabled)
            source += f"; no spot prices from {skipped} (not enabled for this account)"
    rows = aws_prices(ondemand, spot, target.rows, dated, spot_by_family=mirror is not None)
    if mirror is not None:
        days = mirrors.as_of(mirror, "aws", target.regions, rows.dated)
    return target.read(
        rows, source=source, fetched_at=now, records=count.total, dated=days, markets=markets
    )


def _products_in(pages: Iterator[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """Products of GetProducts responses (the API sends each as a JSON string), or of
    bulk offer files (a mirror may hold a region's public offer file instead)."""
    for page in pages:
        if "PriceList" not in page and "products" in page:
            yield from aws_offer_products(page)
            continue
        if "PriceList" not in page and (error := mirrors.api_error(page)) is not None:
            msg = f"the AWS Price List API answered an error instead of prices: {error}"
            raise CostguardError(msg, hint="fix what the message says, then try again")
        items = page.get("PriceList") or []
        if not isinstance(items, list):
            msg = "a GetProducts response's PriceList is not a list"
            raise CostguardError(msg, hint="download that response again, or try again later")
        for item in items:
            product = json.loads(item) if isinstance(item, str) else item
            if isinstance(product, Mapping):
                yield product


def _live_products(client: Any, target: Target, policy: RetryPolicy) -> Iterator[Mapping[str, Any]]:
    for region in target.regions:
        for chunk in _chunks(target.instance_types(region), FILTER_VALUE_MAX):
            filters = [
                {"Type": "TERM_MATCH", "Field": field, "Value": value}
                for field, value in (*AWS_LINUX_ATTRIBUTES.items(), ("regionCode", region))
            ]
            filters.append({"Type": "ANY_OF", "Field": "instanceType", "Value": ",".join(chunk)})
            request = {
                "ServiceCode": "AmazonEC2",
                "Filters": filters,
                "FormatVersion": "aws_v1",
                "MaxResults": 100,
            }
            yield from _products_in(_pages(client.get_products, request, policy))


def _live_spot(
    client: Any, instance_types: Sequence[str], now: datetime, policy: RetryPolicy
) -> Iterator[Mapping[str, Any]]:
    for start in range(0, len(instance_types), SPOT_TYPES_PER_CALL):
        request = {
            "InstanceTypes": list(instance_types[start : start + SPOT_TYPES_PER_CALL]),
            "ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
            "StartTime": now,
            "MaxResults": 1000,
        }
        for page in _pages(client.describe_spot_price_history, request, policy):
            yield from mirrors.records(page, "SpotPriceHistory", "AWS")


def _pages(
    operation: Callable[..., Mapping[str, Any]], request: Mapping[str, Any], policy: RetryPolicy
) -> Iterator[Mapping[str, Any]]:
    """Every page of a ``NextToken``-paged operation, each call retried on throttling
    (:func:`costguard.clouds.pages` stops a server that repeats a token or never ends)."""

    def fetch(token: str | None) -> tuple[list[Mapping[str, Any]], str | None]:
        kwargs = {**request, **({"NextToken": token} if token else {})}
        page = call_with_retry(partial(operation, **kwargs), _transient, policy)
        return [page], page.get("NextToken") or None

    return pages(fetch, max_pages=MAX_PAGES)


def _transient(exc: Exception) -> Transient | None:
    """Throttling, 5xx and dropped connections are worth another try."""
    exceptions = require("botocore.exceptions", aws.EXTRA)
    if isinstance(exc, exceptions.ClientError):
        metadata = exc.response.get("ResponseMetadata", {})
        code = aws.error_code(exc)
        status = metadata.get("HTTPStatusCode")
        if code in _THROTTLING or status in (429, 500, 502, 503, 504):
            retry_after = metadata.get("HTTPHeaders", {}).get("retry-after")
            return Transient(code or f"HTTP {status}", parse_retry_after(retry_after))
        return None
    if isinstance(exc, exceptions.ConnectionError | exceptions.HTTPClientError):
        return Transient(str(exc))
    return None


def _chunks(values: Sequence[str], max_chars: int) -> Iterator[list[str]]:
    """``values`` in runs whose comma-joined text fits in ``max_chars``."""
    chunk: list[str] = []
    length = 0
    for value in values:
        extra = len(value) + (1 if chunk else 0)
        if chunk and length + extra > max_chars:
            yield chunk
            chunk, length = [], 0
            extra = len(value)
        chunk.append(value)
        length += extra
    if chunk:
        yield chunk
