"""Each provider's adapter with its real client against a server on loopback.

AWS: boto3 ``pricing`` to the local Price List server (``AWS_ENDPOINT_URL_PRICING``), EC2
spot history to moto. GCP: google-cloud-billing's ``CloudCatalogClient`` (gRPC) to the
local catalog server. Azure: urllib to the local Retail Prices server.
"""

from __future__ import annotations

import http.client
import threading
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials

from costguard.clouds import pages
from costguard.errors import CostguardError
from costguard.pricing.catalog import Catalog, Market
from costguard.pricing.refresh import aws, azure, gcp
from costguard.pricing.refresh.merge import Target
from costguard.pricing.refresh.parse import row_key
from costguard.retry import RetryPolicy
from costguard.settings import Settings
from tests.refresh.records import (
    G2_STANDARD_4_SPOT_USD,
    G2_STANDARD_4_USD,
    G5_XLARGE_USD,
    MOTO_SPOT_USD,
    NC4AS_T4_SPOT_USD,
    NC4AS_T4_USD,
)
from tests.refresh.servers import CatalogServer, LocalServer, Reply, aws_throttled, gcp_error

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
FAST = RetryPolicy(attempts=4, base_delay_s=0.001, max_delay_s=0.01)


def target(catalog: Catalog, provider: str, region: str) -> Target:
    rows = tuple(r for r in catalog.instances if (r.provider, r.region) == (provider, region))
    return Target(provider, (region,), rows)


def price(fresh, catalog: Catalog, region: str, instance_type: str, accelerator=None) -> dict:
    row = next(
        r
        for r in catalog.instances
        if (r.region, r.instance_type) == (region, instance_type)
        and (accelerator is None or r.accelerator == accelerator)
    )
    return dict(fresh.rows.prices.get(row_key(row), {}))


@pytest.fixture
def aws_live(
    aws_env: str, aws_pricing: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> LocalServer:
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", aws_pricing.url)
    return aws_pricing


def test_aws_reads_every_page_and_spot_from_moto(aws_live: LocalServer, catalog: Catalog) -> None:
    progress: list[int] = []
    fresh = aws.fetch(
        target(catalog, "aws", "us-east-1"),
        Settings(),
        now=NOW,
        retry=FAST,
        progress=progress.append,
    )
    assert price(fresh, catalog, "us-east-1", "g5.xlarge") == {
        Market.ON_DEMAND: G5_XLARGE_USD,
        Market.SPOT: MOTO_SPOT_USD,  # moto's dummy spot price, the same in every zone
    }
    assert price(fresh, catalog, "us-east-1", "p4d.24xlarge")[Market.ON_DEMAND] == Decimal("21.96")
    calls = [r for r in aws_live.requests if r.headers["x-amz-target"].endswith("GetProducts")]
    assert len(calls) >= 3  # two products per page: several pages, followed by NextToken
    assert any('"NextToken"' in r.body.decode() for r in calls)
    assert "AWS Price List Query API GetProducts (http://127.0.0.1:" in fresh.source
    assert fresh.records == progress[-1] > 0
    assert fresh.markets == frozenset(Market)


def test_aws_filters_are_the_documented_ones(aws_live: LocalServer, catalog: Catalog) -> None:
    aws.fetch(target(catalog, "aws", "us-east-1"), Settings(), now=NOW, retry=FAST)
    import json

    filters = json.loads(aws_live.requests[0].body)["Filters"]
    fields = {(f["Type"], f["Field"]): f["Value"] for f in filters}
    assert fields[("TERM_MATCH", "operatingSystem")] == "Linux"
    assert fields[("TERM_MATCH", "tenancy")] == "Shared"
    assert fields[("TERM_MATCH", "preInstalledSw")] == "NA"
    assert fields[("TERM_MATCH", "capacitystatus")] == "Used"
    assert fields[("TERM_MATCH", "regionCode")] == "us-east-1"
    assert all(len(v) <= 1024 for v in fields.values())
    assert "g5.xlarge" in ",".join(
        json.loads(r.body)["Filters"][-1]["Value"] for r in aws_live.requests
    )


def test_aws_throttling_is_retried(aws_live: LocalServer, catalog: Catalog) -> None:
    # Without Retry-After (the policy's own backoff) and with it.
    aws_live.script = [aws_throttled(retry_after=None), aws_throttled(retry_after="0")]
    fresh = aws.fetch(target(catalog, "aws", "us-east-1"), Settings(), now=NOW, retry=FAST)
    assert price(fresh, catalog, "us-east-1", "g5.xlarge")[Market.ON_DEMAND] == G5_XLARGE_USD


def test_aws_gives_up_after_the_attempts(aws_live: LocalServer, catalog: Catalog) -> None:
    aws_live.always = aws_throttled()
    with pytest.raises(CostguardError, match="ThrottlingException"):
        aws.fetch(target(catalog, "aws", "us-east-1"), Settings(), now=NOW, retry=FAST)
    assert len(aws_live.requests) == FAST.attempts


def test_aws_access_denied_is_not_retried(aws_live: LocalServer, catalog: Catalog) -> None:
    aws_live.always = Reply(
        400,
        {"__type": "AccessDeniedException", "message": "no"},
        content_type="application/x-amz-json-1.1",
    )
    with pytest.raises(CostguardError) as info:
        aws.fetch(target(catalog, "aws", "us-east-1"), Settings(), now=NOW, retry=FAST)
    assert "AccessDeniedException" in info.value.message
    assert info.value.hint
    assert "infra/aws" in info.value.hint
    assert len(aws_live.requests) == 1


def ec2_error(code: str) -> Reply:
    """An EC2 (query protocol) error, as EC2 answers it."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
        f"<Code>{code}</Code><Message>You are not subscribed to this service.</Message>"
        "</Error></Errors><RequestID>4f6c1a2e</RequestID></Response>"
    ).encode()
    return Reply(401, body, content_type="text/xml;charset=UTF-8")


@pytest.mark.parametrize(("code", "skipped"), [("OptInRequired", True), ("Blocked", False)])
def test_aws_a_region_the_account_has_not_enabled_gives_on_demand_only(
    aws_live: LocalServer,
    catalog: Catalog,
    monkeypatch: pytest.MonkeyPatch,
    code: str,
    skipped: bool,
) -> None:
    ec2 = LocalServer(lambda server, request: ec2_error(code))
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", ec2.url)
    try:
        if not skipped:
            with pytest.raises(CostguardError, match=code):
                aws.fetch(target(catalog, "aws", "us-east-1"), Settings(), now=NOW, retry=FAST)
            return
        fresh = aws.fetch(target(catalog, "aws", "us-east-1"), Settings(), now=NOW, retry=FAST)
    finally:
        ec2.close()
    assert price(fresh, catalog, "us-east-1", "g5.xlarge") == {Market.ON_DEMAND: G5_XLARGE_USD}
    assert fresh.markets_in("us-east-1") == {Market.ON_DEMAND}
    assert "no spot prices from us-east-1 (not enabled for this account)" in fresh.source


def gcp_settings(server: CatalogServer) -> Settings:
    return Settings(gcp_endpoint=server.url)


def fetch_gcp(
    catalog: Catalog, server: CatalogServer, credentials: Any = None, **options: Any
) -> Any:
    """``gcp.fetch`` of us-central1 from ``server``, anonymous unless ``credentials``."""
    return gcp.fetch(
        target(catalog, "gcp", "us-central1"),
        gcp_settings(server),
        now=NOW,
        retry=FAST,
        credentials=credentials or AnonymousCredentials(),
        **options,
    )


def test_gcp_sums_skus_per_machine_type(gcp_catalog: CatalogServer, catalog: Catalog) -> None:
    progress: list[int] = []
    fresh = fetch_gcp(catalog, gcp_catalog, progress=progress.append)
    assert price(fresh, catalog, "us-central1", "g2-standard-4") == {
        Market.ON_DEMAND: G2_STANDARD_4_USD,
        Market.SPOT: G2_STANDARD_4_SPOT_USD,
    }
    # One n1 host type, several GPU models: each row its own sum.
    t4 = price(fresh, catalog, "us-central1", "n1-highmem-8", "T4")[Market.ON_DEMAND]
    v100 = price(fresh, catalog, "us-central1", "n1-highmem-8", "V100")[Market.ON_DEMAND]
    host = 8 * Decimal("0.031611") + 52 * Decimal("0.004237")
    assert (t4, v100) == (host + 2 * Decimal("0.35"), host + Decimal("2.48"))
    # TPUs are not Compute Engine SKUs: not this API's rows.
    tpu = next(r for r in catalog.instances if r.instance_type == "tpu-v3-8")
    assert row_key(tpu) not in fresh.rows.covered
    calls = [call.request for call in gcp_catalog.requests]
    assert len(calls) > 3  # four SKUs a page: several pages, followed by next_page_token
    assert {(c.parent, c.currency_code, c.page_size) for c in calls} == {
        ("services/6F81-5844-456A", "USD", gcp.PAGE_SIZE)
    }
    assert [c.page_token for c in calls] == ["", *(str(4 * n) for n in range(1, len(calls)))]
    assert fresh.records == progress[-1] == len(gcp_catalog.skus)
    assert fresh.source == f"Cloud Billing Catalog API services.skus.list ({gcp_catalog.url})"


def test_gcp_access_token_travels_as_metadata(gcp_catalog: CatalogServer, catalog: Catalog) -> None:
    from google.oauth2.credentials import Credentials

    fetch_gcp(catalog, gcp_catalog, Credentials(token="ya29.test-token"))
    assert {call.metadata.get("authorization") for call in gcp_catalog.requests} == {
        "Bearer ya29.test-token"
    }


def test_gcp_throttling_and_unavailability_are_retried_then_500_fails(
    gcp_catalog: CatalogServer, catalog: Catalog
) -> None:
    gcp_catalog.script = [
        gcp_error("RESOURCE_EXHAUSTED"),
        gcp_error("UNAVAILABLE", retry_after_s=None),
        gcp_error("DEADLINE_EXCEEDED", retry_after_s=None),
    ]
    fresh = fetch_gcp(catalog, gcp_catalog)
    assert (
        price(fresh, catalog, "us-central1", "g2-standard-4")[Market.ON_DEMAND] == G2_STANDARD_4_USD
    )
    first_page = [c for c in gcp_catalog.requests if not c.request.page_token]
    assert len(first_page) == 4  # three faults, then the answer
    gcp_catalog.requests.clear()
    gcp_catalog.always = gcp_error("INTERNAL")
    with pytest.raises(CostguardError, match="Compute Engine SKUs"):
        fetch_gcp(catalog, gcp_catalog)
    assert len(gcp_catalog.requests) == FAST.attempts


def test_gcp_permission_denied_is_not_retried(gcp_catalog: CatalogServer, catalog: Catalog) -> None:
    gcp_catalog.always = gcp_error("PERMISSION_DENIED")
    with pytest.raises(CostguardError, match="Google Cloud refused") as info:
        fetch_gcp(catalog, gcp_catalog)
    assert "infra/gcp" in (info.value.hint or "")
    assert len(gcp_catalog.requests) == 1


def test_gcp_retry_info_sets_the_wait(gcp_catalog: CatalogServer) -> None:
    from google.api_core import exceptions as core

    from costguard.clouds.gcp import grpc_client
    from costguard.retry import Transient

    client = grpc_client(
        "google.cloud.billing_v1",
        "CloudCatalogClient",
        gcp_settings(gcp_catalog),
        AnonymousCredentials(),
    )
    gcp_catalog.script = [gcp_error("RESOURCE_EXHAUSTED", retry_after_s=7.5)]
    with pytest.raises(core.ResourceExhausted) as info:
        client.list_skus(request={"parent": "services/6F81-5844-456A"}, retry=None, timeout=10)
    client.transport.close()
    assert gcp._transient(info.value) == Transient("try later", 7.5)
    assert gcp._transient(core.PermissionDenied("no")) is None


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        (None, "cloudbilling.googleapis.com"),
        ("https://private.example:8443", "private.example:8443"),
        ("private.example", "private.example:443"),
    ],
)
def test_gcp_real_endpoints_get_the_clients_own_tls_channel(
    endpoint: str | None, expected: str
) -> None:
    from costguard.clouds.gcp import grpc_client

    # Nothing is sent: a gRPC channel connects on its first call.
    client = grpc_client(
        "google.cloud.billing_v1",
        "CloudCatalogClient",
        Settings(gcp_endpoint=endpoint),
        AnonymousCredentials(),
    )
    try:
        assert client.api_endpoint == expected
        assert type(client.transport).__name__ == "CloudCatalogGrpcTransport"
    finally:
        client.transport.close()


def test_gcp_unreachable_endpoint_is_explained(catalog: Catalog) -> None:
    from tests.helpers.processes import free_port

    settings = Settings(gcp_endpoint=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(CostguardError, match="cannot reach the Cloud Billing Catalog API"):
        gcp.fetch(
            target(catalog, "gcp", "us-central1"),
            settings,
            now=NOW,
            retry=RetryPolicy(attempts=2, base_delay_s=0.001),
            credentials=AnonymousCredentials(),
        )


def test_gcp_plaintext_endpoint_off_loopback_is_refused(catalog: Catalog) -> None:
    from costguard.errors import InputError

    with pytest.raises(InputError, match="must be on loopback"):
        gcp.fetch(
            target(catalog, "gcp", "us-central1"),
            Settings(gcp_endpoint="http://192.0.2.10:8080"),  # TEST-NET: never reached
            now=NOW,
            retry=FAST,
            credentials=AnonymousCredentials(),
        )


def azure_settings(server: LocalServer) -> Settings:
    return Settings(azure_prices_endpoint=server.url)


def test_azure_follows_next_page_links(azure_prices: LocalServer, catalog: Catalog) -> None:
    fresh = azure.fetch(
        target(catalog, "azure", "eastus"), azure_settings(azure_prices), now=NOW, retry=FAST
    )
    assert price(fresh, catalog, "eastus", "Standard_NC4as_T4_v3") == {
        Market.ON_DEMAND: NC4AS_T4_USD,  # not the Windows, Low Priority or dev/test meters
        Market.SPOT: NC4AS_T4_SPOT_USD,
    }
    assert len(azure_prices.requests) > 2
    first = azure_prices.requests[0]
    assert first.query["api-version"] == azure.API_VERSION
    assert first.query["$filter"] == (
        "serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' "
        "and priceType eq 'Consumption'"
    )
    assert all("$skip" in r.query for r in azure_prices.requests[1:])


def test_azure_retries_429_then_gives_up_on_500(
    azure_prices: LocalServer, catalog: Catalog
) -> None:
    azure_prices.script = [Reply(429, {"Error": "slow down"}, {"Retry-After": "0"})]
    fresh = azure.fetch(
        target(catalog, "azure", "eastus"), azure_settings(azure_prices), now=NOW, retry=FAST
    )
    assert fresh.rows.prices
    azure_prices.always = Reply(500, {"Error": "broken"})
    with pytest.raises(CostguardError, match="HTTP 500") as info:
        azure.fetch(
            target(catalog, "azure", "eastus"), azure_settings(azure_prices), now=NOW, retry=FAST
        )
    assert "broken" in info.value.message


def test_azure_never_follows_a_link_to_another_host(
    azure_prices: LocalServer, catalog: Catalog
) -> None:
    azure_prices.script = [
        Reply(200, {"Items": [], "NextPageLink": "http://198.51.100.1/api/retail/prices?x=1"})
    ]
    with pytest.raises(CostguardError, match="another host"):
        azure.fetch(
            target(catalog, "azure", "eastus"), azure_settings(azure_prices), now=NOW, retry=FAST
        )
    assert len(azure_prices.requests) == 1


def test_azure_endpoint_must_be_http(catalog: Catalog) -> None:
    from costguard.errors import InputError

    with pytest.raises(InputError):
        azure.fetch(
            target(catalog, "azure", "eastus"),
            Settings(azure_prices_endpoint="file:///etc/passwd"),
            now=NOW,
        )


# --- Errors that are not the SDK's own, and the shared paging guard ----------------------


def test_aws_connection_errors_are_translated(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Dropping:
        meta = type("Meta", (), {"endpoint_url": "https://pricing.example"})()

        def get_products(self, **kwargs: object) -> None:
            raise http.client.RemoteDisconnected("Remote end closed connection")

    monkeypatch.setattr("costguard.clouds.aws.client", lambda *args, **kwargs: Dropping())
    with pytest.raises(CostguardError, match="connection to AWS failed") as info:
        aws.fetch(target(catalog, "aws", "us-east-1"), Settings(), now=NOW, retry=FAST)
    assert "RemoteDisconnected" in info.value.message


def test_gcp_credentials_that_cannot_refresh_are_translated(
    gcp_catalog: CatalogServer, catalog: Catalog
) -> None:
    from google.auth import credentials as google_credentials
    from google.auth.exceptions import RefreshError

    class Revoked(google_credentials.Credentials):
        def refresh(self, request: object) -> None:
            raise RefreshError("invalid_grant: token revoked")

    with pytest.raises(CostguardError, match="credentials failed") as info:
        fetch_gcp(catalog, gcp_catalog, Revoked())
    assert "token revoked" in info.value.message
    assert "gcloud auth application-default login" in (info.value.hint or "")
    assert not gcp_catalog.requests


def test_azure_answers_cut_short_are_retried_then_translated(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def cut_short(url: str) -> None:
        calls.append(url)
        raise http.client.IncompleteRead(b"{", 100)

    monkeypatch.setattr(azure, "get_json", cut_short)
    with pytest.raises(CostguardError, match="connection to the Azure Retail Prices API"):
        azure.fetch(
            target(catalog, "azure", "eastus"),
            Settings(azure_prices_endpoint="http://127.0.0.1:9"),
            now=NOW,
            retry=FAST,
        )
    assert len(calls) == FAST.attempts


def test_azure_stops_on_a_next_page_sent_twice(azure_prices: LocalServer, catalog: Catalog) -> None:
    again = Reply(200, {"Items": [], "NextPageLink": f"{azure_prices.url}/api/retail/prices?p=2"})
    azure_prices.script = [again, again]
    with pytest.raises(CostguardError, match="twice: paging stopped"):
        azure.fetch(
            target(catalog, "azure", "eastus"), azure_settings(azure_prices), now=NOW, retry=FAST
        )
    assert len(azure_prices.requests) == 2


def test_pages_follows_tokens_lazily_and_stops_endless_paging() -> None:
    fetched: list[str | None] = []

    def book(token: str | None) -> tuple[list[int], str | None]:
        fetched.append(token)
        return {None: ([1, 2], "b"), "b": ([], "c"), "c": ([3], "")}[token]

    items = pages(book)
    assert next(items) == 1
    assert fetched == [None]  # one page at a time, as the items are used
    assert list(items) == [2, 3]
    assert fetched == [None, "b", "c"]
    with pytest.raises(CostguardError, match="'x' twice"):
        list(pages(lambda token: ([0], "x")))
    counter = iter(range(10**6))
    with pytest.raises(CostguardError, match="past 5 pages"):
        list(pages(lambda token: ([0], str(next(counter))), max_pages=5))


# --- Azure regions side by side ---------------------------------------------------------


def regions_target(catalog: Catalog, regions: tuple[str, ...]) -> Target:
    rows = tuple(r for r in catalog.instances if r.provider == "azure" and r.region in regions)
    return Target("azure", regions, rows)


def test_azure_reads_regions_side_by_side(catalog: Catalog) -> None:
    from tests.refresh.servers import Request, azure_item, azure_prices_handler

    regions = ("eastus", "eastus2", "westus2")
    items = [
        azure_item("Standard_NC4as_T4_v3", region, str((Decimal("0.5") + n) / divide), spot=spot)
        for n, region in enumerate(regions)
        for spot, divide in ((False, 1), (True, 5))
    ] * 3  # the same prices several times over: several pages per region
    serve = azure_prices_handler(items, page_size=2)
    # Every region's first page waits until another region's first page is asked for:
    # read one region after another, this would time out (and answer 500).
    together = threading.Barrier(len(regions), timeout=20)

    def handler(server: LocalServer, request: Request) -> Reply:
        if "$skip" not in request.query:
            try:
                together.wait()
            except threading.BrokenBarrierError:
                return Reply(500, {"Error": "the regions were read one after another"})
        return serve(server, request)

    server = LocalServer(handler)
    try:
        fresh = azure.fetch(
            regions_target(catalog, regions), azure_settings(server), now=NOW, retry=FAST
        )
    finally:
        server.close()
    for n, region in enumerate(regions):
        usd = Decimal("0.5") + n
        assert price(fresh, catalog, region, "Standard_NC4as_T4_v3") == {
            Market.ON_DEMAND: usd,
            Market.SPOT: usd / 5,
        }
    assert fresh.records == len(items)
    assert fresh.answered == frozenset(regions)
    assert not [t for t in threading.enumerate() if t.name.startswith("prices")]


def test_azure_one_region_failing_stops_the_others(catalog: Catalog) -> None:
    from tests.refresh.servers import Request, azure_item, azure_prices_handler

    items = [azure_item("Standard_D2s_v5", "eastus", "0.1")] * 400
    serve = azure_prices_handler(items, page_size=1)  # eastus: 400 pages

    def handler(server: LocalServer, request: Request) -> Reply:
        if "westus2" in request.query.get("$filter", ""):
            return Reply(403, {"Error": "forbidden"})
        return serve(server, request)

    server = LocalServer(handler)
    try:
        with pytest.raises(CostguardError, match="HTTP 403"):
            azure.fetch(
                regions_target(catalog, ("eastus", "westus2")),
                azure_settings(server),
                now=NOW,
                retry=FAST,
            )
        eastus = [r for r in server.requests if "eastus" in r.query.get("$filter", "")]
    finally:
        server.close()
    assert len(eastus) < 400  # stopped, not read to the end
    assert not [t for t in threading.enumerate() if t.name.startswith("prices")]


def test_interleave_stops_its_producers_when_closed() -> None:
    made: dict[str, int] = {}

    def endless(key: str):
        for n in range(10**9):  # bounded, but far more than the test reads
            made[key] = n
            yield key, n

    items = azure.interleave(endless, ["a", "b", "c"], 2)
    first = [next(items) for _ in range(10)]
    items.close()
    assert {key for key, _ in first} <= {"a", "b"}  # two at a time: c waits its turn
    assert "c" not in made  # and never started: closing cancelled it
    assert sum(made.values()) < 100  # held back by the bounded queue
    # close() returns once the producers have stopped: none is left running.
    assert not [t for t in threading.enumerate() if t.name.startswith("prices")]
