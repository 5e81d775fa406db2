"""A fault-injecting HTTP proxy in front of a store emulator (moto S3, gcp-storage-emulator,
Azurite): it answers some uploads with an error, stalls or delays them, and counts what it
saw, so that the checkpoint tests can watch saves retry, fail and be reported."""

from __future__ import annotations

import contextlib
import http.client
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from tests.servers.http import serving


def _every_put(method: str, path: str) -> bool:
    return method == "PUT"


S3_SLOW_DOWN = b"<Error><Code>SlowDown</Code><Message>Please reduce</Message></Error>"


@dataclass
class Faults:
    """What the proxy does to the requests ``eligible`` picks (by default every PUT).

    It fails the next ``fail_puts`` of them with ``status`` and ``error_body``, stalls the
    next ``stall_puts`` for ``stall_s`` without answering, and delays the rest by
    ``delay_s``. Counters are kept under a lock: parts of one upload arrive concurrently.
    """

    fail_puts: int = 0
    #: S3's part-number limit (10,000; 0: not checked): a part numbered above it is
    #: refused with S3's 400 InvalidArgument (moto accepts any number).
    max_part_number: int = 0
    stall_puts: int = 0
    stall_s: float = 3.0
    failed: int = 0
    stalled: int = 0
    eligible: Callable[[str, str], bool] = _every_put
    status: int = 503
    error_body: bytes = S3_SLOW_DOWN
    error_headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    #: (method, path, headers) of every eligible request, in arrival order.
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    inflight: int = 0
    max_inflight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: What a writer racing the reader makes of a forwarded answer: (method, path, body)
    #: -> the body sent back (``None``: the store's own).
    rewrite: Callable[[str, str, bytes], bytes] | None = None

    def decide(self, method: str, path: str, headers: dict[str, str]) -> str:
        """``fail``, ``stall``, ``delay`` or ``pass`` for one request."""
        if not self.eligible(method, path):
            return "pass"
        with self.lock:
            self.seen.append((method, path, headers))
            number = re.search(r"[?&]partNumber=(\d+)", path)
            if self.max_part_number and number and int(number[1]) > self.max_part_number:
                return "too many parts"
            if self.fail_puts > 0:
                self.fail_puts -= 1
                self.failed += 1
                return "fail"
            if self.stall_puts > 0:
                self.stall_puts -= 1
                self.stalled += 1
                return "stall"
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            return "delay"


def make_handler(upstream: str, faults: Faults) -> type[BaseHTTPRequestHandler]:
    """A forwarding proxy to ``upstream`` that injects ``faults``."""
    target = urlsplit(upstream)

    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            action = faults.decide(self.command, self.path, headers)
            if action == "too many parts":
                limit = faults.max_part_number
                error = (
                    "<Error><Code>InvalidArgument</Code><Message>Part number must be an "
                    f"integer between 1 and {limit}, inclusive</Message></Error>"
                ).encode()
                self.send_response(400)
                self.send_header("Content-Length", str(len(error)))
                self.end_headers()
                self.wfile.write(error)
                return
            if action == "fail":
                self.send_response(faults.status)
                for key, value in faults.error_headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(faults.error_body)))
                self.end_headers()
                self.wfile.write(faults.error_body)
                return
            if action == "stall":
                time.sleep(faults.stall_s)  # longer than the client's read timeout
                self.close_connection = True
                return
            conn = http.client.HTTPConnection(
                target.hostname or "127.0.0.1", target.port, timeout=30
            )
            try:
                try:
                    if action == "delay" and faults.delay_s:
                        time.sleep(faults.delay_s)
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                    if faults.rewrite is not None:
                        data = faults.rewrite(self.command, self.path, data)
                finally:
                    if action == "delay":
                        with faults.lock:
                            faults.inflight -= 1
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            finally:
                conn.close()  # also when the client went away (a killed writer)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Proxy


@contextlib.contextmanager
def fault_proxy(upstream: str, faults: Faults) -> Iterator[str]:
    """Serve the proxy on loopback; yields its base URL."""
    with serving(make_handler(upstream, faults)) as url:
        yield url


def train(model: Any, opt: Any) -> None:
    """One SGD step of a ``Linear(6, ...)`` on random input: the weights change."""
    import torch

    loss = model(torch.randn(4, 6)).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
