"""A metadata service that drips or floods costs at most its deadline and 1 MiB (issue 28):
the notice watchers' requests (AWS IMDSv2 token and notices, GCP, Azure scheduled events)
and the agent's Azure identity call. A socket timeout bounds each read, not the answer;
before, a byte every half second blocked the watcher for good and a flood grew it to
hundreds of MB."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from costguard.checkpoint.notices import HTTP_TIMEOUT_S, cloud_poller, fetch
from costguard.clouds import metadata
from costguard.errors import CostguardError
from costguard.reaper.agent import IMDS_DEADLINE_S, AzureDeallocate
from costguard.settings import Settings
from tests.servers.hostile import DRIP_FOR_S, hostile_server

#: A generous margin over a deadline on a loaded machine, far under the drip's length.
MARGIN_S = 8.0


def spent(call: Callable[[], Any]) -> tuple[float, int, BaseException | None]:
    """Seconds, peak traced bytes and the exception of ``call``, run on a thread that
    must end within the drip's length (a client without a deadline waits it out)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        tracemalloc.start()
        start = time.monotonic()
        try:
            call()
        except BaseException as exc:
            outcome["error"] = exc
        outcome["s"] = time.monotonic() - start
        outcome["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DRIP_FOR_S + 30)
    assert not thread.is_alive(), "the request outlived the server's drip"
    return outcome["s"], outcome["peak"], outcome.get("error")


def notice_calls(url: str) -> list[Callable[[], Any]]:
    return [
        lambda: fetch("GET", f"{url}/computeMetadata/v1/instance/preempted", {}),
        lambda: cloud_poller("gcp", url)(),
        lambda: cloud_poller("aws", url)(),
        lambda: cloud_poller("azure", url)(),
    ]


@pytest.mark.parametrize("mode", ["drip", "drip-headers"])
def test_a_dripping_metadata_service_costs_at_most_the_deadline(mode: str) -> None:
    with hostile_server(mode) as url:
        for call in notice_calls(url)[:2]:
            seconds, _, error = spent(call)
            assert seconds < HTTP_TIMEOUT_S + MARGIN_S
            assert error is None or isinstance(error, OSError)
        seconds, _, error = spent(AzureDeallocate(Settings(), imds=url).identity)
        assert seconds < IMDS_DEADLINE_S + MARGIN_S
        assert isinstance(error, CostguardError)


def test_a_flooding_metadata_service_costs_at_most_a_mebibyte() -> None:
    with hostile_server("flood") as url:
        for call in notice_calls(url):
            _, peak, error = spent(call)
            assert peak < 4 * metadata.MAX_BYTES  # the 1 MiB cap and a read's buffers
            assert error is None or isinstance(error, OSError)
        _, peak, error = spent(AzureDeallocate(Settings(), imds=url).identity)
        assert peak < 4 * metadata.MAX_BYTES
        assert isinstance(error, CostguardError)
    with hostile_server("flood") as url, pytest.raises(OSError, match="more than 1048576 bytes"):
        fetch("GET", f"{url}/x", {})


def test_a_whole_answer_within_the_budget_is_read() -> None:
    with hostile_server("drip", interval_s=0.001) as url:
        status, body = metadata.fetch("GET", f"{url}/x", {}, deadline_s=30.0, max_bytes=4096)
    assert status == 200
    assert body.startswith(b'{"subscriptionId": "000')
    with pytest.raises(OSError, match="http"):
        metadata.fetch("GET", "file:///etc/passwd", {}, deadline_s=1.0)
