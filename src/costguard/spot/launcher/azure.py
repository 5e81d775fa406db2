"""Azure: one virtual machine per attempt, through ``virtualMachines.createOrUpdate``.

The VM is created in one PUT with everything it needs: ``priority=Spot``,
``evictionPolicy=Delete`` (or ``Deallocate`` if asked) and ``billingProfile.maxPrice``
(``-1``: pay up to the pay-as-you-go price, never evicted for price; or the cap given),
unless the offer is on-demand; the job's tags; the boot script as base64 ``customData``
(cloud-init runs it); a user-assigned managed identity, which is what reaches the
checkpoint container; an SSH public key (Azure wants one for Linux; no password is set);
and its NIC and OS disk declared inline (``networkInterfaceConfigurations``) with
``deleteOption=Delete``, so no network SDK is needed and nothing is left behind. The call
is a long-running operation, polled (``Azure-AsyncOperation``) for a bounded time.

Eviction: Azure records no eviction reason on the VM itself. A Spot VM with the
``Delete`` policy disappears when evicted, one with ``Deallocate`` is deallocated; so a
Spot VM this launcher did not delete that is gone, being deleted or deallocated is
reported as :attr:`State.PREEMPTED` (the detail says it is inferred), and a regular VM in
that state as :attr:`State.MISSING` / :attr:`State.STOPPED`.

Options: ``subscription`` and ``resource_group`` (required unless the launcher has them),
``image`` (``publisher:offer:sku:version`` or an image resource id), ``subnet`` (subnet
resource id), ``identity`` (user-assigned identity resource id), ``ssh_public_key``,
``admin_username`` (default ``azureuser``), ``disk_gb`` (default 100), ``disk_type``
(default ``Premium_LRS``), ``eviction_policy``, ``max_price`` (USD/h; ``--max-price``
reaches ``billingProfile.maxPrice`` the same way), plus those of
:mod:`costguard.spot.bootstrap`.

Zones: :meth:`AzureLauncher.zones` reads the VM size's zones in the region from the
Resource SKUs API (``locationInfo[].zones``, less the zones a ``Zone`` restriction
names for the subscription). A size the API lists without zones (a region without
Availability Zones) gets none, and Azure places it regionally.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

from costguard.clouds import READ_TIMEOUT_S, require
from costguard.clouds import azure as azure_clouds
from costguard.errors import CostguardError, InputError
from costguard.settings import Settings
from costguard.spot import bootstrap
from costguard.spot.launcher.base import (
    ATTEMPT_TAG,
    JOB_TAG,
    CapacityError,
    Handle,
    LaunchSpec,
    Market,
    Offer,
    State,
    Status,
)

#: The most seconds one create or delete is waited for.
OPERATION_TIMEOUT_S = READ_TIMEOUT_S * 10
#: The most SKU entries read from one Resource SKUs listing (a region lists a few
#: thousand: VM sizes, disks, and more).
MAX_SKUS = 20_000
#: The Network API version of the NIC declared inside the VM.
NETWORK_API_VERSION = "2022-11-01"
#: ARM error codes of a create that another zone, region or market may not hit.
CAPACITY_CODES = (
    "SkuNotAvailable",
    "AllocationFailed",
    "ZonalAllocationFailed",
    "OverconstrainedAllocationRequest",
    "OverconstrainedZonalAllocationRequest",
    "QuotaExceeded",
    "OperationNotAllowed",
    "SpotMaxPriceTooLow",
)
_SUBSCRIPTION = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
_GROUP = re.compile(r"^[-\w._()]{1,90}$")
_SUBNET = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Network/"
    r"virtualNetworks/[^/]+/subnets/[^/]+$",
    re.IGNORECASE,
)
_IDENTITY = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.ManagedIdentity/"
    r"userAssignedIdentities/[^/]+$",
    re.IGNORECASE,
)
_URN = re.compile(r"^[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+$")
_IMAGE_ID = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Compute/", re.IGNORECASE
)
_SSH_KEY = re.compile(r"^(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp\d+) [A-Za-z0-9+/=]+( .*)?$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_CODE = re.compile(r"\b(" + "|".join(CAPACITY_CODES) + r")\b")


def image_reference(image: str) -> dict[str, str]:
    """An ``imageReference`` from a URN (as ``az vm create --image`` takes) or a resource id.

    >>> image_reference("microsoft-dsvm:ubuntu-hpc:2204:latest")["offer"]
    'ubuntu-hpc'
    >>> image_reference("/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/i")
    {'id': '/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/i'}
    """
    if _IMAGE_ID.match(image):
        return {"id": image}
    publisher, offer, sku, version = image.split(":")
    return {"publisher": publisher, "offer": offer, "sku": sku, "version": version}


def classify(statuses: list[str], spot: bool, ours: bool) -> State:
    """Instance view status codes (``ProvisioningState/...``, ``PowerState/...``) as a
    launcher :class:`State`; ``ours``: this launcher deleted the VM.

    >>> classify(["ProvisioningState/succeeded", "PowerState/running"], True, False)
    <State.RUNNING: 'running'>
    >>> classify(["ProvisioningState/creating"], True, False)
    <State.PENDING: 'pending'>
    >>> classify(["ProvisioningState/succeeded", "PowerState/deallocated"], True, False)
    <State.PREEMPTED: 'preempted'>
    >>> classify(["ProvisioningState/deleting"], False, False)
    <State.TERMINATED: 'terminated'>
    """
    codes = {c.lower() for c in statuses}
    power = next((c.split("/", 1)[1] for c in codes if c.startswith("powerstate/")), "")
    if "provisioningstate/deleting" in codes:
        return State.PREEMPTED if spot and not ours else State.TERMINATED
    if "provisioningstate/failed" in codes and power != "running":
        return State.TERMINATED
    if power == "running":
        return State.RUNNING
    if power in ("deallocating", "deallocated"):
        return State.PREEMPTED if spot and not ours else State.STOPPED
    if power in ("stopping", "stopped"):
        return State.STOPPED
    return State.PENDING


def _error_code(exc: BaseException) -> str:
    error = getattr(exc, "error", None)
    code = str(getattr(error, "code", "") or "")
    if code in CAPACITY_CODES:
        return code
    found = _CODE.search(str(getattr(exc, "message", "") or exc))
    return found[1] if found else code


class AzureLauncher:
    """Virtual machines in one subscription and resource group (the launcher's, or each
    spec's options). ``credential`` and ``client_options`` (azure-core pipeline options)
    go to :func:`costguard.clouds.azure.client`; ``compute`` is a ready client. Example::

        launcher = AzureLauncher(Settings.load(), subscription_id=sub, resource_group="ml")
    """

    provider = "azure"

    def __init__(
        self,
        settings: Settings,
        *,
        subscription_id: str = "",
        resource_group: str = "",
        credential: Any = None,
        client_options: Mapping[str, Any] | None = None,
        compute: Any = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.subscription_id = subscription_id
        self.resource_group = resource_group
        self._credential = credential
        self._options = dict(client_options or {})
        self._clients: dict[str, Any] = {subscription_id: compute} if compute is not None else {}
        self._environ = environ
        #: VMs this launcher deleted: their absence is not an eviction.
        self._deleted: set[tuple[str, str, str]] = set()

    def _compute(self, subscription_id: str) -> Any:
        if subscription_id not in self._clients:
            if self._credential is None:
                self._credential = azure_clouds.default_credential()
            self._clients[subscription_id] = azure_clouds.client(
                "azure.mgmt.compute",
                "ComputeManagementClient",
                subscription_id,
                self.settings,
                self._credential,
                **self._options,
            )
        return self._clients[subscription_id]

    # ------------------------------------------------------------------ check

    def _where(self, spec: LaunchSpec) -> tuple[str, str]:
        subscription = spec.options.get("subscription", "").strip() or self.subscription_id
        group = spec.options.get("resource_group", "").strip() or self.resource_group
        if not subscription:
            msg = "launching on azure needs the subscription option"
            raise InputError(msg, hint="subscription=$(az account show --query id -o tsv)")
        if not _SUBSCRIPTION.match(subscription):
            msg = f"not an Azure subscription id: {subscription!r}"
            raise InputError(msg, hint="the GUID `az account show --query id` prints")
        if not group:
            msg = "launching on azure needs the resource_group option"
            raise InputError(msg, hint="e.g. resource_group=costguard-jobs (az group create)")
        if not _GROUP.match(group):
            msg = f"not a resource group name: {group!r}"
            raise InputError(msg, hint="letters, digits, -, _, ., ( and ), at most 90")
        return subscription, group

    def check(self, spec: LaunchSpec) -> None:
        """Validate every option offline (no Azure call) and render the boot script once."""
        self._where(spec)
        image = bootstrap.option(
            spec,
            "image",
            self.provider,
            "an image with the NVIDIA driver, e.g. image=microsoft-dsvm:ubuntu-hpc:2204:latest",
        )
        if not (_URN.match(image) or _IMAGE_ID.match(image)):
            msg = f"the image option must be publisher:offer:sku:version or an id, not {image!r}"
            raise InputError(msg, hint="az vm image list --publisher microsoft-dsvm --all")
        subnet = bootstrap.option(
            spec,
            "subnet",
            self.provider,
            "the subnet's resource id: az network vnet subnet show ... --query id",
        )
        if not _SUBNET.match(subnet):
            msg = "the subnet option must be a subnet resource id"
            raise InputError(msg, hint="/subscriptions/…/virtualNetworks/VNET/subnets/SUBNET")
        identity = bootstrap.option(
            spec,
            "identity",
            self.provider,
            "the VM reaches the checkpoint container with a user-assigned managed identity, "
            "never with keys: az identity create -g GROUP -n costguard-instance --query id",
        )
        if not _IDENTITY.match(identity):
            msg = "the identity option must be a user-assigned identity resource id"
            raise InputError(
                msg, hint="…/providers/Microsoft.ManagedIdentity/userAssignedIdentities/NAME"
            )
        key = bootstrap.option(
            spec,
            "ssh_public_key",
            self.provider,
            'Azure wants one for a Linux VM: ssh_public_key="$(cat ~/.ssh/id_ed25519.pub)"',
        )
        if not _SSH_KEY.match(key):
            msg = "the ssh_public_key option is not an OpenSSH public key"
            raise InputError(msg, hint="the one line of ~/.ssh/id_ed25519.pub (never the key)")
        user = spec.options.get("admin_username", "azureuser")
        if not _USER.match(user) or user in ("root", "admin", "administrator"):
            msg = f"the admin_username option cannot be {user!r}"
            raise InputError(msg, hint="e.g. admin_username=azureuser")
        policy = spec.options.get("eviction_policy", "Delete")
        if policy not in ("Delete", "Deallocate"):
            msg = f"the eviction_policy option must be Delete or Deallocate, not {policy!r}"
            raise InputError(msg, hint="Delete leaves nothing behind to pay for")
        self._max_price(spec)
        bootstrap.int_option(spec, "disk_gb", 100, 30, 4095)
        bootstrap.render(spec, 1, self.provider, environ=self._environ)

    @staticmethod
    def _max_price(spec: LaunchSpec) -> float:
        """``billingProfile.maxPrice``: ``--max-price`` or the ``max_price`` option; ``-1``
        (up to the pay-as-you-go price, never evicted for price) when neither is given."""
        cap = bootstrap.max_price(spec)
        if cap is None:
            return -1
        if cap != round(cap, 5):
            msg = f"Azure takes a spot price cap with at most 5 decimals, not {cap}"
            raise InputError(msg, hint=f"e.g. --max-price {round(cap, 5)}")
        return float(cap)  # ARM takes a JSON number with up to 5 decimals

    # ----------------------------------------------------------------- launch

    def request(self, offer: Offer, spec: LaunchSpec, attempt: int) -> dict[str, Any]:
        """The ARM ``virtualMachines`` body of one attempt (no call made): for dry runs."""
        self.check(spec)
        if offer.provider != self.provider:
            msg = f"an offer on {offer.provider} cannot be launched on Azure"
            raise InputError(msg, hint="pick an Azure offer")
        options = spec.options
        name = bootstrap.resource_name(spec.job_id, attempt, 64)
        user = options.get("admin_username", "azureuser")
        script = bootstrap.render(spec, attempt, self.provider, environ=self._environ)
        properties: dict[str, Any] = {
            "hardwareProfile": {"vmSize": offer.instance_type},
            "storageProfile": {
                "imageReference": image_reference(options["image"].strip()),
                "osDisk": {
                    "createOption": "FromImage",
                    "deleteOption": "Delete",
                    "diskSizeGB": bootstrap.int_option(spec, "disk_gb", 100, 30, 4095),
                    "managedDisk": {"storageAccountType": options.get("disk_type", "Premium_LRS")},
                },
            },
            "osProfile": {
                "computerName": name,
                "adminUsername": user,
                "customData": base64.b64encode(script.encode()).decode(),
                "linuxConfiguration": {
                    "disablePasswordAuthentication": True,
                    "ssh": {
                        "publicKeys": [
                            {
                                "path": f"/home/{user}/.ssh/authorized_keys",
                                "keyData": options["ssh_public_key"].strip(),
                            }
                        ]
                    },
                },
            },
            "networkProfile": {
                "networkApiVersion": NETWORK_API_VERSION,
                "networkInterfaceConfigurations": [
                    {
                        "name": f"{name}-nic",
                        "properties": {
                            "primary": True,
                            "deleteOption": "Delete",
                            "ipConfigurations": [
                                {
                                    "name": "ipconfig1",
                                    "properties": {"subnet": {"id": options["subnet"].strip()}},
                                }
                            ],
                        },
                    }
                ],
            },
        }
        if offer.market is Market.SPOT:
            properties["priority"] = "Spot"
            properties["evictionPolicy"] = options.get("eviction_policy", "Delete")
            properties["billingProfile"] = {"maxPrice": self._max_price(spec)}
        else:
            properties["priority"] = "Regular"
        body: dict[str, Any] = {
            "location": offer.region,
            "tags": spec.tags(attempt),
            "identity": {
                "type": "UserAssigned",
                "userAssignedIdentities": {options["identity"].strip(): {}},
            },
            "properties": properties,
        }
        if offer.zone:
            body["zones"] = [offer.zone.rsplit("-", 1)[-1]]  # "eastus-1" or "1" -> "1"
        return body

    def launch(self, offer: Offer, spec: LaunchSpec, attempt: int) -> Handle:
        """The PUT, polled until it succeeds; a :class:`CapacityError` when the place is
        full. A retried attempt PUTs the same VM again, which ARM treats as an update."""
        body = self.request(offer, spec, attempt)
        subscription, group = self._where(spec)
        name = body["properties"]["osProfile"]["computerName"]
        action = f"creating {name} in {offer.region}"
        compute = self._compute(subscription)
        try:
            poller = compute.virtual_machines.begin_create_or_update(group, name, body)
            poller.result(timeout=OPERATION_TIMEOUT_S)
            if not poller.done():
                msg = f"{action} did not finish within {OPERATION_TIMEOUT_S} s"
                raise CostguardError(msg, hint="costguard jobs status shows what came of it")
        except azure_clouds.errors() as exc:
            code = _error_code(exc)
            if code in CAPACITY_CODES:
                text = f"Azure has no room for {offer.instance_type} in {offer.place}: {code}"
                raise CapacityError(text, place=offer.place, code=code) from None
            raise azure_clouds.translate(exc, action) from None
        return Handle(
            provider=self.provider,
            region=offer.region,
            instance_id=name,
            zone=offer.zone,
            extra={
                "subscription": subscription,
                "resource_group": group,
                "priority": body["properties"]["priority"],
                "attempt": str(attempt),
            },
        )

    # ------------------------------------------------------------------ zones

    def zones(self, region: str, instance_type: str = "") -> list[str]:
        """The Availability Zones where ``instance_type`` may run in ``region`` for this
        subscription (Resource SKUs API, one location-filtered listing, bounded pages).

        None without a size (the zones are a property of the size), for a size the API
        does not list there, or without a subscription to ask in.
        """
        if not instance_type or not self.subscription_id:
            return []
        compute = self._compute(self.subscription_id)
        wanted = instance_type.lower()
        zones: set[str] = set()
        try:
            pager = compute.resource_skus.list(filter=f"location eq '{region}'")
            for number, sku in enumerate(pager):
                if number >= MAX_SKUS:
                    break
                if str(sku.resource_type or "").lower() != "virtualmachines":
                    continue
                if str(sku.name or "").lower() != wanted:
                    continue
                for info in sku.location_info or []:
                    if str(info.location or "").lower() == region.lower():
                        zones.update(str(z) for z in info.zones or [])
                for restriction in sku.restrictions or []:
                    kind = str(getattr(restriction.type, "value", restriction.type) or "")
                    if kind.lower() == "zone" and restriction.restriction_info is not None:
                        zones.difference_update(restriction.restriction_info.zones or [])
        except azure_clouds.errors() as exc:
            raise azure_clouds.translate(exc, f"listing the zones of {region}") from None
        return sorted(zones)

    # ----------------------------------------------------------------- status

    def status(self, handle: Handle) -> Status:
        """``virtualMachines.get`` with its instance view."""
        core = require("azure.core.exceptions", azure_clouds.EXTRA)
        subscription, group = handle.extra["subscription"], handle.extra["resource_group"]
        spot = handle.extra.get("priority", "").lower() == "spot"
        ours = (subscription, group.lower(), handle.instance_id.lower()) in self._deleted
        try:
            vm = self._compute(subscription).virtual_machines.get(
                group, handle.instance_id, expand="instanceView"
            )
        except core.ResourceNotFoundError:
            if spot and not ours:
                detail = "the Spot VM is gone: evicted (Azure deletes an evicted Spot VM)"
                return Status(handle, State.PREEMPTED, detail)
            return Status(handle, State.MISSING, "Azure no longer knows the VM")
        except azure_clouds.errors() as exc:
            raise azure_clouds.translate(exc, f"reading {handle.instance_id}") from None
        view = vm.instance_view
        statuses = list(view.statuses or []) if view is not None else []
        codes = [str(s.code or "") for s in statuses]
        if vm.provisioning_state and not any(c.startswith("ProvisioningState/") for c in codes):
            codes.append(f"ProvisioningState/{vm.provisioning_state.lower()}")
        state = classify(codes, spot, ours)
        detail = "; ".join(str(s.display_status or s.code) for s in statuses)
        if state is State.PREEMPTED:
            detail = f"inferred eviction of a Spot VM ({detail})"
        return Status(handle, state, detail, launched_at=vm.time_created)

    # -------------------------------------------------------------- terminate

    def terminate(self, handle: Handle) -> None:
        """``virtualMachines.delete`` (its NIC and OS disk go with it), polled; a VM that is
        already gone is fine."""
        core = require("azure.core.exceptions", azure_clouds.EXTRA)
        subscription, group = handle.extra["subscription"], handle.extra["resource_group"]
        self._deleted.add((subscription, group.lower(), handle.instance_id.lower()))
        action = f"deleting {handle.instance_id}"
        try:
            poller = self._compute(subscription).virtual_machines.begin_delete(
                group, handle.instance_id
            )
            poller.result(timeout=OPERATION_TIMEOUT_S)
        except core.ResourceNotFoundError:
            return
        except azure_clouds.errors() as exc:
            raise azure_clouds.translate(exc, action) from None
        if not poller.done():
            msg = f"{action} did not finish within {OPERATION_TIMEOUT_S} s"
            raise CostguardError(msg, hint="check it with az vm show; costguard reap finds it too")

    # ------------------------------------------------------------------- find

    def find(self, job_id: str) -> list[Handle]:
        """VMs tagged ``costguard:job=<job_id>`` in the launcher's resource group that are
        not being deleted, deallocated or stopped."""
        if not (self.subscription_id and self.resource_group):
            msg = "finding the VMs of a job on azure needs a subscription and resource group"
            raise InputError(msg, hint="give the launcher the ones the job runs in")
        compute = self._compute(self.subscription_id)
        found = []
        try:
            for vm in compute.virtual_machines.list(self.resource_group, expand="instanceView"):
                tags = {k.lower(): v for k, v in (vm.tags or {}).items()}
                if tags.get(JOB_TAG) != job_id:
                    continue
                view = vm.instance_view
                codes = [str(s.code or "") for s in (view.statuses or [])] if view else []
                state = classify(codes, spot=False, ours=False)
                if state not in (State.PENDING, State.RUNNING):
                    continue
                zones = list(vm.zones or [])
                found.append(
                    Handle(
                        provider=self.provider,
                        region=vm.location,
                        instance_id=vm.name,
                        zone=zones[0] if zones else "",
                        extra={
                            "subscription": self.subscription_id,
                            "resource_group": self.resource_group,
                            "priority": str(
                                getattr(vm.priority, "value", vm.priority) or "Regular"
                            ),
                            "attempt": tags.get(ATTEMPT_TAG, ""),
                        },
                    )
                )
        except azure_clouds.errors() as exc:
            raise azure_clouds.translate(exc, f"listing the VMs of {job_id}") from None
        return found
