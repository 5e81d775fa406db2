"""Local HTTP servers speaking the documented REST shapes of the GCP Billing Budgets and
Cloud Monitoring APIs and the Azure Consumption API, for the real SDK clients.

They keep state in memory, record every request, and listen on loopback only.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

Route = Callable[[str, str, dict[str, list[str]], Any], tuple[int, Any]]


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any


@dataclass
class JsonServer:
    """A threaded JSON-over-HTTP server on 127.0.0.1 with one routing function."""

    route: Route
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                parts = urlsplit(self.path)
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


class FakeGcp:
    """Billing Budgets v1 (`/v1/billingAccounts/*/budgets`) and Monitoring v3 channels."""

    def __init__(self) -> None:
        self.budgets: dict[str, dict[str, Any]] = {}
        self.channels: dict[str, dict[str, Any]] = {}
        self.ids = itertools.count(1)

    def __call__(self, method: str, path: str, query: dict[str, list[str]], body: Any):
        segments = path.strip("/").split("/")
        if segments[0] == "v1" and segments[1] == "billingAccounts":
            return self._budgets(method, "/".join(segments[1:]), query, body)
        if segments[0] == "v3" and segments[1] == "projects":
            return self._channels(method, "/".join(segments[1:]), body)
        return 404, {"error": {"code": 404, "message": f"no route {path}", "status": "NOT_FOUND"}}

    def _budgets(self, method: str, resource: str, query, body):
        parts = resource.split("/")
        if len(parts) == 3 and method == "POST":  # billingAccounts/X/budgets
            name = f"{resource}/{next(self.ids)}"
            self.budgets[name] = {**body, "name": name, "etag": "1"}
            return 200, self.budgets[name]
        if len(parts) == 3 and method == "GET":
            items = [b for n, b in self.budgets.items() if n.startswith(resource + "/")]
            # Page by one so the client's pager is exercised.
            start = int(query.get("pageToken", ["0"])[0])
            page: dict[str, Any] = {"budgets": items[start : start + 1]}
            if start + 1 < len(items):
                page["nextPageToken"] = str(start + 1)
            return 200, page
        if resource not in self.budgets:
            return 404, {
                "error": {"code": 404, "message": "budget not found", "status": "NOT_FOUND"}
            }
        if method == "GET":
            return 200, self.budgets[resource]
        if method == "PATCH":
            self.budgets[resource] = {**body, "name": resource, "etag": "2"}
            return 200, self.budgets[resource]
        if method == "DELETE":
            del self.budgets[resource]
            return 200, {}
        return 405, {"error": {"code": 405, "message": method, "status": "UNIMPLEMENTED"}}

    def _channels(self, method: str, resource: str, body):
        if method == "POST":
            name = f"{resource}/{next(self.ids)}"
            self.channels[name] = {**body, "name": name}
            return 200, self.channels[name]
        items = [c for n, c in self.channels.items() if n.startswith(resource + "/")]
        return 200, {"notificationChannels": items}


class FakeAzure:
    """`{scope}/providers/Microsoft.Consumption/budgets[/{name}]` (PUT, GET, list, DELETE)."""

    def __init__(self) -> None:
        self.budgets: dict[str, dict[str, Any]] = {}

    def __call__(self, method: str, path: str, query, body):
        marker = "/providers/Microsoft.Consumption/budgets"
        if marker not in path:
            return 404, {"error": {"code": "NotFound", "message": path}}
        scope, _, name = path.partition(marker)
        name = name.strip("/")
        if not name:
            items = [b for key, b in self.budgets.items() if key.startswith(scope + marker)]
            return 200, {"value": items}
        key = f"{scope}{marker}/{name}"
        if method == "PUT":
            created = key not in self.budgets
            self.budgets[key] = {
                **body,
                "id": key,
                "name": name,
                "type": "Microsoft.Consumption/budgets",
                "eTag": "e1",
            }
            return (201 if created else 200), self.budgets[key]
        if key not in self.budgets:
            return 404, {"error": {"code": "NotFound", "message": "budget not found"}}
        if method == "DELETE":
            del self.budgets[key]
            return 200, {}
        return 200, self.budgets[key]


@pytest.fixture
def gcp_server() -> Iterator[tuple[JsonServer, FakeGcp]]:
    fake = FakeGcp()
    server = JsonServer(fake)
    yield server, fake
    server.stop()


@pytest.fixture
def azure_server() -> Iterator[tuple[JsonServer, FakeAzure]]:
    fake = FakeAzure()
    server = JsonServer(fake)
    yield server, fake
    server.stop()


class FakeTokenCredential:
    """A TokenCredential for tests: the local server does not check tokens."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken("test-token", 4_102_444_800)


def azure_test_kwargs() -> dict[str, Any]:
    """Azure refuses bearer tokens over plain http: tests swap in a no-op auth policy."""
    from azure.core.pipeline.policies import SansIOHTTPPolicy

    return {"credential": FakeTokenCredential(), "authentication_policy": SansIOHTTPPolicy()}
