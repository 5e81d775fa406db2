"""A loopback server that plays the three clouds' instance metadata services (IMDSv2
spot notices and rebalance recommendations, GCP ``preempted`` and ``maintenance-event``,
Azure Scheduled Events with their ``StartRequests`` acknowledgements and the instance
metadata's ``compute/name``); tests flip its state while training runs. The fixtures
``metadata_server`` and ``acking_metadata_server`` are in tests/checkpoint.

Azure delivers the events of a whole availability set or scale-set placement group to each
of its VMs; an event's ``Resources`` names the VMs it concerns (:func:`azure_event` makes
one for this VM or a sibling). Source: learn.microsoft.com/azure/virtual-machines/linux/
scheduled-events ("Scope", "Event properties")."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.servers.http import serving as loopback


@dataclass
class MetadataState:
    """What the fake metadata service answers; tests flip it while training runs."""

    aws_action: dict[str, str] | None = None
    aws_rebalance: dict[str, str] | None = None
    gcp_preempted: bool = False
    #: ``instance/maintenance-event``: NONE, MIGRATE_ON_HOST_MAINTENANCE or
    #: TERMINATE_ON_HOST_MAINTENANCE (cloud.google.com/compute/docs/gpus/gpu-host-maintenance).
    gcp_maintenance: str = "NONE"
    #: This VM's name (``compute.name``); the events' ``Resources`` name it or its siblings.
    azure_vm_name: str = "vm1"
    azure_events: list[dict[str, Any]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)
    #: A gang node's own tags / metadata (what the controller wrote after the launch):
    #: AWS instance tags (IMDSv2 ``tags/instance/<key>``), GCP metadata attributes, Azure
    #: tags (``compute/tagsList``); and the instance's private address on each service.
    aws_tags: dict[str, str] = field(default_factory=dict)
    gcp_attributes: dict[str, str] = field(default_factory=dict)
    azure_tags: dict[str, str] = field(default_factory=dict)
    private_address: str = "10.0.0.9"
    #: This instance's own id (AWS ``instance-id``) and name (GCP ``instance/name``; on
    #: Azure ``compute/name`` is :attr:`azure_vm_name`), which the cloud sets.
    instance_id: str = "i-0123456789abcdef0"
    gcp_name: str = "cg-test-1-a1-n0"
    #: The tags / attributes answer as absent for this many more reads (the controller
    #: has not written them yet).
    hidden_reads: int = 0


class MetadataHandler(BaseHTTPRequestHandler):
    """The documented shapes of IMDSv2, GCP metadata and Azure Scheduled Events."""

    state: MetadataState

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: str, content_type: str = "text/plain") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        self.state.requests.append(f"PUT {self.path}")
        if self.path == "/latest/api/token" and self.headers.get(
            "X-aws-ec2-metadata-token-ttl-seconds"
        ):
            token = f"token-{len(self.state.tokens)}"
            self.state.tokens.add(token)
            self._send(200, token)
        else:
            self._send(400, "bad token request")

    def do_GET(self) -> None:
        s = self.state
        s.requests.append(f"GET {self.path}")
        if self.path.startswith("/latest/meta-data/"):
            if self.headers.get("X-aws-ec2-metadata-token") not in s.tokens:
                self._send(401, "")
                return
            if self.path.startswith("/latest/meta-data/tags/instance/"):
                key = self.path.removeprefix("/latest/meta-data/tags/instance/")
                value = None if self._hidden() else s.aws_tags.get(key)
                self._send(*((200, value) if value is not None else (404, "Not Found")))
            elif self.path == "/latest/meta-data/local-ipv4":
                self._send(200, s.private_address)
            elif self.path == "/latest/meta-data/instance-id":
                self._send(200, s.instance_id)
            elif self.path.endswith("spot/instance-action") and s.aws_action:
                self._send(200, json.dumps(s.aws_action), "application/json")
            elif self.path.endswith("events/recommendations/rebalance") and s.aws_rebalance:
                self._send(200, json.dumps(s.aws_rebalance), "application/json")
            else:
                self._send(404, "Not Found")
        elif self.path.startswith("/computeMetadata/v1/instance/") and (
            "/attributes/" in self.path
            or self.path.endswith(("/network-interfaces/0/ip", "/instance/name"))
        ):
            if self.headers.get("Metadata-Flavor") != "Google":
                self._send(403, "Missing Metadata-Flavor")
            elif self.path.endswith("/network-interfaces/0/ip"):
                self._send(200, s.private_address)
            elif self.path.endswith("/instance/name"):
                self._send(200, s.gcp_name)
            else:
                key = self.path.rsplit("/attributes/", 1)[1]
                value = None if self._hidden() else s.gcp_attributes.get(key)
                self._send(*((200, value) if value is not None else (404, "Not Found")))
        elif self.path.startswith(
            ("/metadata/instance/compute/tagsList", "/metadata/instance/network/interface/")
        ):
            # IMDS: the Metadata header and an api-version are required.
            if self.headers.get("Metadata") != "true" or "api-version=" not in self.path:
                self._send(400, "Bad request")
            elif self.path.startswith("/metadata/instance/network/"):
                self._send(200, s.private_address)
            else:
                tags = {} if self._hidden() else s.azure_tags
                listed = [{"name": k, "value": v} for k, v in tags.items()]
                self._send(200, json.dumps(listed), "application/json")
        elif self.path.startswith("/computeMetadata/v1/instance/preempted"):
            if self.headers.get("Metadata-Flavor") != "Google":
                self._send(403, "Missing Metadata-Flavor")
            else:
                self._send(200, "TRUE" if s.gcp_preempted else "FALSE")
        elif self.path.startswith("/computeMetadata/v1/instance/maintenance-event"):
            if self.headers.get("Metadata-Flavor") != "Google":
                self._send(403, "Missing Metadata-Flavor")
            else:
                self._send(200, s.gcp_maintenance)
        elif self.path.startswith("/metadata/instance/compute/name"):
            # IMDS: the Metadata header and an api-version are required; format=text
            # answers the bare value.
            if self.headers.get("Metadata") != "true" or "api-version=" not in self.path:
                self._send(400, "Bad request")
            else:
                self._send(200, s.azure_vm_name)
        elif self.path.startswith("/metadata/scheduledevents"):
            if self.headers.get("Metadata") != "true":
                self._send(400, "Bad request: Metadata header")
            else:
                doc = {"DocumentIncarnation": len(s.azure_events), "Events": s.azure_events}
                self._send(200, json.dumps(doc), "application/json")
        else:
            self._send(404, "Not Found")

    def _hidden(self) -> bool:
        """Whether this read of a node's tags finds them not written yet (and count it)."""
        if self.state.hidden_reads > 0:
            self.state.hidden_reads -= 1
            return True
        return False


def azure_event(
    event_id: str, resources: list[str], not_before: str = "", kind: str = "Preempt"
) -> dict[str, Any]:
    """A Scheduled Event as the service lists it, concerning the VMs ``resources``."""
    return {
        "EventId": event_id,
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        "EventStatus": "Scheduled",
        "NotBefore": not_before,
        "Description": "Spot eviction" if kind == "Preempt" else "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler], state: Any) -> Iterator[str]:
    """Serve ``handler`` (bound to ``state``) on a loopback port; its base URL."""
    with loopback(type("Handler", (handler,), {"state": state})) as url:
        yield url


@dataclass
class AckState(MetadataState):
    """:class:`MetadataState` plus the EventIds acknowledged with ``StartRequests``."""

    started: list[str] = field(default_factory=list)
    #: Called with the acknowledged EventIds while the POST is handled (tests record
    #: what was true at that moment, e.g. which checkpoints were committed).
    on_start: Callable[[list[str]], None] | None = None


class AckingMetadataHandler(MetadataHandler):
    """The metadata server plus Scheduled Events' documented POST: ``{"StartRequests":
    [{"EventId": ...}]}`` with ``Metadata: true`` starts those events (EventStatus
    ``Started``); an unknown EventId or a malformed body is a 400."""

    state: AckState

    def do_POST(self) -> None:
        s = self.state
        s.requests.append(f"POST {self.path}")
        if not self.path.startswith("/metadata/scheduledevents"):
            self._send(404, "Not Found")
            return
        if self.headers.get("Metadata") != "true":
            self._send(400, "Bad request: Metadata header")
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            doc = json.loads(self.rfile.read(length))
            ids = [str(item["EventId"]) for item in doc["StartRequests"]]
        except (ValueError, KeyError, TypeError):
            self._send(400, "Bad request: StartRequests")
            return
        known = {str(event.get("EventId")) for event in s.azure_events}
        if not ids or not set(ids) <= known:
            self._send(400, "Bad request: unknown EventId")
            return
        if s.on_start is not None:
            s.on_start(ids)
        for event in s.azure_events:
            if str(event.get("EventId")) in ids:
                event["EventStatus"] = "Started"
        s.started.extend(ids)
        self._send(200, "")
