"""Azure: ``Preempt`` (and ``Terminate``) events from the Scheduled Events service.

``GET /metadata/scheduledevents?api-version=2020-07-01`` with ``Metadata: true`` answers
``{"DocumentIncarnation": n, "Events": [...]}``; a Spot eviction is an event with
``EventType: Preempt`` and a ``NotBefore`` time at least 30 s ahead. ``POST`` to the same
URL with ``{"StartRequests": [{"EventId": ...}]}`` acknowledges an event: the platform may
then start it at once, before ``NotBefore`` - so costguard acknowledges only after the
emergency save is durable (:func:`acknowledge`), giving the time back to the platform
instead of leaving the VM idle until the deadline.

>>> body = ('{"DocumentIncarnation": 1, "Events": [{"EventId": "e1", "EventType": "Preempt",'
...         ' "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "EventStatus": "Scheduled"}]}')
>>> parse_events(200, body, now_unix=0.0)
[Notice(source='azure', kind='preempt', deadline_unix=1474309787.0, detail='event e1')]
"""

from __future__ import annotations

import json
import logging
import time
from email.utils import parsedate_to_datetime

from costguard.checkpoint.notices import Notice, fetch

logger = logging.getLogger(__name__)

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


def event_id(notice: Notice) -> str | None:
    """The EventId of the Scheduled Event an Azure notice announced, or ``None``.

    It travels in the notice's ``detail`` (``event <id>``), which survives the relay
    from ``costguard run`` to the training script.

    >>> event_id(Notice("azure", "preempt", 0.0, "event 602d9444-d2cd")), event_id(
    ...     Notice("aws", "terminate", 0.0, "event x"))
    ('602d9444-d2cd', None)
    """
    if notice.source != "azure" or not notice.detail.startswith("event "):
        return None
    found = notice.detail.removeprefix("event ").strip()
    return found if found and found != "None" else None


def start_requests(event_ids: list[str]) -> bytes:
    """The body of the acknowledgement POST.

    >>> start_requests(["e1"])
    b'{"StartRequests": [{"EventId": "e1"}]}'
    """
    return json.dumps({"StartRequests": [{"EventId": e} for e in event_ids]}).encode()


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

    def acknowledge(self, event_ids: list[str]) -> bool:
        """Approve the events now (``StartRequests``); whether the service accepted it."""
        status, body = fetch(
            "POST",
            self.url,
            {"Metadata": "true", "Content-Type": "application/json"},
            data=start_requests(event_ids),
        )
        if 200 <= status < 300:
            return True
        logger.warning(
            "costguard: Azure Scheduled Events refused the acknowledgement of %s: %d %s",
            ", ".join(event_ids),
            status,
            body[:200],
        )
        return False


def acknowledge(notice: Notice, base_url: str) -> bool:
    """Acknowledge the event behind an Azure ``notice``, best effort (never raises).

    Call it only once the emergency save is durable: the eviction may start the moment
    the service has it. Returns whether the service accepted it; ``False`` for a notice
    with no event id or when the service does not answer (the event then starts at its
    ``NotBefore`` time, as without an acknowledgement).
    """
    found = event_id(notice)
    if found is None:
        return False
    try:
        return AzureScheduledEvents(base_url).acknowledge([found])
    except OSError as exc:
        logger.warning("costguard: could not acknowledge Azure event %s: %s", found, exc)
        return False
