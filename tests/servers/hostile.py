"""Metadata services that misbehave on purpose (issue 28): one that drips its answer a
byte at a time (each read well within any socket timeout, the whole answer never), and one
that floods an endless body. Both on loopback, both bounded so a client that does not cut
them off still ends (and its test fails on the time or memory it took)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.servers.http import Loopback

#: The dripping server gives up after this long; a client without a deadline waits it out.
DRIP_FOR_S = 30.0
#: The flooding server sends at most this much.
FLOOD_BYTES = 64 * 2**20


def _handler(mode: str, interval_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection does

        def do_GET(self) -> None:
            with contextlib.suppress(OSError):
                if mode == "drip-headers":
                    self._drip(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{}")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                if mode == "drip":
                    self._drip(b'{"subscriptionId": "' + b"0" * 1000)
                else:
                    chunk = b"[" * 2**20
                    for _ in range(FLOOD_BYTES // len(chunk)):
                        self.wfile.write(chunk)

        do_PUT = do_POST = do_GET

        def _drip(self, data: bytes) -> None:
            end = time.monotonic() + DRIP_FOR_S
            for byte in data:
                if time.monotonic() > end:
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(interval_s)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextlib.contextmanager
def hostile_server(mode: str, interval_s: float = 0.5) -> Iterator[str]:
    """The URL of a server that answers every request in ``mode``: ``drip`` (headers at
    once, then the body a byte every ``interval_s``), ``drip-headers`` (the status line and
    headers too) or ``flood`` (an endless body, up to :data:`FLOOD_BYTES`)."""
    server = Loopback(handler=_handler(mode, interval_s))
    try:
        yield server.url
    finally:
        server.stop()
