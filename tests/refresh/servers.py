"""Local servers that speak the price APIs' documented protocols, and record builders.

* AWS Price List Query API: JSON 1.1 over ``POST /`` with ``X-Amz-Target:
  AWSPriceListService.GetProducts``; filters TERM_MATCH/EQUALS/ANY_OF; ``NextToken`` pages.
* Cloud Billing Catalog API over gRPC: ``google.cloud.billing.v1.CloudCatalog/ListSkus``
  (the protobuf messages google-cloud-billing ships), ``next_page_token`` pages, gRPC
  status codes (with ``google.rpc.RetryInfo``) as faults.
* Azure Retail Prices API: ``GET /api/retail/prices?$filter=...``; ``NextPageLink`` pages.

Each server runs on the shared loopback server (:class:`tests.servers.http.Loopback`),
records every request, and can be told to answer the next requests (``script``) or every
request (``always``) with a fault, to test throttling and failures. Also used by
``benchmarks/refresh.py``.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import grpc

from tests.servers.http import Loopback

JSON = "application/json"
AMZ_JSON = "application/x-amz-json-1.1"
GCP_COMPUTE = "6F81-5844-456A"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class Reply:
    status: int
    body: Any  # a JSON-able value, or bytes sent as they are
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = JSON


Handler = Callable[["LocalServer", Request], Reply]


class LocalServer:
    """A price API on the shared loopback server, answering with ``handler``; stop with
    ``close``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []
        self.script: list[Reply] = []  # answered first, one per request
        self.always: Reply | None = None  # answered to every request when set
        self._lock = threading.Lock()
        self._loopback = Loopback(self._answer, http11=True)

    def _answer(
        self, method: str, target: str, headers: Mapping[str, str], raw: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        parts = urlsplit(target)
        request = Request(
            method=method,
            path=parts.path,
            query={k: v[-1] for k, v in parse_qs(parts.query).items()},
            headers={k.lower(): v for k, v in headers.items()},
            body=raw,
        )
        reply = self.dispatch(request)
        body = reply.body if isinstance(reply.body, bytes) else dumps(reply.body)
        return reply.status, [("Content-Type", reply.content_type), *reply.headers.items()], body

    @property
    def url(self) -> str:
        return self._loopback.url

    def dispatch(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self.script:
                return self.script.pop(0)
            if self.always is not None:
                return self.always
        return self.handler(self, request)

    def close(self) -> None:
        self._loopback.stop()


def _digest(*parts: Any) -> str:
    """A stable made-up identifier (SKU, meter) for a record."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12].upper()


def dumps(value: Any) -> bytes:
    """JSON as the APIs send it (Decimal prices as JSON numbers)."""
    return json.dumps(
        value, default=lambda d: float(d) if isinstance(d, Decimal) else str(d)
    ).encode()


# --- AWS Price List Query API ------------------------------------------------------------


def aws_product(
    instance_type: str,
    region: str,
    usd: str,
    *,
    sku: str | None = None,
    **attributes: str,
) -> dict[str, Any]:
    """A Price List product (aws_v1) for a Linux shared instance; ``attributes`` override."""
    sku = sku or _digest("aws", instance_type, region, usd, sorted(attributes.items()))
    attrs = {
        "servicecode": "AmazonEC2",
        "instanceType": instance_type,
        "regionCode": region,
        "location": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "licenseModel": "No License required",
        "usagetype": f"BoxUsage:{instance_type}",
        "operation": "RunInstances",
        **attributes,
    }
    term = f"{sku}.JRTCKXETXF"
    return {
        "product": {"productFamily": "Compute Instance", "attributes": attrs, "sku": sku},
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                term: {
                    "offerTermCode": "JRTCKXETXF",
                    "sku": sku,
                    "effectiveDate": "2026-11-01T00:00:00Z",
                    "priceDimensions": {
                        f"{term}.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "beginRange": "0",
                            "endRange": "Inf",
                            "description": f"${usd} per On Demand Linux {instance_type} Hour",
                            "pricePerUnit": {"USD": usd},
                            "appliesTo": [],
                        }
                    },
                    "termAttributes": {},
                }
            },
            "Reserved": {
                f"{sku}.4NA7Y494T4": {
                    "priceDimensions": {
                        f"{sku}.4NA7Y494T4.6YS6EN2CT7": {
                            "unit": "Hrs",
                            "pricePerUnit": {"USD": "0.0100000000"},
                        }
                    }
                }
            },
        },
        "version": "20261101000000",
        "publicationDate": "2026-11-01T00:00:00Z",
    }


def _aws_matches(product: Mapping[str, Any], filters: Sequence[Mapping[str, str]]) -> bool:
    attributes = product["product"]["attributes"]
    for item in filters:
        value = attributes.get(item["Field"])
        if item["Type"] in ("TERM_MATCH", "EQUALS") and value != item["Value"]:
            return False
        if item["Type"] == "ANY_OF" and value not in item["Value"].split(","):
            return False
    return True


def aws_pricing_handler(products: Sequence[Mapping[str, Any]], page_size: int = 2) -> Handler:
    """GetProducts over the JSON 1.1 protocol, ``page_size`` products per page."""

    def handle(server: LocalServer, request: Request) -> Reply:
        if request.headers.get("x-amz-target") != "AWSPriceListService.GetProducts":
            return Reply(400, {"__type": "UnknownOperationException"}, content_type=AMZ_JSON)
        body = json.loads(request.body)
        if body.get("ServiceCode") != "AmazonEC2":
            return Reply(400, {"__type": "InvalidParameterException"}, content_type=AMZ_JSON)
        matched = [p for p in products if _aws_matches(p, body.get("Filters", []))]
        start = int(body.get("NextToken") or 0)
        page: dict[str, Any] = {
            "FormatVersion": "aws_v1",
            "PriceList": [json.dumps(p) for p in matched[start : start + page_size]],
        }
        if start + page_size < len(matched):
            page["NextToken"] = str(start + page_size)
        return Reply(200, page, content_type=AMZ_JSON)

    return handle


def aws_throttled(retry_after: str | None = "0") -> Reply:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    body = {"__type": "ThrottlingException", "message": "Rate exceeded"}
    return Reply(400, body, headers, content_type=AMZ_JSON)


# --- GCP Cloud Billing Catalog API -------------------------------------------------------


def gcp_sku(
    description: str,
    usd: str,
    *,
    regions: Iterable[str] = ("us-central1",),
    usage_type: str = "OnDemand",
    unit: str = "h",
    group: str = "CPU",
) -> dict[str, Any]:
    """A Compute Engine SKU as ``services.skus.list`` returns it."""
    price = Decimal(usd)
    units = int(price)
    nanos = int((price - units) * 10**9)
    sku_id = _digest("gcp", description, usage_type, usd)
    return {
        "name": f"services/{GCP_COMPUTE}/skus/{sku_id}",
        "skuId": sku_id,
        "description": description,
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": "Compute",
            "resourceGroup": group,
            "usageType": usage_type,
        },
        "serviceRegions": list(regions),
        "pricingInfo": [
            {
                "effectiveTime": "2026-11-30T00:00:00Z",
                "summary": "",
                "pricingExpression": {
                    "usageUnit": unit,
                    "usageUnitDescription": "hour" if unit == "h" else "gibibyte hour",
                    "baseUnit": "s",
                    "baseUnitDescription": "second",
                    "baseUnitConversionFactor": 3600,
                    "displayQuantity": 1,
                    "tieredRates": [
                        {
                            "startUsageAmount": 0,
                            "unitPrice": {
                                "currencyCode": "USD",
                                "units": str(units),
                                "nanos": nanos,
                            },
                        }
                    ],
                },
                "currencyConversionRate": 1,
            }
        ],
        "serviceProviderName": "Google",
    }


def sku_message(record: Mapping[str, Any]) -> Any:
    """A SKU in the REST shape (:func:`gcp_sku`) as the protobuf message gRPC sends
    (``google.cloud.billing.v1.Sku``), field by field."""
    from google.cloud.billing_v1.types import cloud_catalog
    from google.protobuf.timestamp_pb2 import Timestamp

    def pricing(info: Mapping[str, Any]) -> Any:
        expression = info["pricingExpression"]
        effective = Timestamp()
        effective.FromJsonString(info["effectiveTime"])
        return cloud_catalog.PricingInfo.pb()(
            effective_time=effective,
            summary=info.get("summary", ""),
            pricing_expression=cloud_catalog.PricingExpression.pb()(
                usage_unit=expression["usageUnit"],
                usage_unit_description=expression.get("usageUnitDescription", ""),
                base_unit=expression.get("baseUnit", ""),
                base_unit_description=expression.get("baseUnitDescription", ""),
                base_unit_conversion_factor=float(expression.get("baseUnitConversionFactor", 0)),
                display_quantity=float(expression.get("displayQuantity", 0)),
                tiered_rates=[
                    cloud_catalog.PricingExpression.TierRate.pb()(
                        start_usage_amount=float(rate.get("startUsageAmount", 0)),
                        unit_price={
                            "currency_code": rate["unitPrice"].get("currencyCode", ""),
                            "units": int(rate["unitPrice"].get("units", 0)),
                            "nanos": int(rate["unitPrice"].get("nanos", 0)),
                        },
                    )
                    for rate in expression.get("tieredRates", ())
                ],
            ),
            currency_conversion_rate=float(info.get("currencyConversionRate", 0)),
        )

    category = record.get("category", {})
    return cloud_catalog.Sku.pb()(
        name=record.get("name", ""),
        sku_id=record.get("skuId", ""),
        description=record.get("description", ""),
        category=cloud_catalog.Category.pb()(
            service_display_name=category.get("serviceDisplayName", ""),
            resource_family=category.get("resourceFamily", ""),
            resource_group=category.get("resourceGroup", ""),
            usage_type=category.get("usageType", ""),
        ),
        service_regions=list(record.get("serviceRegions", ())),
        pricing_info=[pricing(info) for info in record.get("pricingInfo", ())],
        service_provider_name=record.get("serviceProviderName", ""),
    )


@dataclass(frozen=True)
class GrpcFault:
    """A gRPC error status to answer with (``code`` names a ``google.rpc.Code``), with a
    ``google.rpc.RetryInfo`` of ``retry_after_s`` seconds when that is not ``None``."""

    code: str
    message: str = "try later"
    retry_after_s: float | None = None


def gcp_error(code: str, retry_after_s: float | None = 0.0) -> GrpcFault:
    """A fault the Catalog API answers with: ``RESOURCE_EXHAUSTED``, ``UNAVAILABLE``, ..."""
    return GrpcFault(code, retry_after_s=retry_after_s)


@dataclass(frozen=True)
class GrpcCall:
    """One call the catalog server got: the request message and its metadata."""

    request: Any  # google.cloud.billing.v1.ListSkusRequest (protobuf)
    metadata: dict[str, str]


class CatalogServer:
    """The Cloud Billing Catalog API over gRPC on loopback; stop with ``close``.

    Serves ``ListSkus`` for the Compute Engine service, at most ``page_size`` SKUs a page
    (the page token is the offset). Its credentials are gRPC local credentials (loopback
    TCP only), what the client uses for a loopback ``http://`` endpoint; the client's
    access token arrives as the ``authorization`` metadata. Pages are serialised once
    and kept (the SKUs are fixed), so a timed client measures its own work.
    """

    SERVICE = "google.cloud.billing.v1.CloudCatalog"

    def __init__(self, skus: Sequence[Mapping[str, Any]], page_size: int = 4) -> None:
        self.skus = [sku_message(sku) for sku in skus]
        self.page_size = page_size
        self.requests: list[GrpcCall] = []
        self.script: list[GrpcFault] = []  # answered first, one per request
        self.always: GrpcFault | None = None  # answered to every request when set
        self._pages: dict[tuple[int, int], bytes] = {}
        self._lock = threading.Lock()
        # Raw bytes in and out: requests are parsed here, pages are rendered once.
        handler = grpc.method_handlers_generic_handler(
            self.SERVICE, {"ListSkus": grpc.unary_unary_rpc_method_handler(self._list_skus)}
        )
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((handler,))
        local = grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP)
        self.port = self._server.add_secure_port("127.0.0.1:0", local)
        self._server.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _list_skus(self, body: bytes, context: Any) -> bytes:
        from google.cloud.billing_v1.types import cloud_catalog

        request = cloud_catalog.ListSkusRequest.pb().FromString(body)
        with self._lock:
            self.requests.append(GrpcCall(request, dict(context.invocation_metadata())))
            fault = self.script.pop(0) if self.script else self.always
        if fault is not None:
            context.abort_with_status(_status(fault))
        if request.parent != f"services/{GCP_COMPUTE}":
            context.abort(grpc.StatusCode.NOT_FOUND, f"Service {request.parent} not found")
        size = min(request.page_size or self.page_size, self.page_size)
        token = request.page_token or "0"
        start = int(token) if token.isdigit() else -1
        if start < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "invalid page token")
        key = (start, size)
        with self._lock:
            if key not in self._pages:
                end = start + size
                page = cloud_catalog.ListSkusResponse.pb()(
                    skus=self.skus[start:end],
                    next_page_token=str(end) if end < len(self.skus) else "",
                )
                self._pages[key] = page.SerializeToString()
            return self._pages[key]

    def close(self) -> None:
        self._server.stop(grace=None).wait(timeout=10)


def _status(fault: GrpcFault) -> Any:
    """A fault as the ``grpc.Status`` that ``abort_with_status`` sends (details included)."""
    from google.protobuf import any_pb2
    from google.rpc import code_pb2, error_details_pb2, status_pb2
    from grpc_status import rpc_status

    status = status_pb2.Status(code=getattr(code_pb2, fault.code), message=fault.message)
    if fault.retry_after_s is not None:
        info = error_details_pb2.RetryInfo()
        info.retry_delay.FromNanoseconds(int(fault.retry_after_s * 1e9))
        detail = any_pb2.Any()
        detail.Pack(info)
        status.details.append(detail)
    return rpc_status.to_status(status)


# --- Azure Retail Prices API -------------------------------------------------------------


def azure_item(
    sku: str,
    region: str,
    usd: str,
    *,
    spot: bool = False,
    windows: bool = False,
    low_priority: bool = False,
    price_type: str = "Consumption",
) -> dict[str, Any]:
    """A Retail Prices item for a VM meter (Linux pay-as-you-go unless told otherwise)."""
    short = sku.removeprefix("Standard_").replace("_", " ")
    suffix = " Spot" if spot else " Low Priority" if low_priority else ""
    series = short.split(" ")[0]
    return {
        "currencyCode": "USD",
        "tierMinimumUnits": 0.0,
        "retailPrice": Decimal(usd),
        "unitPrice": Decimal(usd),
        "armRegionName": region,
        "location": region,
        "effectiveStartDate": "2026-11-01T00:00:00Z",
        "meterId": _digest("azure", sku, region, spot, windows, low_priority, price_type),
        "meterName": short + suffix,
        "productId": "DZH318Z0BQPS",
        "skuId": "DZH318Z0BQPS/00TG",
        "productName": f"Virtual Machines {series} Series" + (" Windows" if windows else ""),
        "skuName": short + suffix,
        "serviceName": "Virtual Machines",
        "serviceId": "DZH313Z7MMC8",
        "serviceFamily": "Compute",
        "unitOfMeasure": "1 Hour",
        "type": price_type,
        "isPrimaryMeterRegion": True,
        "armSkuName": sku,
    }


def azure_prices_handler(items: Sequence[Mapping[str, Any]], page_size: int = 3) -> Handler:
    """``GET /api/retail/prices``: items of the ``armRegionName`` in ``$filter``, paged."""
    region_filter = re.compile(r"armRegionName eq '(?P<region>[^']+)'")

    def handle(server: LocalServer, request: Request) -> Reply:
        if request.path != "/api/retail/prices" or "api-version" not in request.query:
            return Reply(400, {"Error": {"Code": "BadRequest", "Message": "bad request"}})
        match = region_filter.search(request.query.get("$filter", ""))
        region = match["region"] if match else None
        chosen = [i for i in items if region is None or i["armRegionName"] == region]
        skip = int(request.query.get("$skip") or 0)
        page: dict[str, Any] = {
            "BillingCurrency": "USD",
            "CustomerEntityId": "Default",
            "CustomerEntityType": "Retail",
            "Items": list(chosen[skip : skip + page_size]),
            "NextPageLink": None,
            "Count": len(chosen[skip : skip + page_size]),
        }
        if skip + page_size < len(chosen):
            query = {**request.query, "$skip": str(skip + page_size)}
            page["NextPageLink"] = f"{server.url}/api/retail/prices?{urlencode(query)}"
        return Reply(200, page)

    return handle
