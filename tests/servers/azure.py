"""Strict fakes of the Azure REST APIs costguard calls: Resource Manager compute (the spot
launcher's and the reaper's calls), Azure Monitor metrics and the Consumption budgets.

Each fake answers the documented paths with the documented JSON, and *refuses* what the real
service refuses, in the shape the service sends (an immediate ARM error body, or a failed
long-running operation). The rules, and the definitions they come from (spec file,
repository, commit), are test data: ``tests/servers/definitions/azure.json``; the table in
``tests/README.md`` says which fake enforces which rule and what none of them can model.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.servers.http import LocalServer, Reply, Request, Route, every_minute, rfc3339

AZURE_SUBSCRIPTION = "00000000-0000-0000-0000-000000000001"
SUBSCRIPTION = AZURE_SUBSCRIPTION

#: What a launch into the ARM fake needs (the spot and contract suites).
GROUP = "costguard-jobs"
NETWORK = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/net/providers/Microsoft.Network"
IDENTITY = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/"
    "Microsoft.ManagedIdentity/userAssignedIdentities/costguard-instance"
)
LAUNCH_OPTIONS = {
    "subscription": SUBSCRIPTION,
    "resource_group": GROUP,
    "image": "microsoft-dsvm:ubuntu-hpc:2204:latest",
    "subnet": f"{NETWORK}/virtualNetworks/lab/subnets/jobs",
    "identity": IDENTITY,
    "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleKeyOnly me@laptop",
}
#: The rules the fakes enforce, with their sources.
RULES: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "definitions" / "azure.json").read_text()
)["rules"]


#: A series' dimensions, sorted (name, value) pairs; one raw point.
Dimensions = tuple[tuple[str, str], ...]
Point = tuple[datetime, float]
#: How the fake aggregates the raw values of one minute (several series of a combination).
AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "average": lambda values: sum(values) / len(values),
    "count": len,
    "maximum": max,
    "minimum": min,
    "total": sum,
}
RESOURCE_ID = RULES["metrics_resource_id_dimension"]["spelling"]


def arm_error(rule: str, **names: str) -> Reply:
    """The immediate ARM error reply a rule of ``definitions/azure.json`` describes."""
    spec = RULES[rule]
    message = spec["message"]
    for key, value in names.items():
        message = message.replace("{" + key + "}", value)
    return spec["status"], {"error": {"code": spec["code"], "message": message}}, {}


def _filter_is_scale_set(query: dict[str, list[str]]) -> bool:
    """Whether ``$filter`` is the one value the spec allows on a VM listing."""
    text = query.get("$filter", [""])[0]
    return bool(
        re.fullmatch(
            r"'?virtualMachineScaleSet/id'? eq '/subscriptions/[^/]+/resourceGroups/[^/]+/"
            r"providers/Microsoft\.Compute/virtualMachineScaleSets/[^/']+'",
            text.strip(),
            re.IGNORECASE,
        )
    )


def check_vm_listing(request: Request) -> Reply | None:
    """``$expand=instanceView`` needs a scale-set ``$filter`` (rule list_expand_needs_filter)."""
    if "$expand" in request.query and not _filter_is_scale_set(request.query):
        return arm_error("list_expand_needs_filter")
    return None


def check_vm_put(body: dict[str, Any], stored: dict[str, Any] | None) -> Reply | None:
    """The limits of a VM create-or-update body; ``stored``: the VM's body if it exists."""
    tags = body.get("tags") or {}
    if len(tags) > RULES["max_tags"]["limit"]:
        return arm_error("max_tags")
    profile = body.get("properties", {}).get("osProfile", {})
    custom = profile.get("customData")
    if custom is not None:
        try:
            decoded = base64.b64decode(custom, validate=True)
        except (binascii.Error, ValueError):
            return arm_error("custom_data_max_bytes")
        if len(decoded) > RULES["custom_data_max_bytes"]["limit"]:
            return arm_error("custom_data_max_bytes")
    if len(profile.get("computerName", "")) > RULES["computer_name"]["max_length_linux"]:
        return arm_error("computer_name")
    user = profile.get("adminUsername", "")
    rule = RULES["admin_username"]
    if not 1 <= len(user) <= rule["max_length_linux"] or user.lower() in rule["disallowed"]:
        return arm_error("admin_username")
    if stored is not None:
        before = stored.get("properties", {}).get("osProfile", {})
        for path in RULES["immutable_after_create"]["fields"]:
            name = path.split(".")[-1]
            if profile.get(name) != before.get(name):
                return arm_error("immutable_after_create", field=path)
    return None


@dataclass
class ArmVm:
    body: dict[str, Any]
    group: str
    name: str
    provisioning: str = "Creating"
    power: str = "starting"
    #: Its NIC's private address.
    address: str = ""


def _network_references(body: dict[str, Any]) -> list[str]:
    """The network security groups and application security groups a VM's inline NICs
    name (they must exist: ARM refuses a reference to a missing resource)."""
    found = []
    for nic in body["properties"]["networkProfile"]["networkInterfaceConfigurations"]:
        group = nic["properties"].get("networkSecurityGroup")
        if group:
            found.append(group["id"])
        for ip in nic["properties"]["ipConfigurations"]:
            found += [a["id"] for a in ip["properties"].get("applicationSecurityGroups", [])]
    return found


def _nic_id(group: str, name: str) -> str:
    """The id of a NIC a VM declares inline (``networkInterfaceConfigurations``)."""
    return (f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers/"
            f"Microsoft.Network/networkInterfaces/{name}")  # fmt: skip


class ArmServer(LocalServer):
    """Resource Manager ``Microsoft.Compute/virtualMachines`` as the spot launcher uses it:
    PUT (a long-running operation polled through ``Azure-AsyncOperation``), GET with
    ``$expand=instanceView``, DELETE, the resource group listing and the Resource SKUs
    listing; strict about the listing's ``$expand``/``$filter`` pair, the body's limits,
    immutable properties and the subnet's region."""

    def reset(self) -> None:
        self.vms: dict[str, ArmVm] = {}
        #: Subnet id (lower case) -> the region of its virtual network.
        self.subnets: dict[str, str] = {
            f"/subscriptions/{SUBSCRIPTION}/resourcegroups/net/providers/microsoft.network/"
            "virtualnetworks/lab/subnets/jobs": "eastus",
            f"/subscriptions/{SUBSCRIPTION}/resourcegroups/net/providers/microsoft.network/"
            "virtualnetworks/lab-west/subnets/jobs": "westus",
        }
        #: (location, size) the subscription may not use there at all: a ``Location``
        #: restriction in the Resource SKUs listing.
        self.location_restricted: set[tuple[str, str]] = set()
        self.operations: dict[str, dict[str, Any]] = {}
        self.full_sizes: set[str] = set()
        #: The next this many VM PUTs are refused for the subscription's request rate, as
        #: Resource Manager throttles: HTTP 429 ``TooManyRequests`` with ``Retry-After``
        #: (request-limits-and-throttling); counted in ``throttled``.
        self.throttle_puts = 0
        self.throttled = 0
        #: How many VM PUTs pass before the throttling begins (a gang whose first nodes
        #: are created and a later one throttled).
        self.puts_before_throttle = 0
        #: (location, size) -> (zones, zones restricted for the subscription), as the
        #: Resource SKUs API lists them.
        self.skus: dict[tuple[str, str], tuple[list[str], list[str]]] = {
            ("eastus", "Standard_NC4as_T4_v3"): (["3", "1", "2"], []),
            ("eastus", "Standard_NC24ads_A100_v4"): (["1", "2", "3"], ["2"]),
            ("westus", "Standard_NC4as_T4_v3"): ([], []),  # a region without zones
        }
        self.ids = itertools.count(1)
        #: size -> how many more VMs of it Azure has room for (absent: any number); a
        #: create beyond fails as a full size does (a gang's partial failure).
        self.room: dict[str, int] = {}
        #: Proximity placement groups by (group, name).
        self.placement_groups: dict[tuple[str, str], dict[str, Any]] = {}
        #: Network security groups and application security groups: (kind, group, name).
        self.network: dict[tuple[str, str, str], dict[str, Any]] = {}
        #: The next this many VM DELETEs answer 409 ``AnotherOperationInProgress``
        #: ("Another operation on this or dependent resource is in progress"), as ARM
        #: does while an operation on the VM or a resource it uses has not finished.
        self.busy_deletes = 0
        #: A deleted VM's NIC (``deleteOption=Delete``) is deleted after the VM, not with
        #: it: it stays in its security groups for this many more DELETEs of them, each
        #: refused as in use (see :meth:`network_resource`). Counts, not seconds.
        self.nic_lingers = 0
        #: NIC id -> (the security groups it is in, DELETE refusals left before it goes).
        self.lingering: dict[str, tuple[list[str], int]] = {}
        #: VMs per page of ``virtualMachines.listAll`` (0: every VM on one page).
        self.page_size = 0
        #: The caller's role is assigned on the resource group only (as
        #: infra/azure/launcher-role.json says): a subscription-scope listing is refused
        #: with 403 ``AuthorizationFailed``.
        self.group_scoped_role = False
        self.requests.clear()

    def resource(self, vm: ArmVm) -> dict[str, Any]:
        properties = dict(vm.body["properties"])
        properties["osProfile"] = {
            k: v for k, v in properties["osProfile"].items() if k != "customData"
        }  # ARM never returns customData
        properties["networkProfile"] = {
            **properties["networkProfile"],
            "networkInterfaces": [
                {"id": _nic_id(vm.group, c["name"]), "properties": {"primary": True}}
                for c in properties["networkProfile"]["networkInterfaceConfigurations"]
            ],
        }
        properties.update(
            provisioningState=vm.provisioning,
            timeCreated="2026-12-01T03:00:00.1234567+00:00",
            vmId="5c1b7c1e-0000-0000-0000-000000000001",
        )
        return {
            "id": f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{vm.group}/providers/"
            f"Microsoft.Compute/virtualMachines/{vm.name}",
            "name": vm.name,
            "type": "Microsoft.Compute/virtualMachines",
            **{k: v for k, v in vm.body.items() if k != "properties"},
            "properties": properties,
        }

    def with_view(self, vm: ArmVm) -> dict[str, Any]:
        body = self.resource(vm)
        body["properties"]["instanceView"] = {
            "statuses": [
                {"code": f"ProvisioningState/{vm.provisioning.lower()}", "level": "Info",
                 "displayStatus": f"Provisioning {vm.provisioning.lower()}"},
                {"code": f"PowerState/{vm.power}", "level": "Info",
                 "displayStatus": f"VM {vm.power}"},
            ]
        }  # fmt: skip
        return body

    def _async(self, kind: str, vm: ArmVm, location: str) -> dict[str, str]:
        number = next(self.ids)
        self.operations[str(number)] = {"kind": kind, "vm": vm, "polls": 0}
        url = (f"{{base}}/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/locations/"
               f"{location}/operations/{number}?api-version=2026-04-01")  # fmt: skip
        return {"Azure-AsyncOperation": url, "Retry-After": "0"}

    def put(self, request: Request, match: re.Match[str]) -> Reply:
        assert request.query.get("api-version"), request.query
        if self.puts_before_throttle > 0:
            self.puts_before_throttle -= 1
        elif self.throttle_puts > 0:
            self.throttle_puts -= 1
            self.throttled += 1
            error = {"code": "TooManyRequests", "message": "The request is being throttled."}
            return 429, {"error": error}, {"Retry-After": "2"}
        body = request.body
        name = match["name"]
        vm = self.vms.get(name)
        refused = check_vm_put(body, vm.body if vm is not None else None)
        if refused is not None:
            return refused
        for nic in body["properties"]["networkProfile"]["networkInterfaceConfigurations"]:
            for ip in nic["properties"]["ipConfigurations"]:
                subnet = ip["properties"]["subnet"]["id"]
                if self.subnets.get(subnet.lower()) != body["location"]:
                    return arm_error("subnet_in_vm_region", subnet=subnet, nic=nic["name"])
        placement = body["properties"].get("proximityPlacementGroup", {}).get("id", "")
        if placement and not any(
            g.get("id", "").lower() == placement.lower() for g in self.placement_groups.values()
        ):
            message = f"Proximity placement group '{placement}' was not found."
            error = {"code": "InvalidParameter", "message": message}
            return 400, {"error": error}, {}
        missing = [ref for ref in _network_references(body) if not self._known(ref)]
        if missing:
            message = f"Resource {missing[0]} referenced by resource {name} was not found."
            error = {"code": "InvalidResourceReference", "message": message}
            return 400, {"error": error}, {}
        if vm is None:
            vm = self.vms[name] = ArmVm(
                body, match["group"], name, address=f"10.1.0.{next(self.ids)}"
            )
        else:  # PUT again: an update of the same VM
            vm.body = body
        return 201, self.resource(vm), self._async("create", vm, body["location"])

    def operation(self, request: Request, match: re.Match[str]) -> Reply:
        operation = self.operations[match["id"]]
        operation["polls"] += 1
        vm: ArmVm = operation["vm"]
        if operation["polls"] == 1:
            return 200, {"name": match["id"], "status": "InProgress"}, {}
        size = vm.body["properties"]["hardwareProfile"]["vmSize"]
        if operation["kind"] == "create" and size in self.room:
            if self.room[size] <= 0:
                self.full_sizes.add(size)
            else:
                self.room[size] -= 1
        if operation["kind"] == "create" and size in self.full_sizes:
            self.vms.pop(vm.name, None)
            error = {
                "code": "SkuNotAvailable",
                "message": f"The requested VM size {size} is currently not available",
            }
            return 200, {"name": match["id"], "status": "Failed", "error": error}, {}  # fmt: skip
        if operation["kind"] == "create":
            vm.provisioning, vm.power = "Succeeded", "running"
        elif self.vms.pop(vm.name, None) is not None and self.nic_lingers:
            nics = vm.body["properties"]["networkProfile"]["networkInterfaceConfigurations"]
            for nic in nics:
                self.lingering[_nic_id(vm.group, nic["name"]).lower()] = (
                    [ref.lower() for ref in _network_references({"properties": {
                        "networkProfile": {"networkInterfaceConfigurations": [nic]}}})],
                    self.nic_lingers,
                )  # fmt: skip
        return 200, {"name": match["id"], "status": "Succeeded"}, {}

    def get(self, request: Request, match: re.Match[str]) -> Reply:
        vm = self.vms.get(match["name"])
        if vm is None:
            error = {"code": "ResourceNotFound",
                     "message": f"The Resource '{match['name']}' was not found."}  # fmt: skip
            return 404, {"error": error}, {}
        if request.query.get("$expand") == ["instanceView"]:
            return 200, self.with_view(vm), {}
        return 200, self.resource(vm), {}

    def delete(self, request: Request, match: re.Match[str]) -> Reply:
        vm = self.vms.get(match["name"])
        if vm is None:
            return 204, None, {}
        if self.busy_deletes > 0:
            self.busy_deletes -= 1
            error = {"code": "AnotherOperationInProgress",
                     "message": "Another operation on this or dependent resource is in "
                                "progress."}  # fmt: skip
            return 409, {"error": error}, {}
        vm.provisioning = "Deleting"
        return 202, None, self._async("delete", vm, vm.body["location"])

    def list_group(self, request: Request, match: re.Match[str]) -> Reply:
        refused = check_vm_listing(request)
        if refused is not None:
            return refused
        return 200, {"value": [self.resource(vm) for vm in self.vms.values()
                               if vm.group == match["group"]]}, {}  # fmt: skip

    def list_all(self, request: Request, match: re.Match[str]) -> Reply:
        """``virtualMachines.listAll``: with ``statusOnly=true`` each VM's id, name and
        instance view only (rule status_only_is_status_only), ``page_size`` a page with a
        ``nextLink`` (0: one page); the model view otherwise."""
        refused = check_vm_listing(request)
        if refused is not None:
            return refused
        if self.group_scoped_role:
            message = (
                "The client 'costguard' does not have authorization to perform action "
                "'Microsoft.Compute/virtualMachines/read' over scope "
                f"'/subscriptions/{SUBSCRIPTION}'"
            )
            return 403, {"error": {"code": "AuthorizationFailed", "message": message}}, {}
        status_only = request.query.get("statusOnly") == ["true"]
        views = []
        for vm in self.vms.values():
            if status_only:
                body = self.with_view(vm)
                views.append(
                    {
                        "id": body["id"],
                        "name": vm.name,
                        "type": body["type"],
                        "tags": None,
                        "properties": {"instanceView": body["properties"]["instanceView"]},
                    }
                )
            else:
                views.append(self.resource(vm))
        start = int(request.query.get("skip", ["0"])[0])
        if not self.page_size:
            return 200, {"value": views}, {}
        end = start + self.page_size
        page: dict[str, Any] = {"value": views[start:end]}
        if end < len(views):
            query = "&".join(f"{k}={v[0]}" for k, v in request.query.items() if k != "skip")
            page["nextLink"] = (
                f"{self.url}/subscriptions/{SUBSCRIPTION}/providers/"
                f"Microsoft.Compute/virtualMachines?{query}&skip={end}"
            )
        return 200, page, {}

    def list_skus(self, request: Request, match: re.Match[str]) -> Reply:
        wanted = re.fullmatch(r"location eq '([a-z0-9]+)'", request.query["$filter"][0])
        assert wanted, request.query
        value: list[dict[str, Any]] = [
            {"resourceType": "disks", "name": "Premium_LRS", "locations": [wanted[1]],
             "locationInfo": [{"location": wanted[1], "zones": ["1", "2", "3"]}]},
        ]  # fmt: skip
        for (location, size), (zones, restricted) in self.skus.items():
            if location != wanted[1]:
                continue
            sku: dict[str, Any] = {
                "resourceType": "virtualMachines",
                "name": size,
                "tier": "Standard",
                "locations": [location],
                "locationInfo": [{"location": location, "zones": zones, "zoneDetails": []}],
                "restrictions": [],
            }
            if (location, size) in self.location_restricted:
                sku["restrictions"].append({
                    "type": "Location",
                    "values": [location],
                    "restrictionInfo": {"locations": [location]},
                    "reasonCode": "NotAvailableForSubscription",
                })  # fmt: skip
            if restricted:
                sku["restrictions"].append({
                    "type": "Zone",
                    "values": [location],
                    "restrictionInfo": {"locations": [location], "zones": restricted},
                    "reasonCode": "NotAvailableForSubscription",
                })  # fmt: skip
            value.append(sku)
        return 200, {"value": value}, {}

    def update(self, request: Request, match: re.Match[str]) -> Reply:
        """``virtualMachines.update`` (PATCH): the tags given replace the VM's tags."""
        vm = self.vms.get(match["name"])
        if vm is None:
            return self.get(request, match)
        if "tags" in request.body:
            vm.body["tags"] = dict(request.body["tags"])
        return 200, self.resource(vm), {}

    def nic(self, request: Request, match: re.Match[str]) -> Reply:
        """``networkInterfaces.get`` of a NIC a VM declared inline: its private address."""
        for vm in self.vms.values():
            configurations = vm.body["properties"]["networkProfile"][
                "networkInterfaceConfigurations"
            ]
            if vm.group == match["group"] and any(
                c["name"] == match["nic"] for c in configurations
            ):
                address = {"privateIPAddress": vm.address, "privateIPAllocationMethod": "Dynamic"}
                ip = {"name": "ipconfig1", "properties": address}
                body = {"id": _nic_id(vm.group, match["nic"]), "name": match["nic"],
                        "properties": {"ipConfigurations": [ip]}}  # fmt: skip
                return 200, body, {}
        error = {
            "code": "ResourceNotFound",
            "message": f"The Resource '{match['nic']}' was not found.",
        }
        return 404, {"error": error}, {}

    def _known(self, resource_id: str) -> bool:
        return any(r.get("id", "").lower() == resource_id.lower() for r in self.network.values())

    def network_resource(self, request: Request, match: re.Match[str]) -> Reply:
        """``networkSecurityGroups`` and ``applicationSecurityGroups`` (Microsoft.Network):
        PUT (done at once), GET, DELETE, and the resource group's list."""
        kind, group = match["kind"], match["group"]
        name = match.groupdict().get("name")
        if name is None:
            listed = [r for (k, g, _), r in self.network.items() if (k, g) == (kind, group)]
            return 200, {"value": listed}, {}
        key = (kind, group, name)
        if request.method == "PUT":
            self.network[key] = {
                "id": f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers/"
                f"Microsoft.Network/{kind}/{name}",
                "name": name, "type": f"Microsoft.Network/{kind}",
                **{k: v for k, v in request.body.items() if k != "properties"},
                "properties": {**request.body.get("properties", {}),
                               "provisioningState": "Succeeded"},
            }  # fmt: skip
            return 201, self.network[key], {}
        if key not in self.network:
            if request.method == "DELETE":
                return 204, None, {}
            error = {"code": "ResourceNotFound", "message": f"The Resource '{name}' was not found."}
            return 404, {"error": error}, {}
        if request.method == "DELETE":
            users = self._users(self.network[key]["id"])
            if users:
                return self._in_use(kind, self.network[key]["id"], users)
            del self.network[key]
            return 200, None, {}
        return 200, self.network[key], {}

    def _users(self, resource_id: str) -> list[str]:
        """The NICs in the security group ``resource_id``: those of the VMs that exist,
        and those of deleted VMs not gone yet (each refusal counts one down)."""
        wanted = resource_id.lower()
        users = [
            _nic_id(vm.group, nic["name"])
            for vm in self.vms.values()
            for nic in vm.body["properties"]["networkProfile"]["networkInterfaceConfigurations"]
            if wanted in [r.lower() for r in _network_references(
                {"properties": {"networkProfile": {"networkInterfaceConfigurations": [nic]}}})]
        ]  # fmt: skip
        for nic, (groups, left) in list(self.lingering.items()):
            if wanted in groups:
                users.append(nic)
                if left <= 1:
                    del self.lingering[nic]
                else:
                    self.lingering[nic] = (groups, left - 1)
        return users

    @staticmethod
    def _in_use(kind: str, resource_id: str, users: list[str]) -> Reply:
        """A security group's DELETE refused while a NIC is in it: as ARM answers a
        network security group's (HTTP 400 ``InUseNetworkSecurityGroupCannotBeDeleted``,
        "cannot be deleted because it is in use by the following resources"); an
        application security group's is answered in the same shape."""
        noun = "Network" if kind == "networkSecurityGroups" else "Application"
        message = (f"{noun} security group {resource_id} cannot be deleted because it is in "
                   f"use by the following resources: {', '.join(users)}.")  # fmt: skip
        error = {"code": f"InUse{noun}SecurityGroupCannotBeDeleted", "message": message}
        return 400, {"error": error}, {}

    def placement_group(self, request: Request, match: re.Match[str]) -> Reply:
        """Proximity placement groups: PUT (synchronous), GET, DELETE, and the group's list."""
        key = (match["group"], match["ppg"]) if match.groupdict().get("ppg") else None
        if key is None:
            listed = [
                g for (group, _), g in self.placement_groups.items() if group == match["group"]
            ]
            return 200, {"value": listed}, {}
        if request.method == "PUT":
            self.placement_groups[key] = {
                "id": f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{key[0]}/providers/"
                f"Microsoft.Compute/proximityPlacementGroups/{key[1]}",
                "name": key[1], "type": "Microsoft.Compute/proximityPlacementGroups",
                **{k: v for k, v in request.body.items() if k != "properties"},
                "properties": dict(request.body.get("properties", {})),
            }  # fmt: skip
            return 200, self.placement_groups[key], {}
        if key not in self.placement_groups:
            if request.method == "DELETE":
                return 204, None, {}
            error = {
                "code": "ResourceNotFound",
                "message": f"The Resource '{key[1]}' was not found.",
            }
            return 404, {"error": error}, {}
        if request.method == "DELETE":
            placement = self.placement_groups[key]["id"].lower()
            members = [vm.name for vm in self.vms.values()
                       if vm.body["properties"].get("proximityPlacementGroup", {})
                       .get("id", "").lower() == placement]  # fmt: skip
            if members:
                message = (f"Proximity placement group {key[1]} cannot be deleted: it is in "
                           f"use by the virtual machines {', '.join(members)}.")  # fmt: skip
                return 409, {"error": {"code": "OperationNotAllowed", "message": message}}, {}
            del self.placement_groups[key]
            return 200, None, {}
        return 200, self.placement_groups[key], {}

    def evict(self, name: str) -> None:
        """What Azure does to an evicted Spot VM: delete it, or deallocate it."""
        vm = self.vms[name]
        if vm.body["properties"].get("evictionPolicy") == "Delete":
            del self.vms[name]
        else:
            vm.power = "deallocated"

    def routes(self) -> list[tuple[str, str, Route]]:
        subscription = f"/subscriptions/{SUBSCRIPTION}"
        group = subscription + r"/resourceGroups/(?P<group>[^/]+)"
        vm = group + r"/providers/Microsoft\.Compute/virtualMachines/(?P<name>[^/]+)"
        return [
            ("GET", subscription + r"/providers/Microsoft\.Compute/skus", self.list_skus),
            ("PUT", vm, self.put),
            ("PATCH", vm, self.update),
            ("GET", vm, self.get),
            ("GET", group + r"/providers/Microsoft\.Network/networkInterfaces/(?P<nic>[^/]+)",
             self.nic),
            *[(method, group + r"/providers/Microsoft\.Compute/proximityPlacementGroups"
               r"/(?P<ppg>[^/]+)", self.placement_group) for method in ("PUT", "GET", "DELETE")],
            ("GET", group + r"/providers/Microsoft\.Compute/proximityPlacementGroups",
             self.placement_group),
            *[(method, group + r"/providers/Microsoft\.Network/(?P<kind>networkSecurityGroups|"
               r"applicationSecurityGroups)/(?P<name>[^/]+)", self.network_resource)
              for method in ("PUT", "GET", "DELETE")],
            ("GET", group + r"/providers/Microsoft\.Network/(?P<kind>networkSecurityGroups|"
             r"applicationSecurityGroups)", self.network_resource),
            ("DELETE", vm, self.delete),
            ("GET", group + r"/providers/Microsoft\.Compute/virtualMachines", self.list_group),
            ("GET", subscription + r"/providers/Microsoft\.Compute/virtualMachines",
             self.list_all),
            ("GET", subscription + r"/providers/Microsoft\.Compute/locations/[^/]+/operations/"
             r"(?P<id>\d+)", self.operation),
        ]  # fmt: skip


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

    def model(self) -> dict[str, Any]:
        """The model view ``virtualMachines.listAll`` returns (no instance view)."""
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
            },
        }

    def status_only(self) -> dict[str, Any]:
        """What ``listAll?statusOnly=true`` is modelled to return (rule
        status_only_is_status_only): the VM's identity and instance view, nothing else."""
        return {
            "id": self.resource_id,
            "name": self.name,
            "type": "Microsoft.Compute/virtualMachines",
            "tags": None,
            "properties": {
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
        # (namespace, metric) -> lower-cased resource id -> dimensions -> [(time, value)]
        self.series: dict[tuple[str, str], dict[str, dict[Dimensions, list[Point]]]] = {}
        self.requests.clear()

    def add(self, vm: AzureVm) -> AzureVm:
        self.vms[vm.name] = vm
        return vm

    def put(
        self,
        namespace: str,
        metric: str,
        vm: AzureVm,
        points: list[Point],
        dimensions: dict[str, str] | None = None,
    ) -> None:
        """Raw points of one series of ``vm``; ``dimensions`` as its publisher writes them
        (Telegraf: each tag of the input, such as nvidia_smi's GPU ``index``)."""
        key = tuple(sorted((dimensions or {}).items()))
        by_resource = self.series.setdefault((namespace.lower(), metric), {})
        by_resource.setdefault(vm.resource_id.lower(), {}).setdefault(key, []).extend(points)

    def list_all(self, request: Request, match: re.Match[str]) -> Reply:
        refused = check_vm_listing(request)
        if refused is not None:
            return refused
        if request.query.get("statusOnly") == ["true"]:
            return 200, {"value": [vm.status_only() for vm in self.vms.values()]}, {}
        return 200, {"value": [vm.model() for vm in self.vms.values()]}, {}

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
        return 200, vm.model(), {}

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

    def _series_reply(
        self, query: dict[str, str], resource_ids: set[str], *, with_owner: bool
    ) -> Reply:
        """The Metrics API body for ``resource_ids``: per resource and metric, one series per
        combination of the dimensions ``$filter`` splits by (``name eq '*'``), aggregated
        over every other dimension (rule metrics_dimension_split); only the aggregations
        asked for, in resource-id order (no ``orderby``: the service promises no order, so
        the fake does not sort busiest first), cut at ``top``. A combination without a
        point in the timespan is left out (the pessimistic reading: a silent GPU is not
        named at all)."""
        namespace = query["metricnamespace"].lower()
        names = query["metricnames"].split(",")
        known = {
            rid for (ns, _), series in self.series.items() if ns == namespace for rid in series
        }
        if not known & resource_ids:
            message = f"Failed to find metric configuration for provider: {namespace}"
            return 400, {"error": {"code": "BadRequest", "message": message}}, {}
        kinds = [a.strip().lower() for a in query.get("aggregation", "average").split(",")]
        for kind in kinds:
            if kind not in AGGREGATIONS:
                message = f"Invalid aggregation {kind}"
                return 400, {"error": {"code": "BadRequest", "message": message}}, {}
        terms = {k: v for k, v in _filter_terms(query.get("$filter", "")).items()
                 if k != RESOURCE_ID}  # fmt: skip
        top = int(query.get("top", 10))
        start_text, end_text = query["timespan"].split("/")
        start, end = datetime.fromisoformat(start_text), datetime.fromisoformat(end_text)
        value = []
        for name in names:
            by_resource = self.series.get((namespace, name), {})
            dimensions = {k.lower() for rid, series in by_resource.items()
                          if rid in resource_ids for key in series for k, _ in key}  # fmt: skip
            unknown = sorted(set(terms) - dimensions)
            if unknown:
                return arm_error("metrics_dimension_split", dimension=unknown[0])
            timeseries: list[dict[str, Any]] = []
            for resource_id, series in sorted(by_resource.items()):
                if resource_id not in resource_ids:
                    continue
                for split, points in _split(series, terms, start, end).items():
                    data = [
                        {"timeStamp": rfc3339(t),
                         **{kind: AGGREGATIONS[kind](values) for kind in kinds}}
                        for t, values in sorted(points.items())
                    ]  # fmt: skip
                    metadata = [_metadata(k, v) for k, v in split]
                    if with_owner:
                        metadata.insert(0, _metadata(RESOURCE_ID, resource_id))
                    timeseries.append({"metadatavalues": metadata, "data": data})
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
        }
        return 200, body, {}

    def metrics(self, request: Request, match: re.Match[str]) -> Reply:
        """``Metrics_ListAtSubscriptionScope``: every VM of the region, split by resource id
        (``$filter`` on ``Microsoft.ResourceId``); platform namespaces only (rule
        metrics_custom_namespace_at_subscription_scope)."""
        query = {k: v[0] for k, v in request.query.items()}
        if "region" not in query:
            return 400, {"error": {"code": "BadRequest",
                                   "message": "Missing required region params"}}, {}  # fmt: skip
        namespace = query["metricnamespace"]
        if not namespace.lower().startswith("microsoft."):
            return arm_error("metrics_custom_namespace_at_subscription_scope", namespace=namespace)
        wanted = _resource_filter(query["$filter"])
        in_region = {
            vm.resource_id.lower() for vm in self.vms.values() if vm.location == query["region"]
        }
        chosen = in_region if wanted is None else in_region & wanted
        status, body, headers = self._series_reply(query, chosen, with_owner=True)
        if status == 200:
            body["resourceregion"] = query["region"]
        return status, body, headers

    def resource_metrics(self, request: Request, match: re.Match[str]) -> Reply:
        """``Metrics_List`` at one VM's scope (custom namespaces included)."""
        query = {k: v[0] for k, v in request.query.items()}
        vm = self.vms.get(match["name"])
        if vm is None:
            return 404, {"error": {"code": "ResourceNotFound", "message": match["name"]}}, {}
        return self._series_reply(query, {vm.resource_id.lower()}, with_owner=False)

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
            ("GET", vm + "/providers/[Mm]icrosoft.[Ii]nsights/metrics", self.resource_metrics),
            ("GET", "/metadata/instance/compute", self.instance_metadata),
        ]


def _filter_terms(text: str) -> dict[str, set[str] | None]:
    """A metrics ``$filter`` as {dimension (lower case): the values asked for, ``None`` for
    ``'*'``}: ``and`` joins dimensions, ``or`` only values of one dimension (the spec's
    FilterParameter text); anything else is a test's mistake."""
    wanted: dict[str, set[str] | None] = {}
    for group in re.split(r"\s+and\s+", text.strip(), flags=re.IGNORECASE) if text.strip() else []:
        names, values = set(), set()
        for term in re.split(r"\s+or\s+", group.strip(), flags=re.IGNORECASE):
            found = re.fullmatch(r"([A-Za-z][\w.]*) eq '([^']*)'", term.strip())
            assert found, f"unsupported $filter {text!r}"
            names.add(found[1].lower())
            values.add(found[2])
        assert len(names) == 1, f"'or' separates two dimensions in $filter {text!r}"
        wanted[names.pop()] = None if "*" in values else values
    return wanted


def _resource_filter(text: str) -> set[str] | None:
    """The resource IDs a metrics ``$filter`` asks for; ``None`` for all (``eq '*'``)."""
    terms = _filter_terms(text)
    assert set(terms) == {RESOURCE_ID}, f"unsupported $filter {text!r}"
    ids = terms[RESOURCE_ID]
    return None if ids is None else {i.lower() for i in ids}


def _split(
    series: dict[Dimensions, list[Point]],
    terms: dict[str, set[str] | None],
    start: datetime,
    end: datetime,
) -> dict[Dimensions, dict[datetime, list[float]]]:
    """The points of one resource's series in ``[start, end]`` grouped by the values of the
    dimensions ``terms`` name (series whose value is not asked for are left out); the
    values at one timestamp of a group are aggregated together by the caller."""
    groups: dict[Dimensions, dict[datetime, list[float]]] = {}
    for key, points in series.items():
        values = {k.lower(): v for k, v in key}
        if any(n not in values or (w is not None and values[n] not in w)
               for n, w in terms.items()):  # fmt: skip
            continue
        split = tuple((n, values[n]) for n in sorted(terms))
        for t, v in points:
            if start <= t <= end:
                groups.setdefault(split, {}).setdefault(t, []).append(v)
    return groups


def _metadata(name: str, value: str) -> dict[str, Any]:
    """One ``metadatavalues`` entry: the service names the dimension in lower case
    (rules metrics_resource_id_dimension and metrics_dimension_split)."""
    return {"name": {"value": name.lower(), "localizedValue": name.lower()}, "value": value}


def _day(text: str) -> str:
    """The date of an ARM timestamp (``2026-12-01T00:00:00Z`` and ``2026-12-01`` alike)."""
    return text[:10]


class ConsumptionFake:
    """``{scope}/providers/Microsoft.Consumption/budgets[/{name}]`` (PUT, GET, list, DELETE);
    a budget's start date must be the first of a month and never changes once created."""

    def __init__(self) -> None:
        self.budgets: dict[str, dict[str, Any]] = {}

    def __call__(self, method: str, path: str, query, body):
        marker = "/providers/Microsoft.Consumption/budgets"
        if marker not in path:
            return 404, {"error": {"code": "NotFound", "message": path}}
        scope, _, name = path.partition(marker)
        name = name.strip("/")
        if not name:
            items = [b for key, b in self.budgets.items() if key.startswith(scope + marker)]
            return 200, {"value": items}
        key = f"{scope}{marker}/{name}"
        if method == "PUT":
            created = key not in self.budgets
            notifications = body["properties"].get("notifications") or {}
            if len(notifications) > RULES["budget_notifications"]["limit"]:
                status, error, _ = arm_error("budget_notifications")
                return status, error
            start = body["properties"]["timePeriod"]["startDate"]
            if created and not re.fullmatch(r"\d{4}-\d{2}-01T00:00:00(\.0+)?Z?", start):
                status, error, _ = arm_error("budget_start_date_first_of_month")
                return status, error
            if not created:
                before = self.budgets[key]["properties"]["timePeriod"]["startDate"]
                if _day(start) != _day(before):
                    status, error, _ = arm_error("budget_start_date_immutable")
                    return status, error
            self.budgets[key] = {
                **body,
                "id": key,
                "name": name,
                "type": "Microsoft.Consumption/budgets",
                "eTag": "e1",
            }
            return (201 if created else 200), self.budgets[key]
        if key not in self.budgets:
            return 404, {"error": {"code": "NotFound", "message": "budget not found"}}
        if method == "DELETE":
            del self.budgets[key]
            return 200, {}
        return 200, self.budgets[key]


def gpu_count(vm: AzureVm) -> int:
    """The GPUs of ``vm`` as the reaper counts them: the price tables' count, else one for an
    N-series size."""
    from costguard.pricing.tables import load_catalog
    from costguard.reaper.fleet import PriceBook

    known = PriceBook(load_catalog()).gpus("azure", vm.size)
    return known[1] if known else 1


def put_gpu(server: AzureServer, vm: AzureVm, index: int, points: list[Point]) -> None:
    """One GPU's ``utilization_gpu`` series as Telegraf's nvidia_smi input and azure_monitor
    output publish it: every tag a dimension (``index``, ``uuid``, ``name``, ``pstate``...)."""
    from costguard.reaper import azure

    tags = {"host": vm.name, "index": str(index), "name": "NVIDIA A100 80GB PCIe",
            "uuid": f"GPU-{vm.name}-{index}", "pstate": "P0"}  # fmt: skip
    server.put(azure.GPU_NAMESPACE, azure.GPU_METRIC, vm, points, tags)


def seed_vm(
    server: AzureServer, vm: AzureVm, now: datetime, *, gpu: float | None = 1.0, cpu: float = 1.5
) -> None:
    """Azure Monitor series for ``vm`` up to ``now``: one per GPU (``None``: no agent), CPU
    in percent, and a trickle of network."""
    from costguard.reaper import azure

    if gpu is not None:
        for index in range(gpu_count(vm)):
            put_gpu(server, vm, index, every_minute(now, gpu))
    server.put(azure.VM_NAMESPACE, azure.CPU_METRIC, vm, every_minute(now, cpu))
    # Bytes per one-minute grain: 6 kB/min each way is far below 1 Mbit/s.
    server.put(azure.VM_NAMESPACE, azure.NETWORK_IN_METRIC, vm, every_minute(now, 6000.0))
    server.put(azure.VM_NAMESPACE, azure.NETWORK_OUT_METRIC, vm, every_minute(now, 6000.0))
