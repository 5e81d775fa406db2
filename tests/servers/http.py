"""The one loopback HTTP server every fake in :mod:`tests.servers` runs on, and the
test-only client settings that let the real SDK clients reach them (Azure refuses bearer
tokens over plain http, so tests swap its authentication policy for a no-op).

:class:`Loopback` does the HTTP: a threaded server on 127.0.0.1 (a free port) that hands
each request to one function. :class:`LocalServer` (routes by method and path, for the
GCP Compute and Azure ARM fakes), :class:`JsonServer` (one routing function) and the price
API servers of ``tests/refresh/servers.py`` are shapes over it.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

#: ``(method, path with query, headers, body) -> (status, headers, body)``.
Answer = Callable[
    [str, str, Mapping[str, str], bytes], tuple[int, Sequence[tuple[str, str]], bytes]
]


class Loopback:
    """A threaded HTTP server on 127.0.0.1 answering every request with ``answer``; or, for
    a fake that speaks HTTP itself (a fault proxy, the metadata services), with its own
    ``handler`` class."""

    def __init__(
        self,
        answer: Answer | None = None,
        *,
        http11: bool = False,
        handler: type[BaseHTTPRequestHandler] | None = None,
    ) -> None:
        if handler is None:
            assert answer is not None, "Loopback needs an answer function or a handler class"
            handler = _answering(answer, http11)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=10)


def _answering(answer: Answer, http11: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if http11 else "HTTP/1.0"

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            status, headers, data = answer(self.command, self.path, dict(self.headers.items()), raw)
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _handle

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

    return Handler


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """:class:`Loopback` with ``handler`` for the block; its base URL."""
    server = Loopback(handler=handler)
    try:
        yield server.url
    finally:
        server.stop()


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def every_minute(now: datetime, value: float) -> list[tuple[datetime, float]]:
    """A metric series for the fakes: a point a minute for the 62 minutes before ``now``."""
    return [(now - timedelta(seconds=30 + 60 * k), value) for k in range(62)]


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, str]


Reply = tuple[int, Any, dict[str, str]]
Route = Callable[[Request, re.Match[str]], Reply]


class LocalServer:
    """Dispatches (method, path regex) to routes, JSON in and out; records requests."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._loopback = Loopback(self._answer)
        self.url = self._loopback.url

    def _answer(
        self, method: str, target: str, headers: Mapping[str, str], raw: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        parsed = urlparse(target)
        body = json.loads(raw) if raw else None
        request = Request(method, parsed.path, parse_qs(parsed.query), body, dict(headers))
        self.requests.append(request)
        status, payload, extra = self.dispatch(request)
        data = b"" if payload is None else json.dumps(payload).encode()
        sent = [("Content-Type", "application/json")]
        sent += [(name, value.format(base=self.url)) for name, value in extra.items()]
        return status, sent, data

    def routes(self) -> list[tuple[str, str, Route]]:
        """(method, path regex, handler) triples; subclasses list theirs."""
        raise NotImplementedError

    def dispatch(self, request: Request) -> Reply:
        for method, pattern, route in self.routes():
            match = re.fullmatch(pattern, request.path)
            if method == request.method and match:
                return route(request, match)
        return 404, {"error": {"code": 404, "message": f"no route {request.path}"}}, {}

    def calls(self, method: str, fragment: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and fragment in r.path]

    def stop(self) -> None:
        self._loopback.stop()


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any


#: ``(method, path, query, body) -> (status, payload)``: a :class:`JsonServer`'s routing.
JsonRoute = Callable[[str, str, dict[str, list[str]], Any], tuple[int, Any]]


@dataclass
class JsonServer:
    """JSON over HTTP with one routing function; records requests."""

    route: JsonRoute
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._loopback = Loopback(self._answer)
        self.url = self._loopback.url

    def _answer(
        self, method: str, target: str, headers: Mapping[str, str], raw: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        parts = urlparse(target)
        body = json.loads(raw) if raw else None
        query = parse_qs(parts.query)
        self.requests.append(Recorded(method, parts.path, query, body))
        status, payload = self.route(method, parts.path, query, body)
        return status, [("Content-Type", "application/json")], json.dumps(payload).encode()

    def stop(self) -> None:
        self._loopback.stop()

    def writes(self) -> list[Recorded]:
        return [r for r in self.requests if r.method != "GET"]


class FakeTokenCredential:
    """Stands in for ``DefaultAzureCredential``: the no-op policy never asks it for a token."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken("test-token", int(datetime.now(UTC).timestamp()) + 3600)


def azure_client_options() -> dict[str, Any]:
    """Azure refuses bearer tokens over plain http; tests swap the auth policy for a no-op."""
    from azure.core.pipeline.policies import SansIOHTTPPolicy

    return {"authentication_policy": SansIOHTTPPolicy(), "polling_interval": 0}


def azure_test_kwargs() -> dict[str, Any]:
    """The credential and no-op auth policy for a client built by the product's factory."""
    from azure.core.pipeline.policies import SansIOHTTPPolicy

    return {"credential": FakeTokenCredential(), "authentication_policy": SansIOHTTPPolicy()}


def with_test_auth(client_class: Any) -> Any:
    """``client_class`` (an adapter that builds its Azure clients the production way, such
    as the reaper's ``AzureFleet``) with the test's credential and no-op auth policy added."""

    class Authed(client_class):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(
                *args,
                **kwargs,
                credential=FakeTokenCredential(),
                client_options=azure_client_options(),
            )

    return Authed
