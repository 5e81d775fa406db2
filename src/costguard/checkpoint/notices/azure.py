"""Azure: ``Preempt`` (and ``Terminate``) events from the Scheduled Events service.

``GET /metadata/scheduledevents?api-version=2020-07-01`` with ``Metadata: true`` answers
``{"DocumentIncarnation": n, "Events": [...]}``; a Spot eviction is an event with
``EventType: Preempt`` and a ``NotBefore`` time at least 30 s ahead. ``POST`` to the same
URL with ``{"StartRequests": [{"EventId": ...}]}`` acknowledges an event: the platform may
then start it at once, before ``NotBefore`` - so costguard acknowledges only after the
emergency save is durable (:func:`acknowledge`), giving the time back to the platform
instead of leaving the VM idle until the deadline.

Events are per placement group: every VM of an availability set or a scale set's placement
group sees every event of the group, and only an event's ``Resources`` says which VMs it
concerns. So costguard reads this VM's name (``compute/name`` of the instance metadata, as
Azure's documentation compares it) and acts only on the events whose ``Resources`` list it:
a sibling's eviction neither saves nor stops this job, and is never acknowledged from here
(that would approve the sibling's eviction early). While the name cannot be read, every
take-away event is acted on (a needless save costs less than a lost run), and none is
acknowledged.

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
from costguard.logs import get_logger

logger = get_logger(__name__)

API_VERSION = "2020-07-01"
#: The instance metadata version that ``compute/name`` is read with.
INSTANCE_API_VERSION = "2021-02-01"
#: Event types that take the VM away; Reboot, Redeploy and Freeze pause it and come back.
KINDS = {"Preempt": "preempt", "Terminate": "terminate"}


def _events(status: int, body: str) -> list[dict[str, object]]:
    """The events of a Scheduled Events document (none for an error or junk)."""
    if status != 200:
        return []
    try:
        data = json.loads(body)
    except ValueError:
        return []
    events = data.get("Events") if isinstance(data, dict) else None
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []


def concerns(event: dict[str, object], vm_name: str | None) -> bool:
    """Whether ``event`` is about this VM: its ``Resources`` list ``vm_name``.

    An event without a ``Resources`` list, or a VM whose name is unknown, counts as this
    VM's (a save too many is cheap; a missed eviction loses the run).

    >>> concerns({"Resources": ["vm1"]}, "vm1"), concerns({"Resources": ["vm2"]}, "vm1")
    (True, False)
    >>> concerns({"Resources": ["vm2"]}, None), concerns({}, "vm1")
    (True, True)
    """
    resources = event.get("Resources")
    if vm_name is None or not isinstance(resources, list):
        return True
    return vm_name.lower() in {str(r).lower() for r in resources}


def names(event: dict[str, object], vm_name: str) -> bool:
    """Whether ``event``'s ``Resources`` name ``vm_name`` explicitly (the acknowledgement
    rule: only an event proven to be this VM's is approved from here).

    >>> names({"Resources": ["VM1"]}, "vm1"), names({}, "vm1")
    (True, False)
    """
    resources = event.get("Resources")
    return isinstance(resources, list) and vm_name.lower() in {str(r).lower() for r in resources}


def parse_events(
    status: int, body: str, now_unix: float, vm_name: str | None = None
) -> list[Notice]:
    """The notices in a Scheduled Events document that concern ``vm_name`` (see
    :func:`concerns`; an event already started: due now)."""
    notices = []
    for event in _events(status, body):
        if event.get("EventType") not in KINDS or not concerns(event, vm_name):
            continue
        deadline = now_unix
        not_before = str(event.get("NotBefore") or "").strip()
        if not_before:
            try:
                deadline = parsedate_to_datetime(not_before).timestamp()
            except (TypeError, ValueError):
                deadline = now_unix
        kind = KINDS[str(event["EventType"])]
        notices.append(Notice("azure", kind, deadline, f"event {event.get('EventId')}"))
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
        base = base_url.rstrip("/")
        self.url = f"{base}/metadata/scheduledevents?api-version={API_VERSION}"
        self.name_url = (
            f"{base}/metadata/instance/compute/name?api-version={INSTANCE_API_VERSION}&format=text"
        )
        self._deadlines: dict[str, float | None] = {}
        self._vm_name: str | None = None

    def vm_name(self) -> str | None:
        """This VM's name (``compute/name``), read once it answers; ``None`` until then."""
        if self._vm_name is None:
            status, body = fetch("GET", self.name_url, {"Metadata": "true"})
            if status == 200 and body.strip():
                self._vm_name = body.strip()
            else:
                logger.debug("Azure instance metadata gave no VM name: %d", status)
        return self._vm_name

    def poll(self) -> list[Notice]:
        """This VM's take-away events scheduled now (each keeps the deadline it first had)."""
        status, body = fetch("GET", self.url, {"Metadata": "true"})
        if not _events(status, body):
            return []
        notices = []
        for notice in parse_events(status, body, time.time(), self.vm_name()):
            first = self._deadlines.setdefault(notice.detail, notice.deadline_unix)
            notices.append(Notice(notice.source, notice.kind, first, notice.detail))
        return notices

    def acknowledge(self, event_ids: list[str]) -> bool:
        """Approve those of the events that name this VM now (``StartRequests``); whether
        the service accepted it. An event of a sibling VM (or one while this VM's name is
        unknown) is never approved: the platform would start the sibling's eviction early.
        """
        vm_name = self.vm_name()
        status, body = fetch("GET", self.url, {"Metadata": "true"})
        listed = {str(e.get("EventId")): e for e in _events(status, body)}
        mine = [e for e in event_ids if e in listed and vm_name and names(listed[e], vm_name)]
        if not mine:
            logger.warning(
                "costguard: Azure events %s not acknowledged: not listed for this VM (%s)",
                ", ".join(event_ids),
                vm_name or "its name unknown",
            )
            return False
        event_ids = mine
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
