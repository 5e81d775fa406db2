"""Azure Scheduled Events: a Preempt is acknowledged (StartRequests with its EventId) on the
local metadata server, through the same notice the watcher posted and the relay carried."""

from __future__ import annotations

import logging
import time

import pytest

from costguard.checkpoint.notices import (
    Notice,
    NoticeBoard,
    Watcher,
    acknowledge,
    cloud_poller,
)
from costguard.checkpoint.notices.azure import AzureScheduledEvents, event_id
from tests.helpers.metadata import AckState, azure_event
from tests.helpers.processes import free_port
from tests.helpers.waiting import wait_for

PREEMPT = {
    "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
    "EventType": "Preempt",
    "ResourceType": "VirtualMachine",
    "Resources": ["vm1"],
    "EventStatus": "Scheduled",
    "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
    "Description": "Spot eviction",
    "EventSource": "Platform",
    "DurationInSeconds": -1,
}


def watched_notice(base: str) -> Notice:
    """The notice the Azure watcher posts for the event on the server."""
    board = NoticeBoard()
    watcher = Watcher("azure", cloud_poller("azure", base), board, interval_s=0.05)
    watcher.start()
    try:
        return wait_for(board.urgent, "the watcher's Preempt notice", timeout_s=10, poll_s=0.02)
    finally:
        watcher.stop()


def test_a_preempt_is_acknowledged_with_its_event_id(
    acking_metadata_server: tuple[str, AckState],
) -> None:
    base, state = acking_metadata_server
    state.azure_events = [dict(PREEMPT)]
    notice = watched_notice(base)
    assert state.started == []  # seeing the notice acknowledges nothing
    env = {"COSTGUARD_AZURE_METADATA_URL": base}
    assert acknowledge(notice, env) is True
    assert state.started == [PREEMPT["EventId"]]
    assert state.azure_events[0]["EventStatus"] == "Started"
    assert "POST /metadata/scheduledevents?api-version=2020-07-01" in state.requests


def test_the_event_id_survives_the_relay_of_costguard_run(
    acking_metadata_server: tuple[str, AckState],
) -> None:
    base, state = acking_metadata_server
    state.azure_events = [dict(PREEMPT)]
    relayed = Notice.from_json(watched_notice(base).to_json())
    assert event_id(relayed) == PREEMPT["EventId"]
    assert acknowledge(relayed, {"COSTGUARD_AZURE_METADATA_URL": base}) is True
    assert state.started == [PREEMPT["EventId"]]


def test_other_notices_acknowledge_nothing(
    acking_metadata_server: tuple[str, AckState],
) -> None:
    base, state = acking_metadata_server
    env = {"COSTGUARD_AZURE_METADATA_URL": base}
    for notice in (
        Notice("aws", "terminate", 1.0),
        Notice("gcp", "preempt", 1.0),
        Notice("signal", "signal", None, "SIGTERM"),
        Notice("azure", "preempt", 1.0, ""),  # no event id: nothing to acknowledge
    ):
        assert acknowledge(notice, env) is False
    assert state.requests == []


def test_an_event_no_longer_listed_is_logged_not_raised_nor_sent(
    acking_metadata_server: tuple[str, AckState], caplog: pytest.LogCaptureFixture
) -> None:
    base, state = acking_metadata_server
    state.azure_events = [dict(PREEMPT)]
    stale = Notice("azure", "preempt", 1.0, "event an-event-that-is-gone")
    with caplog.at_level(logging.WARNING):
        assert acknowledge(stale, {"COSTGUARD_AZURE_METADATA_URL": base}) is False
    assert "not acknowledged" in caplog.text
    assert state.started == []
    assert not [r for r in state.requests if r.startswith("POST")]


def test_a_siblings_eviction_is_neither_a_notice_nor_acknowledged(
    acking_metadata_server: tuple[str, AckState],
) -> None:
    # Azure lists every event of the availability set / placement group on each VM of it.
    base, state = acking_metadata_server
    sibling = azure_event("sib-1", ["vm2", "vm3"], str(PREEMPT["NotBefore"]))
    state.azure_events = [sibling]
    events = AzureScheduledEvents(base)
    assert events.poll() == []
    assert any("/metadata/instance/compute/name" in r for r in state.requests)
    # Even asked to, costguard does not approve a sibling's eviction.
    env = {"COSTGUARD_AZURE_METADATA_URL": base}
    assert acknowledge(Notice("azure", "preempt", 1.0, "event sib-1"), env) is False
    assert not [r for r in state.requests if r.startswith("POST")]
    assert state.azure_events[0]["EventStatus"] == "Scheduled"
    # This VM's own eviction, listed with the sibling's, is seen and acknowledged alone.
    state.azure_events.append(dict(PREEMPT))
    (notice,) = events.poll()
    assert event_id(notice) == PREEMPT["EventId"]
    assert acknowledge(notice, env) is True
    assert state.started == [PREEMPT["EventId"]]


def test_without_the_vm_name_every_eviction_saves_and_none_is_acknowledged(
    acking_metadata_server: tuple[str, AckState],
) -> None:
    base, state = acking_metadata_server
    state.azure_vm_name = ""  # instance metadata answers no name
    state.azure_events = [azure_event("sib-1", ["vm2"], str(PREEMPT["NotBefore"]))]
    (notice,) = AzureScheduledEvents(base).poll()
    assert notice.kind == "preempt"
    assert acknowledge(notice, {"COSTGUARD_AZURE_METADATA_URL": base}) is False
    assert state.started == []


def test_an_unreachable_service_is_not_an_error() -> None:
    notice = Notice("azure", "preempt", 1.0, f"event {PREEMPT['EventId']}")
    dead = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    assert acknowledge(notice, {"COSTGUARD_AZURE_METADATA_URL": dead}) is False
    assert time.monotonic() - started < 10  # bounded by the metadata timeout


def test_the_service_needs_the_metadata_header(
    acking_metadata_server: tuple[str, AckState],
) -> None:
    base, state = acking_metadata_server
    state.azure_events = [dict(PREEMPT)]
    # Our client sends it; the server (like Azure's) refuses a POST without it.
    assert AzureScheduledEvents(base).acknowledge([str(PREEMPT["EventId"])]) is True
    from costguard.checkpoint.notices import fetch

    status, _ = fetch("POST", f"{base}/metadata/scheduledevents", {}, data=b"{}")
    assert status == 400
