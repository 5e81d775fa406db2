"""Azure prices: the public Retail Prices REST API (no account, no SDK).

``GET {endpoint}/api/retail/prices?api-version=2023-01-01-preview&$filter=...`` for
``serviceName eq 'Virtual Machines'``, one query per region, pay-as-you-go
(``priceType eq 'Consumption'``), following ``NextPageLink`` page by page (only to the
same host). A region's pages come one after another (each names the next), so a few
regions are read at once (:data:`REGION_WORKERS`): the API's latency per page, not the
parsing, is what a refresh of every region waits on. Plain :mod:`urllib` with timeouts;
throttling (429, with ``Retry-After``) and 5xx are retried. ``Settings.azure_prices_endpoint``
points it at a mirror or a test server.
"""

from __future__ import annotations

import gzip
import http.client
import json
import queue
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

from costguard._version import __version__
from costguard.clouds import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, pages
from costguard.errors import CostguardError, InputError
from costguard.pricing.refresh import mirror as mirrors
from costguard.pricing.refresh.merge import FreshPrices, Target
from costguard.pricing.refresh.parse_azure import azure_prices
from costguard.pricing.refresh.progress import RecordCounter
from costguard.retry import (
    API_RETRY,
    RetryPolicy,
    Transient,
    call_with_retry,
    parse_retry_after,
)
from costguard.settings import Settings

DEFAULT_ENDPOINT = "https://prices.azure.com"
API_VERSION = "2023-01-01-preview"
MAX_PAGES = 10_000
#: One socket timeout covers connecting and each read (urllib has a single timeout).
TIMEOUT_S = max(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
#: Regions read at once. Pages read ahead wait in a queue of twice as many, so memory
#: stays a few pages whatever the number of regions.
REGION_WORKERS = 4
#: How often a reader blocked on a full queue looks whether the refresh was abandoned.
_POLL_S = 0.1

_T = TypeVar("_T")


def fetch(
    target: Target,
    settings: Settings,
    *,
    now: datetime,
    mirror: Path | None = None,
    retry: RetryPolicy | None = None,
    progress: Callable[[int], object] | None = None,
) -> FreshPrices:
    """Fresh Azure prices for ``target`` from the Retail Prices API, or from ``mirror``.

    Raises :class:`~costguard.errors.CostguardError` saying what failed.
    """
    count = RecordCounter(progress)
    if mirror is not None:
        responses: Iterator[Mapping[str, Any]] = mirrors.pages(mirror, "azure", "prices")
        source = f"Azure Retail Prices API responses in {mirror / 'azure'}"
    else:
        endpoint = endpoint_of(settings)
        responses = _live_pages(endpoint, target.regions, retry or API_RETRY)
        source = f"Azure Retail Prices API ({endpoint}/api/retail/prices)"
    paging = PageChains()
    items = (
        item
        for page in paging.watch(responses)
        for item in mirrors.records(page, "Items", "Azure Retail Prices")
    )
    try:
        rows = replace(azure_prices(count(items), target.rows), partial=paging.partial)
        # effectiveStartDate says since when a price holds, not when it was read: a
        # mirror's prices are as old as its download (fetched.json, else its files).
        days = {} if mirror is None else mirrors.as_of(mirror, "azure", target.regions, {})
    except urllib.error.HTTPError as exc:
        raise _http_error(exc) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        reason = getattr(exc, "reason", exc)
        msg = f"cannot reach the Azure Retail Prices API at {endpoint_of(settings)}: {reason}"
        raise CostguardError(
            msg, hint="check the network, and COSTGUARD_AZURE_PRICES_ENDPOINT if you set it"
        ) from None
    except (http.client.HTTPException, OSError) as exc:  # a cut answer, a bad gzip body
        msg = (
            f"the connection to the Azure Retail Prices API at {endpoint_of(settings)} "
            f"failed: {exc!r}"
        )
        raise CostguardError(
            msg, hint="try again later; check COSTGUARD_AZURE_PRICES_ENDPOINT if you set it"
        ) from None
    return target.read(rows, source=source, fetched_at=now, records=count.total, dated=days)


_REGION_FILTER = re.compile(r"armRegionName(?:\s|%20)+eq(?:\s|%20)+(?:'|%27)([^'%]+)")


class PageChains:
    """Which regions' answers are incomplete: a region whose pages name a
    ``NextPageLink`` and none of which is a last page (no ``NextPageLink``). A mirror
    holding page 1 of 20 is an incomplete answer, not the region's whole price list.

    A page's region is its items' ``armRegionName``, or the one its ``NextPageLink``'s
    filter names.

    >>> chains = PageChains()
    >>> link = "https://prices.azure.com/api/retail/prices?$filter=armRegionName eq 'eastus2'"
    >>> pages = [{"Items": [{"armRegionName": "eastus2"}], "NextPageLink": link},
    ...          {"Items": [{"armRegionName": "westus2"}], "NextPageLink": None}]
    >>> _ = list(chains.watch(pages))
    >>> sorted(chains.partial)
    ['eastus2']
    """

    def __init__(self) -> None:
        self._open: set[str] = set()
        self._closed: set[str] = set()

    def watch(self, pages: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
        """``pages``, unchanged, noting each page's region and whether more follow."""
        for page in pages:
            yield page
            link = page.get("NextPageLink") or None
            regions = {
                str(item["armRegionName"]).lower()
                for item in page.get("Items") or ()
                if isinstance(item, Mapping) and item.get("armRegionName")
            }
            named = _REGION_FILTER.search(str(link)) if link else None
            if named:
                regions.add(named[1].lower())
            (self._open if link else self._closed).update(regions)

    @property
    def partial(self) -> frozenset[str]:
        """The regions with a next page and no last page among the pages watched."""
        return frozenset(self._open - self._closed)


def _http_error(exc: urllib.error.HTTPError) -> CostguardError:
    try:
        detail = exc.read(500).decode("utf-8", "replace").strip()
    except OSError:
        detail = ""
    finally:
        exc.close()
    text = f"the Azure Retail Prices API answered HTTP {exc.code} {exc.reason}"
    if detail:
        text += f": {detail}"
    if exc.code == 429 or exc.code >= 500:
        return CostguardError(text, hint="the API is busy or failing: try again later")
    return CostguardError(text, hint="check COSTGUARD_AZURE_PRICES_ENDPOINT if you set it")


def endpoint_of(settings: Settings) -> str:
    """The API's base URL (``http`` or ``https``), without a trailing slash.

    >>> endpoint_of(Settings())
    'https://prices.azure.com'
    """
    endpoint = (settings.azure_prices_endpoint or DEFAULT_ENDPOINT).rstrip("/")
    if urllib.parse.urlsplit(endpoint).scheme not in ("http", "https"):
        msg = f"the Azure prices endpoint must be an http(s) URL, not {endpoint!r}"
        raise InputError(msg, hint="e.g. COSTGUARD_AZURE_PRICES_ENDPOINT=https://prices.azure.com")
    return endpoint


def region_url(endpoint: str, region: str) -> str:
    """The first page's URL for one region's Linux and Spot VM prices.

    >>> region_url("https://prices.azure.com", "eastus")  # doctest: +ELLIPSIS
    "https://prices.azure.com/api/retail/prices?api-version=...&$filter=serviceName%20eq%20'Vir..."
    """
    odata_filter = (
        f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' "
        "and priceType eq 'Consumption'"
    )
    # Spelled as the API's documentation does: a literal $filter, spaces as %20.
    query = urllib.parse.urlencode(
        {"api-version": API_VERSION, "$filter": odata_filter},
        quote_via=urllib.parse.quote,
        safe="$'",
    )
    return f"{endpoint}/api/retail/prices?{query}"


def _live_pages(
    endpoint: str, regions: tuple[str, ...], policy: RetryPolicy
) -> Iterator[Mapping[str, Any]]:
    """Every page of each region's prices, following ``NextPageLink`` on the endpoint's
    host only (:func:`costguard.clouds.pages` stops a link repeated or never ending);
    :data:`REGION_WORKERS` regions at a time, pages of different regions interleaved."""

    def region_pages(region: str) -> Iterator[Mapping[str, Any]]:
        first = region_url(endpoint, region)

        def fetch(url: str | None) -> tuple[list[dict[str, Any]], str | None]:
            page = call_with_retry(partial(get_json, url or first), _transient, policy)
            link = page.get("NextPageLink") or None
            if link is not None and not same_origin(str(link), endpoint):
                msg = f"the Azure Retail Prices API sent a next page on another host: {link}"
                raise CostguardError(msg, hint="set COSTGUARD_AZURE_PRICES_ENDPOINT to that host")
            return [page], None if link is None else str(link)

        return pages(fetch, max_pages=MAX_PAGES)

    return interleave(region_pages, regions, REGION_WORKERS)


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_DONE = object()


def interleave(
    produce: Callable[[str], Iterable[_T]], keys: Iterable[str], workers: int
) -> Generator[_T, None, None]:
    """The items of ``produce(key)`` for every key, ``workers`` keys at a time, in the
    order they come (each key's own items in order).

    The first error of any key is raised here, and the other keys stop before their next
    item (an item being fetched is finished: each fetch has its own timeout). Items wait
    in a queue of ``2 * workers``: a slow consumer holds the producers back. Closing the
    iterator early stops them the same way.

    >>> sorted(interleave(lambda key: [key * 2, key * 3], ["a", "b", "c"], 2))
    ['aa', 'aaa', 'bb', 'bbb', 'cc', 'ccc']
    >>> list(interleave(lambda key: [1 // 0], ["a"], 2))
    Traceback (most recent call last):
    ...
    ZeroDivisionError: integer division or modulo by zero
    """
    keys = list(keys)
    if workers <= 1 or len(keys) <= 1:
        for key in keys:
            yield from produce(key)
        return
    waiting: queue.Queue[object] = queue.Queue(maxsize=2 * workers)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                waiting.put(item, timeout=_POLL_S)
            except queue.Full:
                continue
            return True
        return False

    def work(key: str) -> None:
        try:
            if stop.is_set():
                return
            items = iter(produce(key))
            while not stop.is_set():
                try:
                    item = next(items)
                except StopIteration:
                    break
                if not put(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put(_Failed(exc))
        finally:
            put(_DONE)

    pool = ThreadPoolExecutor(max_workers=min(workers, len(keys)), thread_name_prefix="prices")
    try:
        for key in keys:
            pool.submit(work, key)
        finished = 0
        while finished < len(keys):
            item = waiting.get()
            if item is _DONE:
                finished += 1
            elif isinstance(item, _Failed):
                raise item.error
            else:
                yield cast(_T, item)  # what produce made
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)


def get_json(url: str) -> dict[str, Any]:
    """GET ``url`` and parse the JSON object it answers; fractions become Decimal.

    Raises :class:`urllib.error.URLError` (``HTTPError`` for an HTTP error status),
    ``TimeoutError``, or :class:`~costguard.errors.CostguardError` for a body that is
    not a JSON object.
    """
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        msg = f"refusing a non-HTTP URL: {url}"
        raise CostguardError(msg)
    request = urllib.request.Request(  # noqa: S310 - http(s) only, checked above
        url,
        headers={
            "Accept": "application/json",
            "Accept-Encoding": "gzip",
            "User-Agent": f"costguard/{__version__}",
        },
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    try:
        page = json.loads(body, parse_float=Decimal)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        msg = f"the Azure Retail Prices API answered something that is not JSON ({exc})"
        raise CostguardError(msg, hint="try again later") from None
    if not isinstance(page, dict):
        msg = "the Azure Retail Prices API answered JSON that is not an object"
        raise CostguardError(msg, hint="try again later")
    return page


def same_origin(url: str, endpoint: str) -> bool:
    """Whether ``url`` is on the endpoint's scheme and host (default ports ignored).

    >>> same_origin("https://prices.azure.com:443/api/retail/prices?x", "https://prices.azure.com")
    True
    >>> same_origin("https://elsewhere.example/api", "https://prices.azure.com")
    False
    """
    a, b = urllib.parse.urlsplit(url), urllib.parse.urlsplit(endpoint)
    default = {"http": 80, "https": 443}
    return (a.scheme, a.hostname, a.port or default.get(a.scheme)) == (
        b.scheme,
        b.hostname,
        b.port or default.get(b.scheme),
    )


def _transient(exc: Exception) -> Transient | None:
    """429, 5xx, timeouts and dropped connections are worth another try."""
    if isinstance(exc, urllib.error.HTTPError):
        if exc.code == 429 or exc.code >= 500:
            return Transient(f"HTTP {exc.code}", parse_retry_after(exc.headers.get("Retry-After")))
        return None
    if isinstance(exc, urllib.error.URLError | TimeoutError | ConnectionError):
        return Transient(str(exc))
    if isinstance(exc, http.client.HTTPException):  # e.g. an answer cut short
        return Transient(repr(exc))
    return None
