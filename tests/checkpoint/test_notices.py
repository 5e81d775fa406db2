"""Notice watchers against local metadata servers, cloud detection, signals."""

from __future__ import annotations

import os
import signal
import time
from email.utils import formatdate
from pathlib import Path

import pytest

from costguard.checkpoint.notices import (
    Notice,
    NoticeBoard,
    PipeListener,
    Watcher,
    detect_cloud,
    poll_interval_s,
    relay,
    start_cloud_watcher,
)
from costguard.checkpoint.notices.aws import AwsMetadata, parse_instance_action
from costguard.checkpoint.notices.azure import AzureScheduledEvents
from costguard.checkpoint.notices.gcp import GcpMetadata
from costguard.checkpoint.notices.signals import install
from costguard.errors import InputError
from tests.helpers.metadata import MetadataState
from tests.helpers.processes import free_port
from tests.helpers.waiting import wait_for


def wait_for_notice(board: NoticeBoard) -> Notice:
    return wait_for(board.urgent, "a notice on the board", timeout_s=10, poll_s=0.02)


def test_aws_imdsv2_notice_with_its_deadline(metadata_server: tuple[str, MetadataState]) -> None:
    base, state = metadata_server
    aws = AwsMetadata(base)
    assert aws.poll() == []
    state.aws_rebalance = {"noticeTime": "2020-10-27T08:22:00Z"}
    state.aws_action = {"instance-action": "stop", "time": "2030-01-01T00:02:00Z"}
    notices = aws.poll()
    assert [(n.kind, n.deadline_unix) for n in notices] == [
        ("stop", 1893456120.0),
        ("rebalance", None),
    ]
    assert any(r.startswith("PUT /latest/api/token") for r in state.requests)
    state.tokens.clear()  # tokens expired: a 401 makes it fetch a new one
    assert len(aws.poll()) == 2


def test_aws_parser_tolerates_junk() -> None:
    assert parse_instance_action(200, "not json") is None
    assert parse_instance_action(200, "[]") is None
    assert parse_instance_action(200, '{"action": "explode"}').kind == "terminate"  # type: ignore[union-attr]


def test_gcp_preempted_flag(metadata_server: tuple[str, MetadataState]) -> None:
    base, state = metadata_server
    gcp = GcpMetadata(base)
    assert gcp.poll() == []
    state.gcp_preempted = True
    first = gcp.poll()
    assert first[0].kind == "preempt"
    assert first[0].deadline_unix is not None
    assert abs(first[0].deadline_unix - time.time() - 30) < 5
    assert gcp.poll() == first  # the deadline stays the first one


@pytest.mark.parametrize("quiet", ["NONE", "MIGRATE_ON_HOST_MAINTENANCE"])
def test_gcp_host_maintenance_that_stops_the_vm_is_a_notice(
    quiet: str, metadata_server: tuple[str, MetadataState]
) -> None:
    # cloud.google.com/compute/docs/gpus/gpu-host-maintenance: a GPU VM is stopped for
    # host maintenance, announced on instance/maintenance-event; a migration is not a stop.
    base, state = metadata_server
    gcp = GcpMetadata(base)
    state.gcp_maintenance = quiet
    assert gcp.poll() == []
    assert any("/instance/maintenance-event" in r for r in state.requests)
    state.gcp_maintenance = "TERMINATE_ON_HOST_MAINTENANCE"
    (notice,) = gcp.poll()
    assert notice.urgent
    assert (notice.source, notice.kind) == ("gcp", "stop")
    assert notice.deadline_unix is not None
    assert 0 < notice.deadline_unix - time.time() <= 60
    state.gcp_maintenance = "NONE"  # the key goes back once the event is over
    assert gcp.poll() == [notice]


def test_azure_preempt_event_uses_not_before(metadata_server: tuple[str, MetadataState]) -> None:
    base, state = metadata_server
    azure = AzureScheduledEvents(base)
    state.azure_events = [{"EventId": "r", "EventType": "Reboot", "NotBefore": ""}]
    assert azure.poll() == []
    when = time.time() + 45
    state.azure_events.append(
        {"EventId": "p", "EventType": "Preempt", "NotBefore": formatdate(when, usegmt=True)}
    )
    (notice,) = azure.poll()
    assert notice.kind == "preempt"
    assert notice.deadline_unix is not None
    assert abs(notice.deadline_unix - when) < 1.5


def test_watcher_posts_once_and_survives_a_dead_endpoint() -> None:
    board = NoticeBoard()
    dead = AwsMetadata(f"http://127.0.0.1:{free_port()}")
    watcher = Watcher("aws", dead.poll, board, interval_s=0.05)
    watcher.start()
    wait_for(lambda: watcher.polls >= 3, "three polls of a dead endpoint", timeout_s=10)
    watcher.stop()
    watcher.join(5)
    assert watcher.polls >= 3
    assert board.all() == []
    board2 = NoticeBoard()
    same = Notice("gcp", "preempt", 1.0)
    w2 = Watcher("x", lambda: [same], board2, interval_s=0.01)
    w2.start()
    wait_for_notice(board2)
    seen = w2.polls  # the same notice polled three more times: still posted once
    wait_for(lambda: w2.polls >= seen + 3, "three more polls of the same notice", timeout_s=10)
    w2.stop()
    w2.join(5)
    assert board2.all() == [same]


def test_start_cloud_watcher_from_env(metadata_server: tuple[str, MetadataState]) -> None:
    base, state = metadata_server
    board = NoticeBoard()
    env = {
        "COSTGUARD_CLOUD": "gcp",
        "COSTGUARD_GCP_METADATA_URL": base,
        "COSTGUARD_NOTICE_POLL_S": "0.05",
    }
    watcher = start_cloud_watcher(board, env)
    assert watcher is not None
    state.gcp_preempted = True
    assert wait_for_notice(board).source == "gcp"
    watcher.stop()


def test_off_cloud_nothing_is_polled(tmp_path: Path) -> None:
    (tmp_path / "sys_vendor").write_text("Dell Inc.\n")
    assert detect_cloud({}, tmp_path) is None
    assert detect_cloud({}, tmp_path / "missing") is None
    assert start_cloud_watcher(NoticeBoard(), {"COSTGUARD_CLOUD": "none"}) is None
    (tmp_path / "sys_vendor").write_text("Amazon EC2\n")
    assert detect_cloud({}, tmp_path) == "aws"
    (tmp_path / "sys_vendor").write_text("Google\n")
    assert detect_cloud({}, tmp_path) == "gcp"
    (tmp_path / "sys_vendor").write_text("Microsoft Corporation\n")
    assert detect_cloud({}, tmp_path) is None  # Hyper-V on a desk is not Azure
    (tmp_path / "chassis_asset_tag").write_text("7783-7084-3265-9085-8269-3286-77\n")
    assert detect_cloud({}, tmp_path) == "azure"
    with pytest.raises(InputError):
        detect_cloud({"COSTGUARD_CLOUD": "mars"})
    with pytest.raises(InputError):
        poll_interval_s({"COSTGUARD_NOTICE_POLL_S": "0"})


def test_signals_post_notices_and_undo_restores_handlers() -> None:
    board = NoticeBoard()
    before = signal.getsignal(signal.SIGUSR1)
    undo = install(board, [signal.SIGUSR1, signal.SIGTERM])
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_for_notice(board).detail == "SIGTERM"
    finally:
        undo()
    assert signal.getsignal(signal.SIGUSR1) == before


def test_pipe_relay_round_trip() -> None:
    read_fd, write_fd = os.pipe()
    board = NoticeBoard()
    listener = PipeListener(read_fd, board)
    listener.start()
    os.write(write_fd, b"garbage\n")
    relay(write_fd, Notice("azure", "preempt", 12.5, "event x"))
    assert wait_for_notice(board) == Notice("azure", "preempt", 12.5, "event x")
    os.close(write_fd)
    listener.join(5)
    assert not listener.is_alive()
