"""Faults: an HTTP proxy in front of moto S3 that answers some requests with 503 or
stalls them. Saves retry and succeed, or are reported; training goes on; nothing
earlier is lost. The proxy (:func:`fault_proxy`) also serves the GCS and Azure fault
tests and the multipart tests."""

from __future__ import annotations

import contextlib
import http.client
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

import pytest
import torch

from costguard.checkpoint import Checkpointer, RetryPolicy
from tests.helpers.stores import make_s3_bucket
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

    def decide(self, method: str, path: str, headers: dict[str, str]) -> str:
        """``fail``, ``stall``, ``delay`` or ``pass`` for one request."""
        if not self.eligible(method, path):
            return "pass"
        with self.lock:
            self.seen.append((method, path, headers))
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


@pytest.fixture
def flaky_s3(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    make_s3_bucket(aws_env, "flaky")
    faults = Faults()
    with fault_proxy(aws_env, faults) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
        yield faults


def train(model: torch.nn.Linear, opt: torch.optim.Optimizer) -> None:
    loss = model(torch.randn(4, 6)).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()


FAST = RetryPolicy(attempts=4, base_delay_s=0.05, max_delay_s=0.2)


@pytest.mark.slow
def test_throttled_and_stalled_puts_are_retried(flaky_s3: Faults) -> None:
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpointer(
        "s3://flaky/run",
        every_steps=1,
        retry=FAST,
        storage_options={"config_kwargs": {"read_timeout": 1, "retries": {"max_attempts": 1}}},
    )
    flaky_s3.fail_puts, flaky_s3.stall_puts, flaky_s3.stall_s = 3, 1, 2.0
    for step in range(3):
        train(model, opt)
        ckpt.step(step, model=model, optimizer=opt)
    ckpt.close()
    assert flaky_s3.failed == 3
    assert flaky_s3.stalled == 1
    assert [r.ok for r in ckpt.results] == [True, True, True]
    fresh = torch.nn.Linear(6, 3)
    assert Checkpointer("s3://flaky/run").restore(model=fresh) == 3
    assert torch.equal(fresh.weight, model.weight)


@pytest.mark.slow
def test_a_store_that_keeps_failing_is_reported_and_loses_nothing(flaky_s3: Faults) -> None:
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpointer(
        "s3://flaky/run",
        every_steps=1,
        retry=FAST,
        storage_options={"config_kwargs": {"retries": {"max_attempts": 1}}},
    )
    train(model, opt)
    ckpt.step(0, model=model, optimizer=opt)
    ckpt.flush()
    saved = model.weight.detach().clone()
    flaky_s3.fail_puts = 10**6  # the store refuses every write from now on
    for step in range(1, 3):
        train(model, opt)
        assert ckpt.step(step, model=model, optimizer=opt) is False  # training goes on
    ckpt.close()  # tries the last step once more, as the final save: it fails too
    assert [(r.ok, r.reason) for r in ckpt.results] == [
        (True, "schedule"),
        (False, "schedule"),
        (False, "schedule"),
        (False, "final"),
    ]
    assert all("Please reduce" in (r.error or "") for r in ckpt.results[1:])
    flaky_s3.fail_puts = 0
    fresh = torch.nn.Linear(6, 3)
    assert Checkpointer("s3://flaky/run").restore(model=fresh) == 1
    assert torch.equal(fresh.weight, saved)
