"""GCP prices: the Cloud Billing Catalog API, Compute Engine SKUs.

``CloudCatalogClient.list_skus`` (google-cloud-billing) for ``services/6F81-5844-456A``
in USD, page by page (``next_page_token``), each page retried on throttling and
unavailability. The catalog has no server-side filter, so every Compute Engine SKU is
read (tens of thousands): the client speaks gRPC, whose answers are parsed into protobuf
in C (its REST transport parses JSON into protobuf in Python, ~4,000 SKUs/s), and each SKU
is read field by field off the raw message. :mod:`costguard.pricing.refresh.parse_gcp` keeps
the vCPU, RAM and GPU SKUs and sums them per machine type. ``Settings.gcp_endpoint``
points the client elsewhere (a private endpoint over TLS, a local server on loopback:
see :func:`costguard.clouds.gcp.grpc_target`); credentials are Application Default
Credentials.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import date, datetime
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

from costguard.clouds import READ_TIMEOUT_S, gcp, pages, require
from costguard.errors import CostguardError
from costguard.pricing.catalog import Market
from costguard.pricing.refresh import mirror as mirrors
from costguard.pricing.refresh.merge import FreshPrices, Target
from costguard.pricing.refresh.parse import CurrencyError, Dated
from costguard.pricing.refresh.parse_gcp import (
    GCP_COMPUTE_SERVICE,
    GcpSku,
    gcp_currency,
    gcp_may_price_vm,
    gcp_money,
    gcp_prices,
    gcp_sku_from_json,
    gcp_unit_prices,
)
from costguard.pricing.refresh.progress import RecordCounter
from costguard.retry import API_RETRY, RetryPolicy, Transient, call_with_retry
from costguard.settings import Settings

DEFAULT_ENDPOINT = "https://cloudbilling.googleapis.com"
#: The most SKUs the API returns per page.
PAGE_SIZE = 5000
MAX_PAGES = 10_000


def fetch(
    target: Target,
    settings: Settings,
    *,
    now: datetime,
    mirror: Path | None = None,
    retry: RetryPolicy | None = None,
    progress: Callable[[int], object] | None = None,
    credentials: Any = None,
) -> FreshPrices:
    """Fresh GCP prices for ``target`` from the Catalog API, or from ``mirror``.

    ``credentials`` (google-auth) default to Application Default Credentials. Raises
    :class:`~costguard.errors.CostguardError` saying what failed.
    """
    count = RecordCounter(progress)
    dated: Dated = {}
    days: dict[str, date] = {}
    if mirror is not None:
        records = (
            record
            for page in mirrors.pages(mirror, "gcp", "skus")
            for record in mirrors.records(page, "skus", "GCP Cloud Billing Catalog")
        )
        currencies: set[str] = set()

        def vm_skus() -> Iterator[GcpSku]:
            for record in count(records):
                if gcp_may_price_vm(
                    str(record.get("description", "")),
                    str((record.get("category") or {}).get("usageType", "")),
                ):
                    currencies.add(gcp_currency(record))
                    sku = gcp_sku_from_json(record)
                    if sku is not None:
                        yield sku

        source = f"Cloud Billing Catalog API responses in {mirror / 'gcp'}"
        unit_prices = gcp_unit_prices(vm_skus(), dated)
        if not unit_prices and currencies - {"USD"}:
            # A page priced in another currency, not an empty one: say which.
            raise CurrencyError(", ".join(sorted(currencies - {"USD"})), "GCP")
    else:
        endpoint = settings.gcp_endpoint or DEFAULT_ENDPOINT
        source = f"Cloud Billing Catalog API services.skus.list ({endpoint})"
        unit_prices = _live_unit_prices(settings, endpoint, retry or API_RETRY, count, credentials)
    rows = gcp_prices(unit_prices, target.rows, dated)
    if mirror is not None:
        # effectiveTime says since when a price holds, not when it was read: a mirror's
        # prices are as old as its download (fetched.json, else its files).
        days = mirrors.as_of(mirror, "gcp", target.regions, {})
    return target.read(rows, source=source, fetched_at=now, records=count.total, dated=days)


def _live_unit_prices(
    settings: Settings,
    endpoint: str,
    policy: RetryPolicy,
    count: RecordCounter,
    credentials: Any,
) -> dict[tuple[str, str, Market], Decimal]:
    """Unit prices from the live catalog; errors as :class:`CostguardError`."""
    core = require("google.api_core.exceptions", gcp.EXTRA)
    auth_errors = require("google.auth.exceptions", gcp.EXTRA)
    try:
        client = gcp.grpc_client(
            "google.cloud.billing_v1", "CloudCatalogClient", settings, credentials
        )
    except auth_errors.GoogleAuthError as exc:
        msg = f"Google Cloud credentials failed while listing Compute Engine SKUs: {exc}"
        raise CostguardError(
            msg,
            hint="run `gcloud auth application-default login`, or check "
            "GOOGLE_APPLICATION_CREDENTIALS",
        ) from None
    try:
        skus = (_sku(raw) for raw in count(_live_skus(client, policy)))
        return gcp_unit_prices(sku for sku in skus if sku is not None)
    except core.ServiceUnavailable as exc:  # what gRPC says when it cannot connect
        msg = f"cannot reach the Cloud Billing Catalog API at {endpoint}: {exc.message}"
        raise CostguardError(
            msg, hint="check the network, and COSTGUARD_GCP_ENDPOINT if you set it"
        ) from None
    except gcp.errors() as exc:
        raise gcp.translate(exc, "listing Compute Engine SKUs") from None
    finally:
        client.transport.close()


def _live_skus(client: Any, policy: RetryPolicy) -> Iterator[Any]:
    """Every Compute Engine SKU (protobuf messages), page by page
    (:func:`costguard.clouds.pages` stops a server that repeats a token or never ends)."""

    def fetch(token: str | None) -> tuple[Any, str | None]:
        request = {
            "parent": GCP_COMPUTE_SERVICE,
            "currency_code": "USD",
            "page_size": PAGE_SIZE,
            "page_token": token or "",
        }
        call = partial(client.list_skus, request=request, retry=None, timeout=READ_TIMEOUT_S)
        # The pager answers for the page it fetched (its first page); the next page is
        # asked for by hand so that each call gets the retry policy above.
        response = next(iter(call_with_retry(call, _transient, policy).pages))
        raw = type(response).pb(response)  # the protobuf message, without proto-plus
        return raw.skus, raw.next_page_token or None

    return pages(fetch, max_pages=MAX_PAGES)


def _sku(raw: Any) -> GcpSku | None:
    """A SKU from its protobuf message, read field by field (proto-plus wrappers cost
    more than the parsing); ``None`` for one that cannot price a VM (most of them: told
    by name and usage type before the rest is read) or not priced in USD."""
    description = raw.description
    usage_type = raw.category.usage_type
    if not gcp_may_price_vm(description, usage_type) or not raw.pricing_info:
        return None
    expression = raw.pricing_info[-1].pricing_expression
    rates = expression.tiered_rates
    if not rates:
        return None
    first = rates[0] if len(rates) == 1 else min(rates, key=lambda rate: rate.start_usage_amount)
    price = first.unit_price
    if price.currency_code not in ("", "USD"):
        return None  # asked for in USD; a stray SKU in another currency is not a price
    return GcpSku(
        description=description,
        usage_type=usage_type,
        regions=tuple(raw.service_regions),
        usage_unit=expression.usage_unit,
        usd=gcp_money(price.units, price.nanos),
    )


def _transient(exc: Exception) -> Transient | None:
    """Throttling (``RESOURCE_EXHAUSTED``), ``UNAVAILABLE`` (also: cannot connect),
    ``DEADLINE_EXCEEDED`` and ``INTERNAL`` are worth another try; the server's
    ``google.rpc.RetryInfo``, when it sent one, says how long to wait."""
    core = require("google.api_core.exceptions", gcp.EXTRA)
    retryable = (
        core.ResourceExhausted,
        core.ServiceUnavailable,
        core.DeadlineExceeded,
        core.InternalServerError,
        core.GatewayTimeout,
        core.BadGateway,
    )
    if not isinstance(exc, retryable):
        return None
    return Transient(str(exc.message), _retry_delay_s(exc.details))


def _retry_delay_s(details: Any) -> float | None:
    """The delay of a ``google.rpc.RetryInfo`` among an error's details, in seconds."""
    retry_info = require("google.rpc.error_details_pb2", gcp.EXTRA).RetryInfo
    for detail in details or ():
        if isinstance(detail, retry_info):
            return float(detail.retry_delay.seconds) + detail.retry_delay.nanos / 1e9
    return None
