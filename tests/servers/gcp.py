"""Strict fakes of the Google Cloud REST APIs costguard calls: Compute Engine (the spot
launcher's and the reaper's calls), Cloud Monitoring ``timeSeries.list``, Billing Budgets v1
with Monitoring's notification channels, and Resource Manager ``projects.get``.

Each fake answers the documented paths with the documented JSON, and *refuses* what the real
service refuses, in the shape the service sends (an immediate HTTP error with Google's error
body, or a finished operation carrying ``error.errors[]``). The rules, and the definitions
they come from (proto file, repository, commit), are test data:
``tests/servers/definitions/gcp.json``; ``tests/README.md`` has the table.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tests.servers.http import LocalServer, Reply, Request, Route, every_minute, rfc3339

GCP_PROJECT = "lab-project"
PROJECT = GCP_PROJECT
#: The project number Resource Manager knows ``lab-project`` by.
PROJECT_NUMBER = "415104041262"

#: What a launch into the Compute fake needs (the spot and contract suites).
LAUNCH_OPTIONS = {
    "project": PROJECT,
    "image": "projects/deeplearning-platform-release/global/images/family/common-cu124",
    "service_account": "costguard-instance@lab-project.iam.gserviceaccount.com",
}
COMPUTE = "https://www.googleapis.com/compute/v1"
#: GCP writes instance timestamps in US Pacific time; the adapter must not care.
PACIFIC = timezone(timedelta(hours=-8))
#: The rules the fakes enforce, with their sources.
RULES: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "definitions" / "gcp.json").read_text()
)["rules"]
_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
}
#: The label that names a GPU in the Ops Agent's GPU series (its source: the rule's).
GPU_LABEL = RULES["metric_kinds"]["labels"]["agent.googleapis.com/gpu/utilization"]["gpu_label"]


def google_error(code: int, message: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    """Google's JSON error body (``{"error": {"code", "message", "status"}}``)."""
    return code, {
        "error": {"code": code, "message": message, "status": _STATUS.get(code, "UNKNOWN"), **extra}
    }


def check_instance(body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """An ``instances.insert`` body's name and labels, the instance's and its disks'
    (rules instance_name, labels)."""
    if not re.fullmatch(RULES["instance_name"]["pattern"], body.get("name", "")):
        return rule_error("instance_name")
    rule = RULES["labels"]
    maps = [body.get("labels", {})]
    maps += [d.get("initializeParams", {}).get("labels", {}) for d in body.get("disks", [])]
    for labels in maps:
        if len(labels) > rule["max_labels"] or not all(
            re.fullmatch(rule["key_pattern"], k) and re.fullmatch(rule["value_pattern"], v)
            for k, v in labels.items()
        ):
            return rule_error("labels")
    return None


def rule_error(rule: str) -> tuple[int, dict[str, Any]]:
    """The error reply a rule of ``definitions/gcp.json`` describes."""
    spec = RULES[rule]
    return google_error(spec["status"], spec["message"])


@dataclass
class ComputeVm:
    body: dict[str, Any]
    zone: str
    id: str
    status: str = "PROVISIONING"
    #: Its interface's private address (``networkInterfaces[0].networkIP``).
    address: str = ""
    #: The metadata's fingerprint (rule set_metadata_fingerprint).
    fingerprint: str = "fp-0"


#: The system events that take a VM away, as ``zoneOperations.list`` shows them.
SYSTEM_EVENTS = {
    "compute.instances.preempted": "Instance was preempted.",
    "compute.instances.terminateOnHostMaintenance": "Instance terminated during host maintenance.",
    "compute.instances.hostError": "Instance was stopped due to a host error.",
}
_OPERATION_TYPE = re.compile(r'\(?operationType = "([^"]+)"\)?')


def operation_types(text: str) -> set[str]:
    """The operation types of a ``zoneOperations.list`` filter: one ``operationType = "X"``
    or several in parentheses joined by ``OR`` (anything else is refused)."""
    terms = text.split(" OR ")
    found = [_OPERATION_TYPE.fullmatch(term.strip()) for term in terms]
    assert all(found), text
    assert len(terms) == 1 or all(t.strip().startswith("(") for t in terms), text
    return {m[1] for m in found if m}


_NAME_TERM = re.compile(r'\(name = "([a-z][-a-z0-9]*)"\)')


def names(text: str) -> set[str]:
    """The names of a list filter that is a disjunction of name equalities, each in
    parentheses: ``(name = "a") OR (name = "b")`` (the documented form of several
    expressions, joined by an explicit ``OR``; anything else is refused)."""
    terms = text.split(" OR ")
    found = [_NAME_TERM.fullmatch(term) for term in terms]
    assert all(found), text
    return {m[1] for m in found if m}


class ComputeServer(LocalServer):
    """Compute Engine for one project as the spot launcher uses it: VMs, their operations,
    system events (preemption, host maintenance, host error), regions and the machine and
    accelerator types per zone; a repeated ``requestId`` is answered with the first
    request's operation, a quota refusal comes as an immediate HTTP 403, and an insert
    naming a type the zone does not have as an immediate HTTP 400 ``invalid``."""

    def reset(self) -> None:
        self.vms: dict[str, ComputeVm] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.full_zones: set[str] = set()
        #: region -> (status, zones) as ``regions.get`` returns them.
        self.regions: dict[str, tuple[str, list[str]]] = {
            "us-central1": ("UP", ["us-central1-c", "us-central1-a", "us-central1-f",
                                   "us-central1-b"]),
        }  # fmt: skip
        self.ids = itertools.count(7000)
        #: requestId -> the name of the operation it started (rule request_id_deduplicates).
        self.request_ids: dict[str, str] = {}
        #: When set, every insert is refused at once with HTTP 403, as a quota check does
        #: (rule quota_exceeded_is_immediate_403).
        self.quota_exceeded = False
        #: The next this many inserts and bulk inserts are refused at once for the
        #: project's request rate, creating nothing: HTTP 403, reason
        #: ``rateLimitExceeded``, as Compute Engine's rate quotas answer ("you receive a 403
        #: error with the reason rateLimitExceeded"), or with ``rate_limit_status`` 429 as
        #: Google's APIs answer a rate limit in general (``RESOURCE_EXHAUSTED``); counted
        #: in ``rate_limited``.
        self.rate_limit_inserts = 0
        self.rate_limit_status = 403
        self.rate_limited = 0
        #: The next this many instance deletes are refused at once (HTTP 400, reason
        #: ``resourceNotReady``: the VM is in the middle of another operation).
        self.refuse_deletes = 0
        #: (zone, machine or accelerator type name) the zone does not offer (rule
        #: zone_without_the_type); every other pair is offered.
        self.lacking: set[tuple[str, str]] = set()
        #: zone -> how many more VMs it has room for (absent: as many as asked); a bulk
        #: insert whose minCount does not fit makes none (rule bulk_insert_min_count).
        self.room: dict[str, int] = {}
        #: A fault, not the documented service: the next bulk insert makes one VM fewer
        #: than its minCount and reports success (the launcher must not trust it).
        self.broken_min_count = False
        #: Firewall rules by name (global), resource policies by (region, name), and the
        #: private addresses handed out.
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.policies: dict[tuple[str, str], dict[str, Any]] = {}
        self.addresses = itertools.count(2)
        self.requests.clear()

    def _operation(self, kind: str, zone: str, vm: ComputeVm, **extra: Any) -> dict[str, Any]:
        number = next(self.ids)
        name = f"operation-{number}-{kind}"
        operation = {
            "kind": "compute#operation",
            "id": str(number),
            "name": name,
            "zone": f"{COMPUTE}/projects/{PROJECT}/zones/{zone}",
            "operationType": kind,
            "targetLink": f"{COMPUTE}/projects/{PROJECT}/zones/{zone}/instances/{vm.body['name']}",
            "targetId": vm.id,
            "status": "RUNNING",
            "progress": 0,
            "selfLink": f"{COMPUTE}/projects/{PROJECT}/zones/{zone}/operations/{name}",
            **extra,
        }
        self.operations[name] = operation
        return operation

    def insert(self, request: Request, match: re.Match[str]) -> Reply:
        body = request.body
        name = body["name"]
        request_id = request.query.get("requestId", [""])[0]
        if request_id in self.request_ids:  # the first request's operation; nothing created
            return 200, self.operations[self.request_ids[request_id]], {}
        limited = self._rate_limited()
        if limited is not None:
            return limited
        if self.quota_exceeded:
            refusal = RULES["quota_exceeded_is_immediate_403"]
            return refusal["status"], {"error": refusal["body"]}, {}
        refused = check_instance(body) or self._lacks(body, match["zone"])
        if refused is not None:
            return (*refused, {})
        if name in self.vms:
            error = {"code": 409, "message": f"The resource '{name}' already exists",
                     "errors": [{"reason": "alreadyExists", "message": "exists"}]}  # fmt: skip
            return 409, {"error": error}, {}
        vm = ComputeVm(body, match["zone"], str(next(self.ids)))
        if match["zone"] in self.full_zones:
            error = {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": "none"}]}
            failed = self._operation("insert", vm.zone, vm, status="DONE", progress=100,
                                     httpErrorStatusCode=503, httpErrorMessage="UNAVAILABLE",
                                     error=error)  # fmt: skip
            if request_id:
                self.request_ids[request_id] = failed["name"]
            return 200, failed, {}
        self._add(vm)
        operation = self._operation("insert", vm.zone, vm)
        if request_id:
            self.request_ids[request_id] = operation["name"]
        return 200, operation, {}

    def _rate_limited(self) -> Reply | None:
        """An insert's refusal for the request rate while ``rate_limit_inserts`` last."""
        if self.rate_limit_inserts <= 0:
            return None
        self.rate_limit_inserts -= 1
        self.rate_limited += 1
        status = self.rate_limit_status
        error: dict[str, Any] = {"code": status, "message": "Rate Limit Exceeded",
                                 "errors": [{"message": "Rate Limit Exceeded",
                                             "domain": "usageLimits",
                                             "reason": "rateLimitExceeded"}]}  # fmt: skip
        if status == 429:
            error["status"] = "RESOURCE_EXHAUSTED"
        return status, {"error": error}, {}

    def _add(self, vm: ComputeVm) -> None:
        vm.address = f"10.128.0.{next(self.addresses)}"
        self.vms[vm.body["name"]] = vm

    def bulk_insert(self, request: Request, match: re.Match[str]) -> Reply:
        """``instances.bulkInsert`` in one zone, the VMs named by ``perInstanceProperties``:
        all of them or none when ``minCount`` does not fit (rule bulk_insert_min_count), as
        many as fit between ``minCount`` and ``count`` otherwise."""
        body = request.body
        zone = match["zone"]
        request_id = request.query.get("requestId", [""])[0]
        if request_id in self.request_ids:
            return 200, self.operations[self.request_ids[request_id]], {}
        limited = self._rate_limited()
        if limited is not None:
            return limited
        if self.quota_exceeded:
            refusal = RULES["quota_exceeded_is_immediate_403"]
            return refusal["status"], {"error": refusal["body"]}, {}
        count, least = int(body["count"]), int(body.get("minCount", body["count"]))
        names = list(body.get("perInstanceProperties", {}))
        properties = body["instanceProperties"]
        if not 1 <= least <= count or len(names) != count:
            return (*google_error(400, "Invalid value for field 'resource.minCount'"), {})
        for name in names:
            refused = check_instance({"name": name, "labels": properties.get("labels", {}),
                                      "disks": properties.get("disks", [])})  # fmt: skip
            if refused is not None:
                return (*refused, {})
        region = zone.rsplit("-", 1)[0]
        for policy in properties.get("resourcePolicies", []):
            if (region, policy) not in self.policies:
                message = f"The resource policy '{policy}' was not found in region {region}."
                return (*google_error(400, message), {})
        taken = [n for n in names if n in self.vms]
        if taken:
            error = {"code": 409, "message": f"The resource '{taken[0]}' already exists",
                     "errors": [{"reason": "alreadyExists", "message": "exists"}]}  # fmt: skip
            return 409, {"error": error}, {}
        fits = count if zone not in self.room else min(count, self.room[zone])
        if zone in self.full_zones:
            fits = 0
        if self.broken_min_count:
            self.broken_min_count = False
            fits = least - 1
        elif fits < least:
            fits = 0
        first = None
        for name in names[:fits]:
            vm = ComputeVm(self._body(properties, name, zone), zone, str(next(self.ids)))
            self._add(vm)
            first = first or vm
        if zone in self.room:
            self.room[zone] -= fits
        anchor = first or ComputeVm({"name": names[0]}, zone, "0")
        extra: dict[str, Any] = {"operationType": "bulkInsert"}
        if fits == 0:
            error = {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": "none"}]}
            extra.update(status="DONE", progress=100, httpErrorStatusCode=503,
                         httpErrorMessage="UNAVAILABLE", error=error)  # fmt: skip
        operation = self._operation("bulkInsert", zone, anchor, **extra)
        if request_id:
            self.request_ids[request_id] = operation["name"]
        return 200, operation, {}

    @staticmethod
    def _body(properties: dict[str, Any], name: str, zone: str) -> dict[str, Any]:
        """An instance's body from a bulk insert's ``instanceProperties`` (types by name)."""
        base = f"zones/{zone}"
        body = {**properties, "name": name,
                "machineType": f"{base}/machineTypes/{properties['machineType']}"}  # fmt: skip
        body["guestAccelerators"] = [
            {**a, "acceleratorType": f"{base}/acceleratorTypes/{a['acceleratorType']}"}
            for a in properties.get("guestAccelerators", [])
        ]
        return body

    def set_metadata(self, request: Request, match: re.Match[str]) -> Reply:
        """``instances.setMetadata``: the whole metadata replaced, with the current
        fingerprint only (rule set_metadata_fingerprint)."""
        reply = self.get(request, match)
        if reply[0] != 200:
            return reply
        vm = self.vms[match["name"]]
        if request.body.get("fingerprint") != vm.fingerprint:
            rule = RULES["set_metadata_fingerprint"]
            return (*google_error(rule["status"], rule["message"]), {})
        vm.body["metadata"] = {"items": request.body.get("items", [])}
        vm.fingerprint = f"fp-{next(self.ids)}"
        return 200, self._operation("setMetadata", vm.zone, vm), {}

    def insert_firewall(self, request: Request, match: re.Match[str]) -> Reply:
        body = request.body
        name = body.get("name", "")
        if not re.fullmatch(RULES["instance_name"]["pattern"], name):
            return (*google_error(400, "Invalid value for field 'resource.name'"), {})
        if name in self.firewalls:
            error = {"code": 409, "message": f"The resource '{name}' already exists",
                     "errors": [{"reason": "alreadyExists", "message": "exists"}]}  # fmt: skip
            return 409, {"error": error}, {}
        self.firewalls[name] = {**body, "kind": "compute#firewall", "id": str(next(self.ids))}
        return 200, self._global_operation("insert", name), {}

    def firewall(self, request: Request, match: re.Match[str]) -> Reply:
        found = self.firewalls.get(match["name"])
        if found is None:
            error = {"code": 404, "message": f"The resource '{match['name']}' was not found",
                     "errors": [{"reason": "notFound", "message": "not found"}]}  # fmt: skip
            return 404, {"error": error}, {}
        if request.method == "DELETE":
            del self.firewalls[match["name"]]
            return 200, self._global_operation("delete", match["name"]), {}
        return 200, found, {}

    def _global_operation(self, kind: str, firewall: str, where: str = "global") -> dict[str, Any]:
        """An operation on a global (a firewall rule's) or regional (``where``:
        ``regions/R``, a resource policy's) resource, DONE at the first poll."""
        number = next(self.ids)
        name = f"operation-{number}-{kind}"
        target = "firewalls" if where == "global" else "resourcePolicies"
        operation = {
            "kind": "compute#operation", "id": str(number), "name": name,
            "operationType": kind, "status": "RUNNING", "progress": 0,
            "targetLink": f"{COMPUTE}/projects/{PROJECT}/{where}/{target}/{firewall}",
            "selfLink": f"{COMPUTE}/projects/{PROJECT}/{where}/operations/{name}",
        }  # fmt: skip
        self.operations[name] = operation
        return operation

    def policy(self, request: Request, match: re.Match[str]) -> Reply:
        """``resourcePolicies``: insert, get, delete (regional), and the aggregated list by
        ``name = "X"``."""
        region = match.groupdict().get("region")
        if region is None:
            wanted = re.fullmatch(r'name = "([^"]+)"', request.query.get("filter", [""])[0])
            assert wanted, request.query
            items: dict[str, Any] = {}
            for (where, name), body in self.policies.items():
                if name == wanted[1]:
                    items.setdefault(f"regions/{where}", {"resourcePolicies": []})
                    items[f"regions/{where}"]["resourcePolicies"].append(body)
            return 200, {"kind": "compute#resourcePolicyAggregatedList", "items": items}, {}
        if request.method == "POST":
            name = request.body.get("name", "")
            if (region, name) in self.policies:
                error = {"code": 409, "message": f"The resource '{name}' already exists",
                         "errors": [{"reason": "alreadyExists", "message": "exists"}]}  # fmt: skip
                return 409, {"error": error}, {}
            self.policies[(region, name)] = {**request.body, "region": region, "status": "READY"}
            return 200, self._global_operation("insert", name, f"regions/{region}"), {}
        key = (region, match["name"])
        if key not in self.policies:
            error = {"code": 404, "message": f"The resource '{key[1]}' was not found",
                     "errors": [{"reason": "notFound", "message": "not found"}]}  # fmt: skip
            return 404, {"error": error}, {}
        if request.method == "DELETE":
            del self.policies[key]
            return 200, self._global_operation("delete", key[1], f"regions/{region}"), {}
        return 200, self.policies[key], {}

    def get_global_operation(self, request: Request, match: re.Match[str]) -> Reply:
        operation = self.operations[match["operation"]]
        operation.update(status="DONE", progress=100)
        return 200, operation, {}

    def _lacks(self, body: dict[str, Any], zone: str) -> tuple[int, dict[str, Any]] | None:
        """The 400 ``invalid`` of an insert whose machine or accelerator type the zone does
        not have (rule zone_without_the_type)."""
        wanted = [("resource.machineType", "Machine type", body.get("machineType", ""))]
        wanted += [
            (f"resource.guestAccelerators[{n}].acceleratorType", "Accelerator type",
             a.get("acceleratorType", ""))
            for n, a in enumerate(body.get("guestAccelerators", []))
        ]  # fmt: skip
        for field_name, what, url in wanted:
            type_name = url.rsplit("/", 1)[-1]
            if (zone, type_name) in self.lacking:
                message = (
                    f"Invalid value for field '{field_name}': '{url}'. {what} with name "
                    f"'{type_name}' does not exist in zone '{zone}'."
                )
                error = {"message": message, "domain": "global", "reason": "invalid"}
                return google_error(400, message, errors=[error])
        return None

    def types(self, request: Request, match: re.Match[str]) -> Reply:
        """``machineTypes.aggregatedList`` filtered by ``name = "X"``: the zones that offer X
        list it, the others carry a warning."""
        kind = match["kind"]
        wanted = re.fullmatch(r'name = "([^"]+)"', request.query.get("filter", [""])[0])
        if wanted is None:
            return (*google_error(400, "Invalid value for field 'filter'"), {})
        items: dict[str, Any] = {}
        for _status, zones in self.regions.values():
            for zone in zones:
                if (zone, wanted[1]) in self.lacking:
                    items[f"zones/{zone}"] = {"warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": f"There are no results for scope 'zones/{zone}' on this page.",
                    }}  # fmt: skip
                    continue
                base = f"{COMPUTE}/projects/{PROJECT}/zones/{zone}"
                items[f"zones/{zone}"] = {kind: [{
                    "kind": f"compute#{kind[:-1]}", "name": wanted[1], "zone": zone,
                    "selfLink": f"{base}/{kind}/{wanted[1]}",
                }]}  # fmt: skip
        return 200, {"kind": f"compute#{kind[:-1]}AggregatedList", "items": items}, {}

    def get_operation(self, request: Request, match: re.Match[str]) -> Reply:
        operation = self.operations[match["operation"]]
        if operation["status"] != "DONE":
            operation.update(status="DONE", progress=100)
            vm = self.vms.get(operation["targetLink"].rsplit("/", 1)[-1])
            if vm is not None and operation["operationType"] == "insert":
                vm.status = "RUNNING"
        return 200, operation, {}

    def list_operations(self, request: Request, match: re.Match[str]) -> Reply:
        wanted = operation_types(request.query["filter"][0])
        items = [o for o in self.operations.values() if o["operationType"] in wanted
                 and o["zone"].endswith(f"/zones/{match['zone']}")]  # fmt: skip
        return 200, {"kind": "compute#operationList", "items": items}, {}

    def resource(self, vm: ComputeVm) -> dict[str, Any]:
        """The VM as ``instances.get`` shows it: an attached disk carries its type and size
        (``initializeParams`` is only what the insert asked for)."""
        disks = [
            {"type": "PERSISTENT", **disk,
             "diskSizeGb": str(disk.get("initializeParams", {}).get("diskSizeGb", "10"))}
            for disk in vm.body.get("disks", [])
        ]  # fmt: skip
        interfaces = [dict(i) for i in vm.body.get("networkInterfaces", [{}])]
        interfaces[0]["networkIP"] = vm.address
        return {
            **vm.body,
            "disks": disks,
            "networkInterfaces": interfaces,
            "metadata": {**vm.body.get("metadata", {}), "fingerprint": vm.fingerprint},
            "kind": "compute#instance",
            "id": vm.id,
            "status": vm.status,
            "zone": f"{COMPUTE}/projects/{PROJECT}/zones/{vm.zone}",
            "creationTimestamp": "2026-11-30T19:00:00.000-08:00",
            "selfLink": f"{COMPUTE}/projects/{PROJECT}/zones/{vm.zone}/instances/{vm.body['name']}",
        }

    def get(self, request: Request, match: re.Match[str]) -> Reply:
        vm = self.vms.get(match["name"])
        if vm is None or vm.zone != match["zone"]:
            error = {"code": 404, "message": f"The resource '{match['name']}' was not found",
                     "errors": [{"reason": "notFound", "message": "not found"}]}  # fmt: skip
            return 404, {"error": error}, {}
        return 200, self.resource(vm), {}

    def delete(self, request: Request, match: re.Match[str]) -> Reply:
        reply = self.get(request, match)
        if reply[0] != 200:
            return reply
        if self.refuse_deletes > 0:
            self.refuse_deletes -= 1
            message = f"The resource '{match['name']}' is not ready"
            error = {"code": 400, "message": message,
                     "errors": [{"message": message, "domain": "global",
                                 "reason": "resourceNotReady"}]}  # fmt: skip
            return 400, {"error": error}, {}
        vm = self.vms.pop(match["name"])
        return 200, self._operation("delete", vm.zone, vm), {}

    def aggregated(self, request: Request, match: re.Match[str]) -> Reply:
        """``instances.aggregatedList`` filtered by one label (``labels.K = "V"``) or by
        names (:func:`names`)."""
        text = request.query["filter"][0]
        wanted = re.fullmatch(r'labels\.([a-z0-9_-]+) = "([^"]*)"', text)
        named = names(text) if wanted is None else None

        def chosen(vm: ComputeVm) -> bool:
            if named is not None:
                return vm.body["name"] in named
            assert wanted is not None
            return vm.body.get("labels", {}).get(wanted[1]) == wanted[2]

        items: dict[str, Any] = {}
        for vm in self.vms.values():
            if chosen(vm):
                scoped = items.setdefault(f"zones/{vm.zone}", {"instances": []})
                scoped["instances"].append(self.resource(vm))
        return 200, {"kind": "compute#instanceAggregatedList", "items": items}, {}

    def preempt(self, name: str) -> None:
        """What Compute Engine does to a Spot VM it reclaims: a system event, then the
        termination action (delete, or stop: status TERMINATED)."""
        vm = self._system_event(name, "compute.instances.preempted")
        if vm.body["scheduling"].get("instanceTerminationAction") == "DELETE":
            del self.vms[name]

    def host_maintenance(self, name: str, event: str = "terminateOnHostMaintenance") -> None:
        """What Compute Engine does to a GPU VM (``onHostMaintenance=TERMINATE``, no
        automatic restart) at host maintenance (``hostError``: a host that failed): a system
        event, then the VM stopped (status TERMINATED), whatever its termination action
        (that one is for preemption)."""
        self._system_event(name, f"compute.instances.{event}")

    def _system_event(self, name: str, kind: str) -> ComputeVm:
        vm = self.vms[name]
        self._operation(kind, vm.zone, vm, status="DONE", progress=100, user="system",
                        statusMessage=SYSTEM_EVENTS[kind])  # fmt: skip
        vm.status = "TERMINATED"
        return vm

    def region(self, request: Request, match: re.Match[str]) -> Reply:
        found = self.regions.get(match["region"])
        if found is None:
            error = {"code": 404, "message": f"The resource '{match['region']}' was not found",
                     "errors": [{"reason": "notFound", "message": "not found"}]}  # fmt: skip
            return 404, {"error": error}, {}
        status, zones = found
        return (
            200,
            {
                "kind": "compute#region",
                "name": match["region"],
                "status": status,
                "zones": [f"{COMPUTE}/projects/{PROJECT}/zones/{z}" for z in zones],
                "selfLink": f"{COMPUTE}/projects/{PROJECT}/regions/{match['region']}",
            },
            {},
        )

    def routes(self) -> list[tuple[str, str, Route]]:
        project = rf"/compute/v1/projects/{PROJECT}"
        zone = project + r"/zones/(?P<zone>[a-z0-9-]+)"
        return [
            ("GET", project + r"/regions/(?P<region>[a-z0-9-]+)", self.region),
            ("POST", zone + "/instances", self.insert),
            ("POST", zone + "/instances/bulkInsert", self.bulk_insert),
            ("POST", zone + "/instances/(?P<name>[^/]+)/setMetadata", self.set_metadata),
            ("POST", project + "/global/firewalls", self.insert_firewall),
            ("GET", project + "/global/firewalls/(?P<name>[^/]+)", self.firewall),
            ("DELETE", project + "/global/firewalls/(?P<name>[^/]+)", self.firewall),
            ("GET", project + "/global/operations/(?P<operation>[^/]+)", self.get_global_operation),
            (
                "GET",
                project + r"/regions/[a-z0-9-]+/operations/(?P<operation>[^/]+)",
                self.get_global_operation,
            ),
            ("POST", project + r"/regions/(?P<region>[a-z0-9-]+)/resourcePolicies", self.policy),
            (
                "GET",
                project + r"/regions/(?P<region>[a-z0-9-]+)/resourcePolicies/(?P<name>[^/]+)",
                self.policy,
            ),
            (
                "DELETE",
                project + r"/regions/(?P<region>[a-z0-9-]+)/resourcePolicies/"
                r"(?P<name>[^/]+)",
                self.policy,
            ),
            ("GET", project + "/aggregated/resourcePolicies", self.policy),
            ("GET", zone + "/instances/(?P<name>[^/]+)", self.get),
            ("DELETE", zone + "/instances/(?P<name>[^/]+)", self.delete),
            ("GET", zone + "/operations/(?P<operation>[^/]+)", self.get_operation),
            ("GET", zone + "/operations", self.list_operations),
            ("GET", project + "/aggregated/instances", self.aggregated),
            ("GET", project + "/aggregated/(?P<kind>machineTypes)", self.types),
        ]


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
    #: Local SSDs (375 GB SCRATCH disks; a2-ultragpu, a3 and a4 come with them).
    local_ssds: int = 0

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
            "disks": [{"boot": True, "type": "PERSISTENT", "deviceName": "boot"}]
            + [
                {
                    "type": "SCRATCH",
                    "interface": "NVME",
                    "diskSizeGb": "375",
                    "deviceName": f"local-ssd-{n}",
                }
                for n in range(self.local_ssds)
            ],
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
        # metric type -> (instance id, series label) -> [(time, value)]
        self.series: dict[str, dict[tuple[str, str], list[tuple[datetime, float]]]] = {}
        #: Time series per page (None: one page); ``stuck_token`` is handed out forever.
        self.page_size: int | None = None
        self.stuck_token: str | None = None
        #: Which poll (``zoneOperations.get``) of an operation first answers DONE (the
        #: ones before answer RUNNING): 0, it is done when started; None, never.
        self.done_on_poll: int | None = 0
        #: The polls of each operation, by its name.
        self.operation_polls: dict[str, int] = {}
        self.requests.clear()

    def add(self, vm: GcpVm) -> GcpVm:
        self.vms[vm.name] = vm
        return vm

    def put(
        self, metric: str, instance_id: str, points: list[tuple[datetime, float]], label: str = ""
    ) -> None:
        """Raw points of one series (``label``: e.g. the GPU number of a multi-GPU VM)."""
        self.series.setdefault(metric, {}).setdefault((instance_id, label), []).extend(points)

    def _operation(self, kind: str, zone: str, name: str, *, polls: int = 0) -> dict[str, Any]:
        """Operation ``kind`` on VM ``name``, as answered after ``polls`` polls of it."""
        done = self.done_on_poll is not None and polls >= self.done_on_poll
        return {
            "kind": "compute#operation",
            "id": "4242",
            "name": f"operation-{kind}-{name}",
            "zone": f"https://www.googleapis.com/compute/v1/projects/{GCP_PROJECT}/zones/{zone}",
            "operationType": kind,
            "status": "DONE" if done else "RUNNING",
            "progress": 100 if done else 0,
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
        """``instances.stop``; a VM with Local SSDs needs ``discardLocalSsd`` (rule
        stop_local_ssd_needs_discard)."""
        vm = self.vms[match["name"]]
        discard = request.query.get("discardLocalSsd", [""])[0]
        if vm.local_ssds and discard not in ("true", "false"):
            return (*rule_error("stop_local_ssd_needs_discard"), {})
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
        """``zoneOperations.get`` of an operation this server started (named
        ``operation-<kind>-<vm>``)."""
        name = request.path.rsplit("/", 1)[-1]
        polls = self.operation_polls[name] = self.operation_polls.get(name, 0) + 1
        _, kind, vm = name.split("-", 2)
        return 200, self._operation(kind, match["zone"], vm, polls=polls), {}

    def time_series(self, request: Request, match: re.Match[str]) -> Reply:
        """``projects.timeSeries.list`` with the aggregation asked for (rules aligners,
        reducers, metric_kinds): each raw series aligned into periods that end at
        ``interval.endTime``, then reduced across series grouped by ``groupByFields``; values
        typed as the definitions say (``int64Value`` as a string for INT64); newest first."""
        query = {k: v[0] for k, v in request.query.items()}
        metric = re.search(r'metric\.type = "([^"]+)"', query.get("filter", ""))
        if metric is None:
            return (*google_error(400, "Field filter had an invalid value"), {})
        kind, value_type = RULES["metric_kinds"]["metrics"][metric[1]]
        start = datetime.fromisoformat(query["interval.startTime"])
        end = datetime.fromisoformat(query["interval.endTime"])
        aligner = query.get("aggregation.perSeriesAligner", "ALIGN_NONE")
        reducer = query.get("aggregation.crossSeriesReducer", "REDUCE_NONE")
        period_text = query.get("aggregation.alignmentPeriod", "")
        if reducer != "REDUCE_NONE" and (aligner == "ALIGN_NONE" or not period_text):
            message = "The cross-series reducer needs a per-series aligner and an alignment period"
            return (*google_error(400, message), {})
        if aligner != "ALIGN_NONE" and kind not in RULES["aligners"]["valid"].get(aligner, []):
            message = f"The aligner {aligner} is not valid for metric kind {kind}"
            return (*google_error(400, message), {})
        if reducer != "REDUCE_NONE" and reducer not in RULES["reducers"]["valid"]:
            return (*google_error(400, f"Unsupported reducer {reducer}"), {})
        raw = {
            key: [(t, v) for t, v in points if start < t <= end]
            for key, points in self.series.get(metric[1], {}).items()
        }
        aligned: dict[tuple[str, str], dict[datetime, float]]
        if aligner == "ALIGN_NONE":
            out_type = value_type
            aligned = {key: dict(points) for key, points in raw.items()}
        else:
            period = timedelta(seconds=int(period_text.rstrip("s")))
            out_type = "DOUBLE" if aligner in ("ALIGN_RATE", "ALIGN_MEAN") else value_type
            aligned = {}
            for key, points in raw.items():
                buckets: dict[datetime, list[float]] = defaultdict(list)
                for t, v in points:
                    # Periods (e - P, e] that end at the interval's end time.
                    buckets[end - ((end - t) // period) * period].append(v)
                aligned[key] = {
                    at: (
                        max(values) if aligner == "ALIGN_MAX"
                        else sum(values) / len(values) if aligner == "ALIGN_MEAN"
                        else sum(values) / period.total_seconds()
                    )
                    for at, values in buckets.items()
                }  # fmt: skip
        grouped: dict[str, dict[datetime, list[float]]] = defaultdict(lambda: defaultdict(list))
        for (instance_id, label), by_time in aligned.items():
            group = instance_id if reducer != "REDUCE_NONE" else f"{instance_id}|{label}"
            for at, v in by_time.items():
                grouped[group][at].append(v)
        out = []
        for group, values_at in sorted(grouped.items()):
            instance_id, _, label = group.partition("|")
            reduced = {
                at: (
                    max(values) if reducer == "REDUCE_MAX"
                    else sum(values) / len(values) if reducer == "REDUCE_MEAN"
                    else sum(values) if reducer == "REDUCE_SUM"
                    else values[0]
                )
                for at, values in values_at.items()
            }  # fmt: skip
            if not reduced:
                continue
            out.append(
                {
                    "metric": {
                        "type": metric[1],
                        "labels": {GPU_LABEL: label} if label else {},
                    },
                    "resource": {
                        "type": "gce_instance",
                        "labels": {"project_id": match["project"], "instance_id": instance_id},
                    },
                    "metricKind": "GAUGE" if aligner != "ALIGN_NONE" else kind,
                    "valueType": out_type,
                    "points": [
                        {
                            "interval": {"startTime": rfc3339(at), "endTime": rfc3339(at)},
                            "value": {"int64Value": str(int(v))} if out_type == "INT64"
                            else {"doubleValue": v},
                        }
                        for at, v in sorted(reduced.items(), reverse=True)
                    ],
                }
            )  # fmt: skip
        if self.stuck_token is not None:
            return 200, {"timeSeries": out[:1], "nextPageToken": self.stuck_token}, {}
        if self.page_size is None:
            return 200, {"timeSeries": out, "unit": ""}, {}
        first = int(query.get("pageToken", "0"))
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


class BudgetsFake:
    """Billing Budgets v1 (``/v1/billingAccounts/*/budgets``), Monitoring v3 notification
    channels and Resource Manager v3 ``projects.get``, strict about the budget's display
    name, its currency and its project filter (rules budget_*)."""

    def __init__(self) -> None:
        self.budgets: dict[str, dict[str, Any]] = {}
        self.channels: dict[str, dict[str, Any]] = {}
        self.ids = itertools.count(1)
        #: The currency every billing account bills in (set it to model a non-USD account).
        self.currency = "USD"
        #: Project id -> project number, as Resource Manager knows them.
        self.projects = {GCP_PROJECT: PROJECT_NUMBER}

    def __call__(self, method: str, path: str, query: dict[str, list[str]], body: Any):
        segments = path.strip("/").split("/")
        if segments[0] == "v1" and segments[1] == "billingAccounts":
            return self._budgets(method, "/".join(segments[1:]), query, body)
        if segments[:2] == ["v3", "projects"] and len(segments) == 3 and method == "GET":
            return self._project(segments[2])
        if segments[0] == "v3" and segments[1] == "projects":
            return self._channels(method, "/".join(segments[1:]), body)
        return google_error(404, f"no route {path}")

    def _project(self, project: str) -> tuple[int, dict[str, Any]]:
        """Resource Manager v3 ``projects.get``: ``name`` is ``projects/<number>``."""
        number = self.projects.get(project) or (
            project if project in self.projects.values() else None
        )
        if number is None:
            return google_error(403, f"Permission denied on resource project {project}.")
        project_id = next(i for i, n in self.projects.items() if n == number)
        return 200, {"name": f"projects/{number}", "projectId": project_id, "state": "ACTIVE"}

    def _check(self, body: dict[str, Any], existing: dict[str, Any] | None):
        """The budget rules; None when the body is acceptable, else the error reply."""
        limit = RULES["budget_display_name_length"]["limit"]
        if len(body.get("displayName", "")) > limit:
            return rule_error("budget_display_name_length")
        channels = body.get("notificationsRule", {}).get("monitoringNotificationChannels", [])
        if len(channels) > RULES["budget_channels"]["limit"]:
            return rule_error("budget_channels")
        money = body.get("amount", {}).get("specifiedAmount", {})
        given = money.get("currencyCode")
        wanted = (
            existing["amount"]["specifiedAmount"]["currencyCode"] if existing else self.currency
        )
        if given is not None and given != wanted:
            return rule_error("budget_currency")
        for project in body.get("budgetFilter", {}).get("projects", []):
            key = project.removeprefix("projects/")
            if key not in self.projects and key not in self.projects.values():
                return google_error(400, f"Project {project} does not exist.")
        return None

    def _stored(self, body: dict[str, Any], name: str, currency: str, etag: str):
        """The budget as the API answers it: its currency filled in, projects by number."""
        stored = json.loads(json.dumps(body))
        stored.setdefault("amount", {}).setdefault("specifiedAmount", {})["currencyCode"] = currency
        projects = stored.get("budgetFilter", {}).get("projects")
        if projects:
            bare = [p.removeprefix("projects/") for p in projects]
            stored["budgetFilter"]["projects"] = [
                f"projects/{self.projects.get(p, p)}" for p in bare
            ]
        return {**stored, "name": name, "etag": etag}

    def _budgets(self, method: str, resource: str, query, body):
        parts = resource.split("/")
        if len(parts) == 2 and method == "GET":  # Cloud Billing v1 billingAccounts.get
            return 200, {"name": resource, "open": True, "currencyCode": self.currency}
        if len(parts) == 3 and method == "POST":  # billingAccounts/X/budgets
            refused = self._check(body, None)
            if refused:
                return refused
            name = f"{resource}/{next(self.ids)}"
            self.budgets[name] = self._stored(body, name, self.currency, "1")
            return 200, self.budgets[name]
        if len(parts) == 3 and method == "GET":
            items = [b for n, b in self.budgets.items() if n.startswith(resource + "/")]
            # Page by one so the client's pager is exercised.
            start = int(query.get("pageToken", ["0"])[0])
            page: dict[str, Any] = {"budgets": items[start : start + 1]}
            if start + 1 < len(items):
                page["nextPageToken"] = str(start + 1)
            return 200, page
        if resource not in self.budgets:
            return google_error(404, "budget not found")
        if method == "GET":
            return 200, self.budgets[resource]
        if method == "PATCH":
            existing = self.budgets[resource]
            refused = self._check(body, existing)
            if refused:
                return refused
            currency = existing["amount"]["specifiedAmount"]["currencyCode"]
            self.budgets[resource] = self._stored(body, resource, currency, "2")
            return 200, self.budgets[resource]
        if method == "DELETE":
            del self.budgets[resource]
            return 200, {}
        return 405, {"error": {"code": 405, "message": method, "status": "UNIMPLEMENTED"}}

    def _channels(self, method: str, resource: str, body):
        if method == "POST":
            name = f"{resource}/{next(self.ids)}"
            self.channels[name] = {**body, "name": name}
            return 200, self.channels[name]
        items = [c for n, c in self.channels.items() if n.startswith(resource + "/")]
        return 200, {"notificationChannels": items}


def gpu_count(vm: GcpVm) -> int:
    """The GPUs of ``vm``: its accelerators, else what the price tables say its machine type
    has (the A2, A3, A4 and G2 families list none), as the reaper counts them."""
    from costguard.pricing.tables import load_catalog
    from costguard.reaper.fleet import PriceBook

    known = PriceBook(load_catalog()).gpus("gcp", vm.machine_type)
    return vm.accelerator_count or (known[1] if known else 0) or 1


def seed_vm(
    server: GcpServer, vm: GcpVm, now: datetime, *, gpu: float | None = 1.0, cpu: float = 0.01
) -> None:
    """Cloud Monitoring series for ``vm`` up to ``now``: GPU (``None``: no Ops Agent), CPU
    (a fraction of 1) and a trickle of network."""
    from costguard.reaper import gcp

    if gpu is not None:  # the Ops Agent writes one series per GPU (label gpu_number)
        for number in range(gpu_count(vm)):
            server.put(gcp.GPU_METRIC, vm.instance_id, every_minute(now, gpu), str(number))
    server.put(gcp.CPU_METRIC, vm.instance_id, every_minute(now, cpu))
    # DELTA counts: bytes per minute (100 B/min is under 2 B/s after ALIGN_RATE).
    server.put(gcp.RECEIVED_METRIC, vm.instance_id, every_minute(now, 100.0))
    server.put(gcp.SENT_METRIC, vm.instance_id, every_minute(now, 100.0))
