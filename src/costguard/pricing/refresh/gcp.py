"""GCP prices: the Cloud Billing Catalog API, Compute Engine SKUs.

``CloudCatalogClient.list_skus`` (google-cloud-billing, REST transport) for
``services/6F81-5844-456A`` in USD, page by page (``nextPageToken``), each page retried
on throttling and 5xx. The catalog has no server-side filter, so every Compute Engine
SKU is read; :mod:`costguard.pricing.refresh.parse` keeps the vCPU, RAM and GPU SKUs and
sums them per machine type. ``Settings.gcp_endpoint`` points the client elsewhere (a
private endpoint, a test server); credentials are Application Default Credentials.
"""

from __future__ import annotations

import http.client
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from costguard.clouds import READ_TIMEOUT_S, gcp, pages, require
from costguard.errors import CostguardError
from costguard.pricing.catalog import Market
from costguard.pricing.refresh import mirror as mirrors
from costguard.pricing.refresh.merge import FreshPrices, Target
from costguard.pricing.refresh.parse import (
    GCP_COMPUTE_SERVICE,
    GcpSku,
    gcp_money,
    gcp_prices,
    gcp_sku_from_json,
    gcp_unit_prices,
)
from costguard.pricing.refresh.progress import RecordCounter
from costguard.pricing.refresh.retry import (
    RetryPolicy,
    Transient,
    call_with_retry,
    parse_retry_after,
)
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
    if mirror is not None:
        skus: Iterator[GcpSku | None] = (
            gcp_sku_from_json(record)
            for page in mirrors.pages(mirror, "gcp", "skus")
            for record in mirrors.records(page, "skus")
        )
        source = f"Cloud Billing Catalog API responses in {mirror / 'gcp'}"
        unit_prices = gcp_unit_prices(sku for sku in count(skus) if sku is not None)
    else:
        endpoint = settings.gcp_endpoint or DEFAULT_ENDPOINT
        source = f"Cloud Billing Catalog API services.skus.list ({endpoint})"
        requests_errors = require("requests.exceptions", gcp.EXTRA)
        auth_errors = require("google.auth.exceptions", gcp.EXTRA)
        try:
            client = gcp.client(
                "google.cloud.billing_v1", "CloudCatalogClient", settings, credentials
            )
            unit_prices = gcp_unit_prices(count(_live_skus(client, retry or RetryPolicy())))
        except gcp.errors() as exc:
            raise gcp.translate(exc, "listing Compute Engine SKUs") from None
        except auth_errors.GoogleAuthError as exc:
            msg = f"Google Cloud credentials failed while listing Compute Engine SKUs: {exc}"
            raise CostguardError(
                msg,
                hint="run `gcloud auth application-default login`, or check "
                "GOOGLE_APPLICATION_CREDENTIALS",
            ) from None
        # requests' errors are OSErrors too: they are told apart first.
        except requests_errors.RequestException as exc:
            msg = f"cannot reach the Cloud Billing Catalog API at {endpoint}: {exc}"
            raise CostguardError(
                msg, hint="check the network, and COSTGUARD_GCP_ENDPOINT if you set it"
            ) from None
        except (http.client.HTTPException, OSError) as exc:
            msg = f"the connection to the Cloud Billing Catalog API at {endpoint} failed: {exc!r}"
            raise CostguardError(
                msg, hint="check the network, and COSTGUARD_GCP_ENDPOINT if you set it"
            ) from None
    return FreshPrices(
        provider="gcp",
        regions=frozenset(target.regions),
        markets=frozenset(Market),
        rows=gcp_prices(unit_prices, target.rows),
        source=source,
        fetched_at=now,
        records=count.total,
    )


def _live_skus(client: Any, policy: RetryPolicy) -> Iterator[GcpSku]:
    """Every Compute Engine SKU, page by page (:func:`costguard.clouds.pages` stops a
    server that repeats a token or never ends)."""
    sku_type = require("google.cloud.billing_v1", gcp.EXTRA).Sku

    def fetch(token: str | None) -> tuple[list[GcpSku], str | None]:
        request = {
            "parent": GCP_COMPUTE_SERVICE,
            "currency_code": "USD",
            "page_size": PAGE_SIZE,
            "page_token": token or "",
        }
        call = partial(client.list_skus, request=request, retry=None, timeout=READ_TIMEOUT_S)
        pager = call_with_retry(call, _transient, policy)
        # The pager answers for the page it fetched; the next page is asked for by hand
        # so that each call gets the retry policy above.
        parsed = (_sku(sku_type.pb(sku)) for sku in pager.skus)
        return [sku for sku in parsed if sku is not None], pager.next_page_token or None

    return pages(fetch, max_pages=MAX_PAGES)


def _sku(raw: Any) -> GcpSku | None:
    """A SKU from its protobuf message (read field by field: proto-plus wrappers cost
    more than the parsing)."""
    if not raw.pricing_info:
        return None
    expression = raw.pricing_info[-1].pricing_expression
    if not expression.tiered_rates:
        return None
    first = min(expression.tiered_rates, key=lambda rate: rate.start_usage_amount)
    if first.unit_price.currency_code not in ("", "USD"):
        return None
    return GcpSku(
        description=raw.description,
        usage_type=raw.category.usage_type,
        regions=tuple(raw.service_regions),
        usage_unit=expression.usage_unit,
        usd=gcp_money(first.unit_price.units, first.unit_price.nanos),
    )


def _transient(exc: Exception) -> Transient | None:
    """429, 5xx and dropped connections are worth another try."""
    core = require("google.api_core.exceptions", gcp.EXTRA)
    requests_errors = require("requests.exceptions", gcp.EXTRA)
    retryable = (
        core.TooManyRequests,
        core.ResourceExhausted,
        core.InternalServerError,
        core.BadGateway,
        core.ServiceUnavailable,
        core.GatewayTimeout,
    )
    if isinstance(exc, retryable):
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None) or {}
        return Transient(str(exc.message), parse_retry_after(headers.get("Retry-After")))
    if isinstance(exc, requests_errors.ConnectionError | requests_errors.Timeout):
        return Transient(str(exc))
    return None
