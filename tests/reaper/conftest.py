"""Local HTTP servers that speak the GCP and Azure REST shapes the reaper uses.

Neither cloud has an emulator for compute or monitoring, so these fixtures answer the
documented paths with the documented JSON, and the real SDK clients are pointed at them:

* GCP: ``instances.aggregatedList``/``list``/``stop``/``delete``/``setLabels``,
  ``zoneOperations.get`` and Cloud Monitoring ``projects.timeSeries.list``.
* Azure: ``virtualMachines.listAll`` (``statusOnly``), ``deallocate``, ``powerOff`` (recorded
  so a test can prove it is never used), ``delete``, ``update`` (recorded so a test can
  prove tags are never written through it), the Tags API at a VM's scope (``Merge``,
  ``Replace``, ``Delete``), long-running operation polling, and Azure Monitor ``metrics`` at
  subscription scope, honouring ``$filter`` on ``Microsoft.ResourceId`` and ``top``
  (busiest series first, 10 by default).

One server per session, state reset per test, loopback only.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

GCP_PROJECT = "lab-project"
AZURE_SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"
#: GCP writes instance timestamps in US Pacific time; the adapter must not care.
PACIFIC = timezone(timedelta(hours=-8))


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, str]


Reply = tuple[int, Any, dict[str, str]]
Route = Callable[[Request, re.Match[str]], Reply]


class LocalServer:
    """A threaded HTTP server dispatching (method, path regex) to routes; records requests."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                parsed = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                request = Request(
                    self.command, parsed.path, parse_qs(parsed.query), body, dict(self.headers)
                )
                server.requests.append(request)
                status, payload, headers = server.dispatch(request)
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value.format(base=server.url))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def routes(self) -> list[tuple[str, str, Route]]:
        """(method, path regex, handler) triples; subclasses list theirs."""
        raise NotImplementedError

    def dispatch(self, request: Request) -> Reply:
        for method, pattern, route in self.routes():
            match = re.fullmatch(pattern, request.path)
            if method == request.method and match:
                return route(request, match)
        return 404, {"error": {"code": 404, "message": f"no route {request.path}"}}, {}

    def calls(self, method: str, fragment: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and fragment in r.path]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --------------------------------------------------------------------------- GCP


@dataclass
class GcpVm:
    name: str
    zone: str
    machine_type: str
    instance_id: str
    accelerator: str | None = None
    accelerator_count: int = 0
    status: str = "RUNNING"
    started: datetime = field(default_factory=lambda: datetime.now(UTC) - timedelta(hours=3))
    labels: dict[str, str] = field(default_factory=dict)
    deletion_protection: bool = False
    spot: bool = False
    fingerprint: int = 1

    def resource(self, project: str) -> dict[str, Any]:
        base = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{self.zone}"
        body: dict[str, Any] = {
            "kind": "compute#instance",
            "id": self.instance_id,
            "name": self.name,
            "zone": base,
            "machineType": f"{base}/machineTypes/{self.machine_type}",
            "status": self.status,
            "creationTimestamp": self.started.astimezone(PACIFIC).isoformat(
                timespec="milliseconds"
            ),
            "lastStartTimestamp": self.started.astimezone(PACIFIC).isoformat(
                timespec="milliseconds"
            ),
            "labels": self.labels,
            "labelFingerprint": f"fp{self.fingerprint}=",
            "deletionProtection": self.deletion_protection,
            "scheduling": {
                "provisioningModel": "SPOT" if self.spot else "STANDARD",
                "preemptible": False,
            },
            "selfLink": f"{base}/instances/{self.name}",
        }
        if self.accelerator:
            body["guestAccelerators"] = [
                {
                    "acceleratorType": f"{base}/acceleratorTypes/{self.accelerator}",
                    "acceleratorCount": self.accelerator_count,
                }
            ]
        return body


class GcpServer(LocalServer):
    """Compute Engine + Cloud Monitoring for one project."""

    def reset(self) -> None:
        self.vms: dict[str, GcpVm] = {}
        # metric type -> instance id -> [(time, value)]
        self.series: dict[str, dict[str, list[tuple[datetime, float]]]] = {}
        #: Time series per page (None: one page); ``stuck_token`` is handed out forever.
        self.page_size: int | None = None
        self.stuck_token: str | None = None
        self.requests.clear()

    def add(self, vm: GcpVm) -> GcpVm:
        self.vms[vm.name] = vm
        return vm

    def put(self, metric: str, instance_id: str, points: list[tuple[datetime, float]]) -> None:
        self.series.setdefault(metric, {}).setdefault(instance_id, []).extend(points)

    def _operation(self, kind: str, zone: str, name: str) -> dict[str, Any]:
        return {
            "kind": "compute#operation",
            "id": "4242",
            "name": f"operation-{kind}-{name}",
            "zone": f"https://www.googleapis.com/compute/v1/projects/{GCP_PROJECT}/zones/{zone}",
            "operationType": kind,
            "status": "DONE",
            "progress": 100,
            "targetLink": f"projects/{GCP_PROJECT}/zones/{zone}/instances/{name}",
        }

    def aggregated(self, request: Request, match: re.Match[str]) -> Reply:
        items: dict[str, Any] = {}
        for vm in self.vms.values():
            items.setdefault(f"zones/{vm.zone}", {"instances": []})["instances"].append(
                vm.resource(match["project"])
            )
        return 200, {"kind": "compute#instanceAggregatedList", "items": items}, {}

    def listed(self, request: Request, match: re.Match[str]) -> Reply:
        vms = [v.resource(match["project"]) for v in self.vms.values() if v.zone == match["zone"]]
        return 200, {"kind": "compute#instanceList", "items": vms}, {}

    def stop_vm(self, request: Request, match: re.Match[str]) -> Reply:
        vm = self.vms[match["name"]]
        vm.status = "TERMINATED"  # what GCP calls a stopped VM
        return 200, self._operation("stop", vm.zone, vm.name), {}

    def delete_vm(self, request: Request, match: re.Match[str]) -> Reply:
        vm = self.vms.pop(match["name"])
        return 200, self._operation("delete", vm.zone, vm.name), {}

    def set_labels(self, request: Request, match: re.Match[str]) -> Reply:
        vm = self.vms[match["name"]]
        if request.body.get("labelFingerprint") != f"fp{vm.fingerprint}=":
            return 412, {"error": {"code": 412, "message": "fingerprint mismatch"}}, {}
        vm.labels = dict(request.body.get("labels") or {})
        vm.fingerprint += 1
        return 200, self._operation("setLabels", vm.zone, vm.name), {}

    def operation(self, request: Request, match: re.Match[str]) -> Reply:
        return 200, self._operation("stop", match["zone"], "x"), {}

    def time_series(self, request: Request, match: re.Match[str]) -> Reply:
        metric = re.search(r'metric\.type = "([^"]+)"', request.query["filter"][0])
        assert metric, request.query
        start = datetime.fromisoformat(request.query["interval.startTime"][0])
        end = datetime.fromisoformat(request.query["interval.endTime"][0])
        out = []
        for instance_id, points in self.series.get(metric[1], {}).items():
            inside = [(t, v) for t, v in points if start <= t <= end]
            if not inside:
                continue
            kind = "int64Value" if "bytes" in metric[1] else "doubleValue"
            out.append(
                {
                    "metric": {"type": metric[1], "labels": {}},
                    "resource": {
                        "type": "gce_instance",
                        "labels": {"project_id": match["project"], "instance_id": instance_id},
                    },
                    "metricKind": "GAUGE",
                    "valueType": "DOUBLE",
                    # Cloud Monitoring returns the newest point first.
                    "points": [
                        {
                            "interval": {"startTime": rfc3339(t), "endTime": rfc3339(t)},
                            "value": {kind: str(int(v)) if kind == "int64Value" else v},
                        }
                        for t, v in sorted(inside, reverse=True)
                    ],
                }
            )
        if self.stuck_token is not None:
            return 200, {"timeSeries": out[:1], "nextPageToken": self.stuck_token}, {}
        if self.page_size is None:
            return 200, {"timeSeries": out, "unit": ""}, {}
        first = int(request.query.get("pageToken", ["0"])[0])
        body: dict[str, Any] = {"timeSeries": out[first : first + self.page_size], "unit": ""}
        if first + self.page_size < len(out):
            body["nextPageToken"] = str(first + self.page_size)
        return 200, body, {}

    def routes(self) -> list[tuple[str, str, Route]]:
        project = r"/compute/v1/projects/(?P<project>[^/]+)"
        zone = project + r"/zones/(?P<zone>[^/]+)"
        instance = zone + r"/instances/(?P<name>[^/]+)"
        return [
            ("GET", project + "/aggregated/instances", self.aggregated),
            ("GET", zone + "/instances", self.listed),
            ("POST", instance + "/stop", self.stop_vm),
            ("POST", instance + "/setLabels", self.set_labels),
            ("DELETE", instance, self.delete_vm),
            ("GET", zone + "/operations/[^/]+", self.operation),
            ("GET", r"/v3/projects/(?P<project>[^/]+)/timeSeries", self.time_series),
        ]


# --------------------------------------------------------------------------- Azure


@dataclass
class AzureVm:
    name: str
    size: str
    location: str = "eastus"
    group: str = "ml"
    power: str = "running"
    created: datetime = field(default_factory=lambda: datetime.now(UTC) - timedelta(hours=3))
    tags: dict[str, str] = field(default_factory=dict)
    spot: bool = False
    #: When it was last started (the instance view's state times); None: never restarted.
    started: datetime | None = None

    @property
    def resource_id(self) -> str:
        return (
            f"/subscriptions/{AZURE_SUBSCRIPTION}/resourceGroups/{self.group}"
            f"/providers/Microsoft.Compute/virtualMachines/{self.name}"
        )

    def resource(self) -> dict[str, Any]:
        return {
            "id": self.resource_id,
            "name": self.name,
            "type": "Microsoft.Compute/virtualMachines",
            "location": self.location,
            "tags": self.tags,
            "properties": {
                "hardwareProfile": {"vmSize": self.size},
                "provisioningState": "Succeeded",
                "timeCreated": rfc3339(self.created),
                "priority": "Spot" if self.spot else "Regular",
                "instanceView": {
                    "statuses": [
                        {
                            "code": "ProvisioningState/succeeded",
                            "level": "Info",
                            "time": rfc3339(self.started or self.created),
                        },
                        {"code": f"PowerState/{self.power}", "level": "Info"},
                    ]
                },
            },
        }


class AzureServer(LocalServer):
    """Azure Resource Manager (compute) + Azure Monitor metrics for one subscription."""

    def reset(self) -> None:
        self.me = ""  # the VM whose metadata /metadata/instance/compute serves
        self.vms: dict[str, AzureVm] = {}
        # (namespace, metric) -> lower-cased resource id -> [(time, value)]
        self.series: dict[tuple[str, str], dict[str, list[tuple[datetime, float]]]] = {}
        self.requests.clear()

    def add(self, vm: AzureVm) -> AzureVm:
        self.vms[vm.name] = vm
        return vm

    def put(
        self, namespace: str, metric: str, vm: AzureVm, points: list[tuple[datetime, float]]
    ) -> None:
        self.series.setdefault((namespace.lower(), metric), {}).setdefault(
            vm.resource_id.lower(), []
        ).extend(points)

    def list_all(self, request: Request, match: re.Match[str]) -> Reply:
        assert request.query.get("statusOnly") == ["true"], request.query
        return 200, {"value": [vm.resource() for vm in self.vms.values()]}, {}

    def _accepted(self) -> Reply:
        return 202, None, {"Location": "{base}/operations/done", "Retry-After": "0"}

    def deallocate(self, request: Request, match: re.Match[str]) -> Reply:
        self.vms[match["name"]].power = "deallocated"
        return self._accepted()

    def power_off(self, request: Request, match: re.Match[str]) -> Reply:
        self.vms[match["name"]].power = "stopped"
        return self._accepted()

    def delete(self, request: Request, match: re.Match[str]) -> Reply:
        del self.vms[match["name"]]
        return self._accepted()

    def update(self, request: Request, match: re.Match[str]) -> Reply:
        vm = self.vms[match["name"]]
        vm.tags = dict(request.body.get("tags") or {})
        return 200, vm.resource(), {}

    def tags(self, request: Request, match: re.Match[str]) -> Reply:
        """``Tags - Update At Scope``: Merge, Replace or Delete some tags of one resource."""
        assert request.query.get("api-version"), request.query
        vm = self.vms[match["name"]]
        operation = request.body["operation"]
        given: dict[str, str] = request.body["properties"]["tags"]
        if operation == "Merge":
            kept = {k: v for k, v in vm.tags.items() if k.lower() not in {g.lower() for g in given}}
            vm.tags = {**kept, **given}
        elif operation == "Replace":
            vm.tags = dict(given)
        elif operation == "Delete":
            wanted = {k.lower(): v for k, v in given.items()}
            vm.tags = {
                k: v
                for k, v in vm.tags.items()
                if k.lower() not in wanted or wanted[k.lower()] not in ("", v)
            }
        else:
            return 400, {"error": {"code": "InvalidOperation", "message": operation}}, {}
        body = {"id": f"{vm.resource_id}/providers/Microsoft.Resources/tags/default",
                "name": "default", "properties": {"tags": vm.tags}}  # fmt: skip
        return 200, body, {}

    def operation(self, request: Request, match: re.Match[str]) -> Reply:
        return 200, None, {}

    def instance_metadata(self, request: Request, match: re.Match[str]) -> Reply:
        """The Azure instance metadata service, as seen from inside ``self.me``."""
        if request.query.get("api-version") is None or request.headers.get("Metadata") != "true":
            return 400, {"error": "bad request"}, {}
        vm = self.vms[self.me]
        body = {
            "subscriptionId": AZURE_SUBSCRIPTION,
            "resourceGroupName": vm.group,
            "name": vm.name,
        }
        return 200, body, {}

    def metrics(self, request: Request, match: re.Match[str]) -> Reply:
        query = {k: v[0] for k, v in request.query.items()}
        wanted = _resource_filter(query["$filter"])
        top = int(query.get("top", 10))
        namespace = query["metricnamespace"].lower()
        names = query["metricnames"].split(",")
        if not any(ns == namespace for ns, _ in self.series):
            message = f"Failed to find metric configuration for provider: {namespace}"
            return 400, {"error": {"code": "BadRequest", "message": message}}, {}
        start_text, end_text = query["timespan"].split("/")
        start, end = datetime.fromisoformat(start_text), datetime.fromisoformat(end_text)
        region = query["region"]
        in_region = {vm.resource_id.lower() for vm in self.vms.values() if vm.location == region}
        value = []
        for name in names:
            timeseries: list[dict[str, Any]] = []
            for resource_id, points in self.series.get((namespace, name), {}).items():
                if resource_id not in in_region or (
                    wanted is not None and resource_id not in wanted
                ):
                    continue
                data = [
                    {"timeStamp": rfc3339(t), "maximum": v, "total": v}
                    for t, v in sorted(points)
                    if start <= t <= end
                ]
                timeseries.append(
                    {
                        "metadatavalues": [
                            {
                                "name": {
                                    "value": "Microsoft.ResourceId",
                                    "localizedValue": "Microsoft.ResourceId",
                                },
                                "value": resource_id,
                            }
                        ],
                        "data": data,
                    }
                )
            # Like Azure Monitor: the ``top`` busiest series, the rest are left out.
            timeseries.sort(key=lambda ts: -max((d["maximum"] for d in ts["data"]), default=0))
            value.append(
                {
                    "id": f"/subscriptions/{AZURE_SUBSCRIPTION}/metrics/{name}",
                    "type": "Microsoft.Insights/metrics",
                    "name": {"value": name, "localizedValue": name},
                    "unit": "Unspecified",
                    "timeseries": timeseries[:top],
                    "errorCode": "Success",
                }
            )
        body = {
            "cost": 0,
            "timespan": query["timespan"],
            "interval": query.get("interval", "PT1M"),
            "value": value,
            "namespace": query["metricnamespace"],
            "resourceregion": region,
        }
        return 200, body, {}

    def routes(self) -> list[tuple[str, str, Route]]:
        subscription = r"/subscriptions/[^/]+"
        vm = (
            subscription
            + r"/resourceGroups/[^/]+/providers/Microsoft.Compute/virtualMachines/(?P<name>[^/]+)"
        )
        return [
            ("GET", subscription + "/providers/Microsoft.Compute/virtualMachines", self.list_all),
            ("POST", vm + "/deallocate", self.deallocate),
            ("POST", vm + "/powerOff", self.power_off),
            ("DELETE", vm, self.delete),
            ("PATCH", vm, self.update),
            ("PATCH", vm + "/providers/Microsoft.Resources/tags/default", self.tags),
            ("GET", "/operations/done", self.operation),
            ("GET", subscription + "/providers/Microsoft.Insights/metrics", self.metrics),
            ("GET", "/metadata/instance/compute", self.instance_metadata),
        ]


def _resource_filter(text: str) -> set[str] | None:
    """The resource IDs a metrics ``$filter`` asks for; ``None`` for all (``eq '*'``)."""
    terms = re.split(r"\s+or\s+", text.strip(), flags=re.IGNORECASE)
    ids = set()
    for term in terms:
        found = re.fullmatch(r"Microsoft\.ResourceId eq '([^']+)'", term.strip(), re.IGNORECASE)
        assert found, f"unsupported $filter {text!r}"
        ids.add(found[1].lower())
    return None if "*" in ids else ids


@pytest.fixture(scope="session")
def _gcp_server() -> Iterator[GcpServer]:
    server = GcpServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def gcp_server(_gcp_server: GcpServer) -> GcpServer:
    _gcp_server.reset()
    return _gcp_server


@pytest.fixture(scope="session")
def _azure_server() -> Iterator[AzureServer]:
    server = AzureServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def azure_server(_azure_server: AzureServer) -> AzureServer:
    _azure_server.reset()
    return _azure_server


class FakeTokenCredential:
    """Stands in for ``DefaultAzureCredential``: the no-op policy never asks it for a token."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken("test-token", int(datetime.now(UTC).timestamp()) + 3600)


def azure_client_options() -> dict[str, Any]:
    """Azure refuses bearer tokens over plain http; tests swap the auth policy for a no-op."""
    from azure.core.pipeline.policies import SansIOHTTPPolicy

    return {"authentication_policy": SansIOHTTPPolicy(), "polling_interval": 0}
