"""Azure: ``Preempt`` (and ``Terminate``) events from the Scheduled Events service.

``GET /metadata/scheduledevents?api-version=2020-07-01`` with ``Metadata: true`` answers
``{"DocumentIncarnation": n, "Events": [...]}``; a Spot eviction is an event with
``EventType: Preempt`` and a ``NotBefore`` time at least 30 s ahead.

>>> body = ('{"DocumentIncarnation": 1, "Events": [{"EventId": "e1", "EventType": "Preempt",'
...         ' "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "EventStatus": "Scheduled"}]}')
>>> parse_events(200, body, now_unix=0.0)
[Notice(source='azure', kind='preempt', deadline_unix=1474309787.0, detail='event e1')]
"""

from __future__ import annotations

import json
import time
from email.utils import parsedate_to_datetime

from costguard.checkpoint.notices import Notice, fetch

API_VERSION = "2020-07-01"
#: Event types that take the VM away; Reboot, Redeploy and Freeze pause it and come back.
KINDS = {"Preempt": "preempt", "Terminate": "terminate"}


def parse_events(status: int, body: str, now_unix: float) -> list[Notice]:
    """The notices in a Scheduled Events document (an event already started: due now)."""
    if status != 200:
        return []
    try:
        data = json.loads(body)
    except ValueError:
        return []
    events = data.get("Events") if isinstance(data, dict) else None
    notices = []
    for event in events if isinstance(events, list) else []:
        if not isinstance(event, dict) or event.get("EventType") not in KINDS:
            continue
        deadline = now_unix
        not_before = str(event.get("NotBefore") or "").strip()
        if not_before:
            try:
                deadline = parsedate_to_datetime(not_before).timestamp()
            except (TypeError, ValueError):
                deadline = now_unix
        notices.append(
            Notice("azure", KINDS[event["EventType"]], deadline, f"event {event.get('EventId')}")
        )
    return notices


class AzureScheduledEvents:
    """Polls Scheduled Events (the first call may take long: it enables the service)."""

    def __init__(self, base_url: str) -> None:
        self.url = f"{base_url.rstrip('/')}/metadata/scheduledevents?api-version={API_VERSION}"
        self._deadlines: dict[str, float | None] = {}

    def poll(self) -> list[Notice]:
        """The take-away events scheduled now (each keeps the deadline it first had)."""
        status, body = fetch("GET", self.url, {"Metadata": "true"})
        notices = []
        for notice in parse_events(status, body, time.time()):
            first = self._deadlines.setdefault(notice.detail, notice.deadline_unix)
            notices.append(Notice(notice.source, notice.kind, first, notice.detail))
        return notices
