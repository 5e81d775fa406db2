"""The loopback HTTP servers every fake in :mod:`tests.fakes` runs on, and the test-only
client settings that let the real SDK clients reach them (Azure refuses bearer tokens over
plain http, so tests swap its authentication policy for a no-op).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    """A threaded HTTP server dispatching (method, path regex) to routes; records requests."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                parsed = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                request = Request(
                    self.command, parsed.path, parse_qs(parsed.query), body, dict(self.headers)
                )
                server.requests.append(request)
                status, payload, headers = server.dispatch(request)
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value.format(base=server.url))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

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
        self.httpd.shutdown()
        self.httpd.server_close()


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
    """A threaded JSON-over-HTTP server on 127.0.0.1 with one routing function."""

    route: JsonRoute
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                parts = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                query = parse_qs(parts.query)
                server.requests.append(Recorded(self.command, parts.path, query, body))
                status, payload = server.route(self.command, parts.path, query, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

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
