"""Azure: one virtual machine per attempt, through ``virtualMachines.createOrUpdate``.

It covers the life of an attempt's VM on ``Microsoft.Compute`` (where it may go, its
body, create, read, delete, find), with the refusals ARM answers handled next to the
calls that meet them.

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

Options (declared in :data:`OPTIONS`): ``subscription`` and ``resource_group`` (required
unless the launcher has them), ``image`` (``publisher:offer:sku:version`` or an image
resource id), ``subnet`` (subnet resource id), ``subnet_<region>`` (the subnet for one
region, e.g. ``subnet_westus``: subnets are regional, so a job that may move between
regions names one per region), ``identity`` (user-assigned identity resource id),
``ssh_public_key``, ``admin_username`` (default ``azureuser``), ``disk_gb`` (default 100),
``disk_type`` (default ``Premium_LRS``), ``eviction_policy``, ``max_price`` (USD/h;
``--max-price`` reaches ``billingProfile.maxPrice`` the same way), plus those of
:mod:`costguard.spot.bootstrap`.

Zones: :meth:`AzureLauncher.zones` reads the VM size's zones in the region from the
Resource SKUs API (``locationInfo[].zones``, less the zones a ``Zone`` restriction
names for the subscription). A size the API lists without zones (a region without
Availability Zones) gets none, and Azure places it regionally. A ``Location`` restriction
(the size is not offered to the subscription in the region at all) makes a launch there a
:class:`CapacityError` before any PUT, so recovery moves on.

A gang (``--nodes N``, :meth:`AzureLauncher.launch_gang`) is N VMs PUT together in one
zone and the job's proximity placement group, their NICs in the job's network security
group (the rendezvous and collective ports from the job's application security group only);
if one fails, those made are deleted (NICs and disks with them). Node 0's private address
is read from its NIC and each VM is told its rank in its tags (IMDS ``tagsList``).
:meth:`AzureLauncher.release` deletes the groups.

A retried attempt whose VM exists already is adopted, not PUT again: ``customData`` and
``adminUsername`` cannot change after creation (``PropertyChangeNotAllowed``), and the boot
script of a retry need not be byte-identical.
"""

from __future__ import annotations

import base64
import copy
import functools
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from costguard.clouds import READ_TIMEOUT_S, require
from costguard.clouds import azure as azure_clouds
from costguard.errors import CostguardError, InputError
from costguard.pricing.catalog import Market
from costguard.retry import parse_retry_after
from costguard.settings import Settings
from costguard.spot import bootstrap, node
from costguard.spot.launcher import base
from costguard.spot.launcher.base import (
    CapacityError,
    Handle,
    LaunchSpec,
    Offer,
    State,
    Status,
    ThrottledError,
)
from costguard.spot.launcher.options import Option, Options
from costguard.tags import ATTEMPT_TAG, JOB_TAG, OWNER_TAG, check_job_id

#: The most seconds one create or delete is waited for.
OPERATION_TIMEOUT_S = READ_TIMEOUT_S * 10
#: The waits between deletes that ARM refuses because what they delete is still in use or
#: busy (a VM's NIC, deleted after it, still in a security group; a VM still in a
#: proximity placement group; another operation on the VM in progress): about a minute in
#: all, then what is left is named with the command that deletes it.
DELETE_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0)
#: ARM's codes of a delete refused for now (a dependent resource not gone yet, an
#: operation in progress), besides any HTTP 409 and the ``InUse...CannotBeDeleted`` family.
BUSY_CODES = ("AnotherOperationInProgress", "Conflict", "OperationNotAllowed", "NicInUse",
              "RetryableError")  # fmt: skip
#: The most SKU entries read from one Resource SKUs listing (a region lists a few
#: thousand: VM sizes, disks, and more).
MAX_SKUS = 20_000
#: The most pages of the subscription's VM status listing one poll of many VMs reads
#: (:meth:`AzureLauncher.statuses`); the VMs not seen by then are read one by one.
LIST_PAGES = 10
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
_URN = re.compile(r"[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+")
_IMAGE_ID = re.compile(
    r"/subscriptions/[^/\s]+/resourceGroups/[^/\s]+/providers/Microsoft\.Compute/\S+",
    re.IGNORECASE,
)
#: ``osProfile.adminUsername`` values ARM refuses (computeRPCommon.json, OSProfile:
#: "Disallowed values"), compared case-insensitively.
DISALLOWED_USERS = frozenset((
    "administrator", "admin", "user", "user1", "test", "user2", "test1", "user3", "admin1",
    "1", "123", "a", "actuser", "adm", "admin2", "aspnet", "backup", "console", "david",
    "guest", "john", "owner", "root", "server", "sql", "support", "support_388945a0", "sys",
    "test2", "test3", "user4", "user5",
))  # fmt: skip
_SUBNET_OPTION = Option(
    "subnet",
    "the subnet's resource id: az network vnet subnet show ... --query id "
    "(or subnet_<region>=... for each region the job may run in)",
    example=(
        "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/net/providers/"
        "Microsoft.Network/virtualNetworks/vnet/subnets/jobs"
    ),
    pattern=re.compile(
        r"/subscriptions/[^/\s]+/resourceGroups/[^/\s]+/providers/Microsoft\.Network/"
        r"virtualNetworks/[^/\s]+/subnets/[^/\s]+",
        re.IGNORECASE,
    ),
    invalid="the {name} option must be a subnet resource id",
    hint="/subscriptions/…/virtualNetworks/VNET/subnets/SUBNET",
)
#: The options this launcher reads (the boot script's besides), in the order checked.
#: ``subnet`` or a ``subnet_<region>`` is required besides (see :meth:`AzureLauncher.check`).
OPTIONS = Options(
    Option(
        "subscription",
        "subscription=$(az account show --query id -o tsv)",
        example="00000000-0000-0000-0000-000000000000",
        required=True,
        pattern=re.compile(r"[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}"),
        invalid="not an Azure subscription id: {value!r}",
        hint="the GUID `az account show --query id` prints",
    ),
    Option(
        "resource_group",
        "e.g. resource_group=costguard-jobs (az group create)",
        example="costguard-jobs",
        required=True,
        pattern=re.compile(r"[-\w._()]{1,90}"),
        invalid="not a resource group name: {value!r}",
        hint="letters, digits, -, _, ., ( and ), at most 90",
    ),
    Option(
        "image",
        "an image with the NVIDIA driver, e.g. image=microsoft-dsvm:ubuntu-hpc:2204:latest",
        example="microsoft-dsvm:ubuntu-hpc:2204:latest",
        required=True,
        pattern=re.compile(f"{_URN.pattern}|{_IMAGE_ID.pattern}", re.IGNORECASE),
        invalid="the image option must be publisher:offer:sku:version or an id, not {value!r}",
        hint="az vm image list --publisher microsoft-dsvm --all",
    ),
    replace(
        _SUBNET_OPTION,
        name="subnet_*",
        help="the subnet for one region (subnet_westus=...): subnets are regional",
    ),
    _SUBNET_OPTION,
    Option(
        "identity",
        "the VM reaches the checkpoint container with a user-assigned managed identity, "
        "never with keys: az identity create -g GROUP -n costguard-instance --query id",
        example="/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/ml/"
        "providers/Microsoft.ManagedIdentity/userAssignedIdentities/costguard-instance",
        required=True,
        pattern=re.compile(
            r"/subscriptions/[^/\s]+/resourceGroups/[^/\s]+/providers/"
            r"Microsoft\.ManagedIdentity/userAssignedIdentities/[^/\s]+",
            re.IGNORECASE,
        ),
        invalid="the identity option must be a user-assigned identity resource id",
        hint="…/providers/Microsoft.ManagedIdentity/userAssignedIdentities/NAME",
    ),
    Option(
        "ssh_public_key",
        'Azure wants one for a Linux VM: ssh_public_key="$(cat ~/.ssh/id_ed25519.pub)"',
        example="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
        required=True,
        pattern=re.compile(r"(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp[0-9]+) [A-Za-z0-9+/=]+( .*)?"),
        invalid="the ssh_public_key option is not an OpenSSH public key",
        hint="the one line of ~/.ssh/id_ed25519.pub (never the key)",
    ),
    Option(
        "admin_username",
        "the VM's administrator (ARM refuses root, admin and others)",
        example="ml",
        default="azureuser",
        # ARM's deny-list (OSProfile.adminUsername "Disallowed values"), not only root/admin.
        pattern=re.compile(r"[a-z_][a-z0-9_-]{0,31}"),
        refused=DISALLOWED_USERS,
        invalid="the admin_username option cannot be {value!r}",
        hint="e.g. admin_username=azureuser",
    ),
    Option(
        "eviction_policy",
        "what an eviction does to a Spot VM: Delete, or Deallocate (its disk bills on)",
        example="Deallocate",
        default="Delete",
        choices=("Delete", "Deallocate"),
        invalid="the eviction_policy option must be Delete or Deallocate, not {value!r}",
        hint="Delete leaves nothing behind to pay for",
    ),
    Option("disk_gb", "the OS disk's size in GB", example="200", default="100", whole=(30, 4095)),
    Option(
        "disk_type", "the OS disk's storage type", example="StandardSSD_LRS", default="Premium_LRS"
    ),
)
#: The ARM error code of a reference to a resource ARM cannot use from here: for the
#: subnet, a subnet of another region (virtual networks are regional).
INVALID_REFERENCE = "InvalidResourceReference"
_CODE = re.compile(r"\b(" + "|".join(CAPACITY_CODES) + r")\b")


def image_reference(image: str) -> dict[str, str]:
    """An ``imageReference`` from a URN (as ``az vm create --image`` takes) or a resource id.

    >>> image_reference("microsoft-dsvm:ubuntu-hpc:2204:latest")["offer"]
    'ubuntu-hpc'
    >>> image_reference("/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/i")
    {'id': '/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/i'}
    """
    if _IMAGE_ID.fullmatch(image):
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


def _vm_id(subscription: str, group: str, name: str) -> str:
    """A VM's resource id, in lower case (Resource Manager's ids are case-insensitive)."""
    return (
        f"/subscriptions/{subscription}/resourcegroups/{group}/providers/"
        f"microsoft.compute/virtualmachines/{name}"
    ).lower()


def _refers_to(exc: BaseException, code: str, resource_id: str) -> bool:
    """Whether an ARM error has ``code`` and names ``resource_id`` in its message."""
    error = getattr(exc, "error", None)
    found = str(getattr(error, "code", "") or "")
    text = str(getattr(exc, "message", "") or exc).lower()
    return found == code and resource_id.lower() in text


def _busy(exc: object) -> bool:
    """Whether ARM refused a delete for now: what it deletes is still in use or busy.

    >>> from types import SimpleNamespace as Answer
    >>> def refused(code, status):
    ...     return Answer(error=Answer(code=code), status_code=status)
    >>> _busy(refused("InUseNetworkSecurityGroupCannotBeDeleted", 400)), _busy(refused("", 409))
    (True, True)
    >>> _busy(refused("AuthorizationFailed", 403))
    False
    """
    code = str(getattr(getattr(exc, "error", None), "code", "") or "")
    in_use = code.startswith("InUse") and code.endswith("CannotBeDeleted")
    return in_use or code in BUSY_CODES or getattr(exc, "status_code", None) == 409


def _delete_vm_command(group: str, name: str) -> str:
    """The Azure CLI command that deletes VM ``name`` of resource group ``group``."""
    return f"az vm delete --resource-group {group} --name {name} --yes"


def _error_code(exc: BaseException) -> str:
    error = getattr(exc, "error", None)
    code = str(getattr(error, "code", "") or "")
    if code in CAPACITY_CODES:
        return code
    found = _CODE.search(str(getattr(exc, "message", "") or exc))
    return found[1] if found else code


#: ARM's answers to a subscription's request rate (HTTP 429), not to capacity or quota.
THROTTLE_CODES = ("TooManyRequests", "SubscriptionRequestsThrottled", "OperationNotAllowed429")


def throttled(exc: BaseException, action: str) -> ThrottledError | None:
    """A request Azure Resource Manager refused for the request rate (HTTP 429, its
    ``Retry-After`` kept) as a :class:`ThrottledError` (asked again later), else None."""
    status = getattr(exc, "status_code", None)
    code = str(getattr(getattr(exc, "error", None), "code", "") or "")
    if status != 429 and code not in THROTTLE_CODES:
        return None
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    wait = parse_retry_after(headers.get("Retry-After"))
    message = str(getattr(exc, "message", "") or exc)
    return ThrottledError(
        f"Azure throttled {action}: {message}", code=code or "429", retry_after_s=wait
    )


def _storage_profile(values: Mapping[str, str]) -> dict[str, Any]:
    """The image, and the OS disk deleted with the VM."""
    return {
        "imageReference": image_reference(values["image"]),
        "osDisk": {
            "createOption": "FromImage",
            "deleteOption": "Delete",
            "diskSizeGB": int(values["disk_gb"]),
            "managedDisk": {"storageAccountType": values["disk_type"]},
        },
    }


def _os_profile(name: str, values: Mapping[str, str], script: str) -> dict[str, Any]:
    """The boot script as ``customData``; SSH by public key only, no password."""
    user = values["admin_username"]
    key = {"path": f"/home/{user}/.ssh/authorized_keys", "keyData": values["ssh_public_key"]}
    return {
        "computerName": name,
        "adminUsername": user,
        "customData": base64.b64encode(script.encode()).decode(),
        "linuxConfiguration": {
            "disablePasswordAuthentication": True,
            "ssh": {"publicKeys": [key]},
        },
    }


def _network_profile(name: str, subnet: str) -> dict[str, Any]:
    """One NIC in ``subnet``, declared inline and deleted with the VM (no network SDK)."""
    configuration = {"name": "ipconfig1", "properties": {"subnet": {"id": subnet}}}
    return {
        "networkApiVersion": NETWORK_API_VERSION,
        "networkInterfaceConfigurations": [
            {
                "name": f"{name}-nic",
                "properties": {
                    "primary": True,
                    "deleteOption": "Delete",
                    "ipConfigurations": [configuration],
                },
            }
        ],
    }


def gang_name(job_id: str, attempt: int, rank: int) -> str:
    """The name of node ``rank``'s VM in attempt ``attempt`` of a gang (64 characters at
    most: a Linux computer name).

    >>> gang_name("run-1", 2, 1)
    'costguard-run-1-2-n1'
    """
    suffix = f"-n{rank}"
    return bootstrap.resource_name(job_id, attempt, 64 - len(suffix)) + suffix


def placement_group_name(job_id: str, region: str) -> str:
    """The job's proximity placement group in ``region`` (one per region: a group lives in
    one).

    >>> placement_group_name("cg-alice-1", "eastus")
    'costguard-cg-alice-1-eastus'
    """
    return f"costguard-{check_job_id(job_id, 'the job to launch')}-{region}"


def _node_body(template: dict[str, Any], name: str, gang: GangNetwork) -> dict[str, Any]:
    """One gang VM's body: ``template`` (the attempt's) under the node's own name (its
    computer name and NIC), in the gang's proximity placement group, its NIC in the job's
    network security group and application security group."""
    body = copy.deepcopy(template)
    properties = body["properties"]
    properties["osProfile"]["computerName"] = name
    nic = properties["networkProfile"]["networkInterfaceConfigurations"][0]
    nic["name"] = f"{name}-nic"
    nic["properties"]["networkSecurityGroup"] = {"id": gang.security_group}
    for configuration in nic["properties"]["ipConfigurations"]:
        configuration["properties"]["applicationSecurityGroups"] = [{"id": gang.nodes}]
    properties["proximityPlacementGroup"] = {"id": gang.placement}
    return body


@dataclass(frozen=True)
class GangNetwork:
    """What a gang's VMs share in a region: the proximity placement group, the application
    security group that names the job's NICs, and the network security group that admits
    the rendezvous and collective ports from that group only."""

    placement: str
    nodes: str
    security_group: str


def gang_rules(nodes: str) -> list[dict[str, Any]]:
    """The job's network security rules: TCP on the rendezvous and collective ports from
    the job's NICs (application security group ``nodes``) to them; everything else from the
    virtual network denied (Azure's default rules admit the whole network)."""
    low, high = bootstrap.COLLECTIVE_PORTS
    group = [{"id": nodes}]
    return [
        {"name": "costguard-gang-in", "properties": {
            "priority": 100, "direction": "Inbound", "access": "Allow", "protocol": "Tcp",
            "sourcePortRange": "*", "destinationPortRanges": [str(bootstrap.RDZV_PORT),
                                                              f"{low}-{high}"],
            "sourceApplicationSecurityGroups": group,
            "destinationApplicationSecurityGroups": group}},
        {"name": "costguard-no-other-network-in", "properties": {
            "priority": 4000, "direction": "Inbound", "access": "Deny", "protocol": "*",
            "sourcePortRange": "*", "destinationPortRange": "*",
            "sourceAddressPrefix": "VirtualNetwork", "destinationAddressPrefix": "*"}},
    ]  # fmt: skip


def _network_path(subscription: str, group: str, kind: str, name: str = "") -> str:
    """The ARM path of a ``Microsoft.Network`` resource of ``kind`` (or of their list)."""
    path = f"/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Network"
    return f"{path}/{kind}/{name}" if name else f"{path}/{kind}"


class AzureLauncher(base.Launcher):
    """Virtual machines in one subscription and resource group (the launcher's, or each
    spec's options). ``credential`` and ``client_options`` (azure-core pipeline options)
    go to :func:`costguard.clouds.azure.client`; ``compute`` is a ready client. Example::

        launcher = AzureLauncher(Settings.load(), subscription_id=sub, resource_group="ml")
    """

    provider = "azure"
    OPTIONS = OPTIONS
    #: The most pages of the status listing one :meth:`statuses` reads.
    list_pages = LIST_PAGES

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
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.settings = settings
        self._sleep = sleep
        self.subscription_id = subscription_id
        self.resource_group = resource_group
        self._credential = credential
        self._options = dict(client_options or {})
        self._clients: dict[str, Any] = {subscription_id: compute} if compute is not None else {}
        self._environ = environ
        #: VMs this launcher deleted: their absence is not an eviction.
        self._deleted: set[tuple[str, str, str]] = set()
        #: Subscriptions whose VM status listing refused this credential (HTTP 403): their
        #: VMs are read one by one.
        self._unlisted: set[str] = set()
        #: (subscription, region) -> size -> (zones, Location-restricted): SKU listings.
        self._skus: dict[tuple[str, str], dict[str, tuple[set[str], bool]]] = {}

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

    def option_defaults(self) -> dict[str, str]:
        """The subscription and resource group the launcher was built with, when the
        job's options name none."""
        return {"subscription": self.subscription_id, "resource_group": self.resource_group}

    def _where(self, spec: LaunchSpec) -> tuple[str, str]:
        """The subscription and resource group the attempt's VM goes in."""
        values = OPTIONS.check(spec.options, self.provider, self.option_defaults())
        return values["subscription"], values["resource_group"]

    def check(self, spec: LaunchSpec) -> None:
        """Validate every option offline (no Azure call) and render the boot script once."""
        super().check(spec)
        if not any(k == "subnet" or k.startswith("subnet_") for k, v in spec.options.items()
                   if v.strip()):  # fmt: skip
            msg = f"launching on {self.provider} needs the subnet option"
            raise InputError(msg, hint=OPTIONS["subnet"].help)
        self._max_price(spec)
        bootstrap.render(spec, 1, self.provider, environ=self._environ)

    def _subnet(self, spec: LaunchSpec, region: str) -> str:
        """The subnet for ``region``: ``subnet_<region>``, else ``subnet``. Subnets are
        regional; one of another region is refused at the PUT (see :meth:`launch`)."""
        return (spec.options.get(f"subnet_{region}") or spec.options.get("subnet", "")).strip()

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
        values = OPTIONS.check(spec.options, self.provider, self.option_defaults())
        name = bootstrap.resource_name(spec.job_id, attempt, 64)
        subnet = self._subnet(spec, offer.region)
        if not subnet:
            msg = f"no subnet for {offer.region}: subnets are regional"
            raise InputError(msg, hint=f"add subnet_{offer.region}=<its subnet id> (or subnet=)")
        script = bootstrap.render(spec, attempt, self.provider, environ=self._environ)
        body: dict[str, Any] = {
            "location": offer.region,
            "tags": spec.tags(attempt),
            "identity": {
                "type": "UserAssigned",
                "userAssignedIdentities": {values["identity"]: {}},
            },
            "properties": {
                "hardwareProfile": {"vmSize": offer.instance_type},
                "storageProfile": _storage_profile(values),
                "osProfile": _os_profile(name, values, script),
                "networkProfile": _network_profile(name, subnet),
                **self._priority(offer, spec, values),
            },
        }
        if offer.zone:
            body["zones"] = [offer.zone.rsplit("-", 1)[-1]]  # "eastus-1" or "1" -> "1"
        return body

    def _priority(
        self, offer: Offer, spec: LaunchSpec, values: Mapping[str, str]
    ) -> dict[str, Any]:
        """Spot (its eviction policy and price cap) or Regular."""
        if offer.market is not Market.SPOT:
            return {"priority": "Regular"}
        return {
            "priority": "Spot",
            "evictionPolicy": values["eviction_policy"],
            "billingProfile": {"maxPrice": self._max_price(spec)},
        }

    def launch(self, offer: Offer, spec: LaunchSpec, attempt: int) -> Handle:
        """The PUT, polled until it succeeds; a :class:`CapacityError` when the place is
        full, when the size is not offered to the subscription in the region, or when the
        region's subnet is refused. A retried attempt whose VM exists is adopted."""
        body = self.request(offer, spec, attempt)
        subscription, group = self._where(spec)
        name = body["properties"]["osProfile"]["computerName"]
        action = f"creating {name} in {offer.region}"
        if self._restricted(subscription, offer.region, offer.instance_type):
            text = f"{offer.instance_type} is not offered to this subscription in {offer.region}"
            raise CapacityError(text, place=offer.place, code="NotAvailableForSubscription")
        compute = self._compute(subscription)
        core = require("azure.core.exceptions", azure_clouds.EXTRA)
        try:
            # customData and adminUsername cannot change after creation
            # (PropertyChangeNotAllowed): a VM of this attempt that exists is used as it is.
            compute.virtual_machines.get(group, name)
        except core.ResourceNotFoundError:
            pass
        except azure_clouds.errors() as exc:
            raise azure_clouds.translate(exc, f"reading {name}") from None
        else:
            return self._handle(offer, subscription, group, name, body, attempt)
        try:
            poller = compute.virtual_machines.begin_create_or_update(group, name, body)
            poller.result(timeout=OPERATION_TIMEOUT_S)
            if not poller.done():
                msg = f"{action} did not finish within {OPERATION_TIMEOUT_S} s"
                raise CostguardError(msg, hint="costguard jobs status shows what came of it")
        except azure_clouds.errors() as exc:
            limited = throttled(exc, action)
            if limited is not None:
                raise limited from None
            code = _error_code(exc)
            if code in CAPACITY_CODES:
                text = f"Azure has no room for {offer.instance_type} in {offer.place}: {code}"
                raise CapacityError(text, place=offer.place, code=code) from None
            subnet = body["properties"]["networkProfile"]["networkInterfaceConfigurations"][0]
            subnet_id = subnet["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"]
            if _refers_to(exc, INVALID_REFERENCE, subnet_id):
                # Subnets are regional: this region cannot use the subnet given. Another
                # region (with its own subnet_<region>) may; any other refusal stops the job.
                text = f"the subnet given cannot be used from {offer.region}: {INVALID_REFERENCE}"
                raise CapacityError(text, place=offer.place, code=INVALID_REFERENCE) from None
            raise azure_clouds.translate(exc, action) from None
        return self._handle(offer, subscription, group, name, body, attempt)

    def _handle(
        self,
        offer: Offer,
        subscription: str,
        group: str,
        name: str,
        body: dict[str, Any],
        attempt: int,
    ) -> Handle:
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

    # ------------------------------------------------------------------- gang

    def launch_gang(self, offer: Offer, spec: LaunchSpec, attempt: int) -> tuple[Handle, ...]:
        """The ``spec.nodes`` VMs of attempt ``attempt``, all or none: in the offer's zone
        (when it names one) and in the job's proximity placement group of the region, so
        they share a datacenter; each created as :meth:`launch` creates one (its own NIC
        and OS disk, deleted with it), named for its rank (``<attempt's name>-n<rank>``),
        all PUT before any is waited for. Then each is told its rank and node 0's private
        address (read from node 0's NIC) in its tags, which the VM reads from IMDS
        (``compute/tagsList``). If any VM fails, every VM of the gang that exists (tagged
        with the job and the attempt) is deleted, its NIC and disk with it, before the
        error is raised: a :class:`CapacityError` when Azure had no room, a
        :class:`ThrottledError` when a VM's PUT was refused for the request rate."""
        if spec.nodes == 1:
            return (self.launch(offer, spec, attempt),)
        template = self.request(offer, spec, attempt)
        subscription, group = self._where(spec)
        if self._restricted(subscription, offer.region, offer.instance_type):
            text = f"{offer.instance_type} is not offered to this subscription in {offer.region}"
            raise CapacityError(text, place=offer.place, code="NotAvailableForSubscription")
        compute = self._compute(subscription)
        nodes = self._network_resource(
            subscription, group, "applicationSecurityGroups", offer.region, spec, {}
        )
        rules = {"securityRules": gang_rules(nodes)}
        gang = GangNetwork(
            placement=self._placement_group(compute, group, offer.region, spec),
            nodes=nodes,
            security_group=self._network_resource(
                subscription, group, "networkSecurityGroups", offer.region, spec, rules
            ),
        )
        extra = {"subscription": subscription, "resource_group": group,
                 "priority": template["properties"]["priority"], "attempt": str(attempt),
                 "nodes": str(spec.nodes)}  # fmt: skip
        handles = [
            Handle(
                self.provider,
                offer.region,
                gang_name(spec.job_id, attempt, rank),
                offer.zone,
                {**extra, "node": str(rank)},
            )
            for rank in range(spec.nodes)
        ]
        made = self._existing(compute, group, handles, spec)
        try:
            pollers = [
                self._begin(
                    compute,
                    group,
                    h.instance_id,
                    _node_body(template, h.instance_id, gang),
                    offer,
                )
                for h in handles
                if h.instance_id not in made
            ]
            failures = [
                self._finish(p, offer) if not isinstance(p, CostguardError) else p for p in pollers
            ]
            refused = [f for f in failures if f is not None]
            if refused:
                capacity = [f for f in refused if isinstance(f, CapacityError)]
                raise (capacity or refused)[0]
            self._tell_gang(compute, group, handles, spec, attempt)
            return tuple(handles)
        except BaseException as exc:
            left = self._end_gang(compute, group, handles, spec)
            if left is not None:
                raise left from exc
            raise

    def _existing(
        self, compute: Any, group: str, handles: list[Handle], spec: LaunchSpec
    ) -> set[str]:
        """The gang's VMs that exist already (a retried launch adopts them: ``customData``
        cannot change after creation); a :class:`CostguardError` before anything is made
        when one of those names is a VM that is not this attempt's."""
        core = require("azure.core.exceptions", azure_clouds.EXTRA)
        found = set()
        for handle in handles:
            try:
                vm = compute.virtual_machines.get(group, handle.instance_id)
            except core.ResourceNotFoundError:
                continue
            except azure_clouds.errors() as exc:
                raise azure_clouds.translate(exc, f"reading {handle.instance_id}") from None
            tags = {k.lower(): v for k, v in (vm.tags or {}).items()}
            if tags.get(JOB_TAG) != spec.job_id or tags.get(ATTEMPT_TAG) != handle.extra["attempt"]:
                msg = f"a VM named {handle.instance_id} exists and is not this attempt's"
                raise CostguardError(msg, hint="delete it if it is a leftover, then launch again")
            found.add(handle.instance_id)
        return found

    def _begin(
        self, compute: Any, group: str, name: str, body: dict[str, Any], offer: Offer
    ) -> Any:
        """One VM's create started: its poller, or the error of an immediate refusal."""
        try:
            return compute.virtual_machines.begin_create_or_update(group, name, body)
        except azure_clouds.errors() as exc:
            return self._refused(exc, offer)

    def _finish(self, poller: Any, offer: Offer) -> CostguardError | None:
        """The error of one VM's create (``None`` when it succeeded), waited for."""
        try:
            poller.result(timeout=OPERATION_TIMEOUT_S)
        except azure_clouds.errors() as exc:
            return self._refused(exc, offer)
        if not poller.done():
            msg = f"creating a VM of the gang did not finish within {OPERATION_TIMEOUT_S} s"
            return CostguardError(msg, hint="costguard jobs status shows what came of it")
        return None

    @staticmethod
    def _refused(exc: BaseException, offer: Offer) -> CostguardError:
        """A gang VM's refusal: a :class:`CapacityError` when Azure had no room, a
        :class:`ThrottledError` for the request rate (the gang is then ended whole and
        asked for again later)."""
        code = _error_code(exc)
        if code in CAPACITY_CODES:
            text = f"Azure has no room for the gang's {offer.instance_type} in {offer.place}"
            return CapacityError(f"{text}: {code}", place=offer.place, code=code)
        action = f"creating a VM of the gang in {offer.region}"
        return throttled(exc, action) or azure_clouds.translate(exc, action)

    def _tell_gang(
        self, compute: Any, group: str, handles: list[Handle], spec: LaunchSpec, attempt: int
    ) -> None:
        """Node 0's private address from its NIC, then each VM's tags with its rank and
        the rendezvous added, signed for the VM (:meth:`LaunchSpec.told`; a PATCH of the
        whole tag set)."""
        first = compute.virtual_machines.get(group, handles[0].instance_id)
        address = node.private_ipv4(self._private_address(compute, first))
        if address is None:
            msg = f"node 0 ({handles[0].instance_id}) has no private IPv4 address"
            raise CostguardError(msg, hint="this launch was ended; launch again")
        for rank, handle in enumerate(handles):
            vm = compute.virtual_machines.get(group, handle.instance_id)
            tags = {
                **(vm.tags or {}),
                **node.signed(spec, attempt, handle.instance_id, rank, address),
            }
            poller = compute.virtual_machines.begin_update(
                group, handle.instance_id, {"tags": tags}
            )
            poller.result(timeout=OPERATION_TIMEOUT_S)

    def _private_address(self, compute: Any, vm: Any) -> str:
        """The private address of ``vm``'s primary NIC (a Microsoft.Network read through
        the compute client's pipeline: no network SDK)."""
        rest = require("azure.core.rest", azure_clouds.EXTRA)
        interfaces = list(vm.network_profile.network_interfaces or [])
        if not interfaces:
            return ""
        url = f"{interfaces[0].id}?api-version={NETWORK_API_VERSION}"
        answer = compute.send_request(rest.HttpRequest("GET", url))
        answer.raise_for_status()
        configurations = answer.json().get("properties", {}).get("ipConfigurations", [])
        found = configurations[0].get("properties", {}) if configurations else {}
        return str(found.get("privateIPAddress", ""))

    def _end_gang(
        self, compute: Any, group: str, handles: list[Handle], spec: LaunchSpec
    ) -> CostguardError | None:
        """Delete the VMs of a gang that cannot run whole: those that exist and carry the
        job's and the attempt's tags (a VM of the same name that is not the job's is left
        alone); their NICs and OS disks go with them (``deleteOption=Delete``). Every VM
        is tried, each delete sent again while ARM says it is busy (:meth:`terminate`);
        the error naming those not deleted, with the command, or ``None``."""
        core = require("azure.core.exceptions", azure_clouds.EXTRA)
        left = []
        for handle in handles:
            try:
                vm = compute.virtual_machines.get(group, handle.instance_id)
            except core.ResourceNotFoundError:
                continue
            except azure_clouds.errors():
                left.append(handle.instance_id)  # cannot tell: it may exist and bill
                continue
            tags = {k.lower(): v for k, v in (vm.tags or {}).items()}
            if tags.get(JOB_TAG) != spec.job_id or tags.get(ATTEMPT_TAG) != handle.extra["attempt"]:
                continue
            try:
                self.terminate(handle)
            except CostguardError:
                left.append(handle.instance_id)
        if not left:
            return None
        msg = (
            f"the gang could not start whole, and Azure did not delete {', '.join(left)}: "
            "they may still run and bill"
        )
        commands = "; ".join(_delete_vm_command(group, name) for name in left)
        return CostguardError(msg, hint=commands)

    def _placement_group(self, compute: Any, group: str, region: str, spec: LaunchSpec) -> str:
        """The id of the job's proximity placement group in ``region`` (made once, tagged
        with the job and its owner; one of that name that is not the job's is refused)."""
        core = require("azure.core.exceptions", azure_clouds.EXTRA)
        name = placement_group_name(spec.job_id, region)
        action = f"making the proximity placement group {name}"
        try:
            try:
                found = compute.proximity_placement_groups.get(group, name)
            except core.ResourceNotFoundError:
                body = {"location": region, "tags": {JOB_TAG: spec.job_id, OWNER_TAG: spec.owner},
                        "properties": {"proximityPlacementGroupType": "Standard"}}  # fmt: skip
                return str(
                    compute.proximity_placement_groups.create_or_update(group, name, body).id
                )
        except azure_clouds.errors() as exc:
            raise azure_clouds.translate(exc, action) from None
        tags = {k.lower(): v for k, v in (found.tags or {}).items()}
        if tags.get(JOB_TAG) != spec.job_id or tags.get(OWNER_TAG) != spec.owner:
            msg = f"the proximity placement group {name} is not this job's: costguard leaves it"
            raise CostguardError(msg, hint="delete it if it is a leftover, then launch again")
        return str(found.id)

    def _network_resource(
        self,
        subscription: str,
        group: str,
        kind: str,
        region: str,
        spec: LaunchSpec,
        properties: dict[str, Any],
    ) -> str:
        """The id of the job's ``Microsoft.Network/<kind>`` resource in ``region`` (made
        once, tagged with the job and its owner; one of that name that is not the job's is
        refused), through the compute client's pipeline (no network SDK)."""
        name = placement_group_name(spec.job_id, region)
        path = _network_path(subscription, group, kind, name)
        found = self._arm("GET", path)
        if found is None:
            body = {"location": region, "tags": {JOB_TAG: spec.job_id, OWNER_TAG: spec.owner},
                    "properties": properties}  # fmt: skip
            found = self._arm("PUT", path, body) or {}
        tags = {str(k).lower(): v for k, v in (found.get("tags") or {}).items()}
        if tags.get(JOB_TAG) != spec.job_id or tags.get(OWNER_TAG) != spec.owner:
            msg = f"the {kind[:-1]} {name} is not this job's: costguard leaves it"
            raise CostguardError(msg, hint="delete it if it is a leftover, then launch again")
        return str(found.get("id", path))

    def _arm(self, method: str, path: str, body: Any = None) -> dict[str, Any] | None:
        """One Resource Manager request of the network API (its JSON answer; ``None`` for
        a 404, or for a delete's empty answer), through the compute client's pipeline."""
        try:
            return self._arm_call(method, path, body)
        except azure_clouds.errors() as exc:
            raise azure_clouds.translate(exc, f"{method} {path.rsplit('/', 2)[-2]}") from None

    def _arm_call(self, method: str, path: str, body: Any = None) -> dict[str, Any] | None:
        """:meth:`_arm`, its errors the SDK's own."""
        rest = require("azure.core.rest", azure_clouds.EXTRA)
        compute = self._compute(path.split("/")[2])
        url = f"{path}?api-version={NETWORK_API_VERSION}"
        answer = compute.send_request(rest.HttpRequest(method, url, json=body))
        if answer.status_code == 404:
            return None
        answer.raise_for_status()
        return answer.json() if answer.content else None

    def _deleting(self, delete: Callable[[], object], action: str, command: str) -> str:
        """``delete()``, sent again after :data:`DELETE_BACKOFF_S` while ARM refuses it for
        now (:func:`_busy`: in use, busy); "" once done or gone, else what went wrong,
        with ``command``, which deletes it by hand."""
        core = require("azure.core.exceptions", azure_clouds.EXTRA)
        delays = iter(DELETE_BACKOFF_S)
        while True:
            try:
                delete()
            except core.ResourceNotFoundError:
                return ""
            except CostguardError as exc:
                return f"{exc.message} ({command})"
            except azure_clouds.errors() as exc:
                delay = next(delays, None) if _busy(exc) else None
                if delay is None:
                    message = azure_clouds.translate(exc, action).message
                    waited = (
                        f"still refused after {sum(DELETE_BACKOFF_S):.0f} s: " if _busy(exc) else ""
                    )
                    return f"{waited}{message} ({command})"
                self._sleep(delay)
                continue
            return ""

    def release(self, spec: LaunchSpec) -> None:
        """Delete what the job's gangs made in its resource group, once their VMs (and the
        NICs deleted with them) are gone: the network security groups, the application
        security groups and the proximity placement groups tagged with the job and its
        owner. Each is tried, its delete sent again while ARM says it is still in use (a
        NIC deleted after its VM); a :class:`CostguardError` names what is left, each with
        the command that deletes it."""
        subscription, group = self._where(spec)
        compute = self._compute(subscription)
        action = f"releasing the placement groups of {spec.job_id}"

        def owned(tags: Mapping[str, str] | None) -> bool:
            found = {str(k).lower(): v for k, v in (tags or {}).items()}
            return found.get(JOB_TAG) == spec.job_id and found.get(OWNER_TAG) == spec.owner

        base_path = (
            f"/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Network"
        )
        left = []
        for kind in ("networkSecurityGroups", "applicationSecurityGroups"):
            listed = (self._arm("GET", f"{base_path}/{kind}") or {}).get("value", [])
            for item in listed:
                if owned(item.get("tags")):
                    path = f"{base_path}/{kind}/{item['name']}"
                    left.append(self._deleting(
                        functools.partial(self._arm_call, "DELETE", path),
                        f"deleting {item['name']}", f"az resource delete --ids {path}",
                    ))  # fmt: skip
        try:
            found = list(compute.proximity_placement_groups.list_by_resource_group(group))
        except azure_clouds.errors() as exc:
            raise azure_clouds.translate(exc, action) from None
        for placement in found:
            if owned(placement.tags):
                left.append(self._deleting(
                    functools.partial(compute.proximity_placement_groups.delete, group,
                                      placement.name),
                    f"deleting {placement.name}",
                    f"az ppg delete --resource-group {group} --name {placement.name}",
                ))  # fmt: skip
        if any(left):
            msg = f"{spec.job_id} keeps what Azure would not delete: " + "; ".join(
                filter(None, left)
            )
            raise CostguardError(msg, hint="delete them once their VMs and NICs are gone")

    # ------------------------------------------------------------------ zones

    def zones(self, region: str, instance_type: str = "") -> list[str]:
        """The Availability Zones where ``instance_type`` may run in ``region`` for this
        subscription (Resource SKUs API, one location-filtered listing, bounded pages).

        None without a size (the zones are a property of the size), for a size the API
        does not list there, or without a subscription to ask in.
        """
        if not instance_type or not self.subscription_id:
            return []
        zones, _restricted = self._sku(self.subscription_id, region, instance_type)
        return sorted(zones)

    def _restricted(self, subscription: str, region: str, instance_type: str) -> bool:
        """Whether a ``Location`` restriction keeps the size out of the region for the
        subscription (ResourceSkuRestrictions.type is ``Location`` or ``Zone``)."""
        return self._sku(subscription, region, instance_type)[1]

    def _sku(self, subscription: str, region: str, instance_type: str) -> tuple[set[str], bool]:
        """(zones less ``Zone`` restrictions, whether a ``Location`` restriction names the
        region) of one size, from one listing per subscription and region (cached)."""
        key = (subscription, region.lower())
        if key not in self._skus:
            self._skus[key] = self._list_skus(subscription, region)
        return self._skus[key].get(instance_type.lower(), (set(), False))

    def _list_skus(self, subscription: str, region: str) -> dict[str, tuple[set[str], bool]]:
        compute = self._compute(subscription)
        found: dict[str, tuple[set[str], bool]] = {}
        try:
            pager = compute.resource_skus.list(filter=f"location eq '{region}'")
            for number, sku in enumerate(pager):
                if number >= MAX_SKUS:
                    break
                if str(sku.resource_type or "").lower() != "virtualmachines":
                    continue
                zones: set[str] = set()
                for info in sku.location_info or []:
                    if str(info.location or "").lower() == region.lower():
                        zones.update(str(z) for z in info.zones or [])
                restricted = False
                for restriction in sku.restrictions or []:
                    kind = str(getattr(restriction.type, "value", restriction.type) or "").lower()
                    info = restriction.restriction_info
                    if kind == "zone" and info is not None:
                        zones.difference_update(info.zones or [])
                    elif kind == "location":
                        # ``values`` names the locations; the model is a mapping, whose
                        # ``values`` attribute is the dict method, so it is read by key.
                        named = restriction.get("values") if hasattr(restriction, "get") else None
                        places = [*(named or []), *((info and info.locations) or [])]
                        restricted |= region.lower() in {str(p).lower() for p in places}
                found[str(sku.name or "").lower()] = (zones, restricted)
        except azure_clouds.errors() as exc:
            raise azure_clouds.translate(exc, f"listing the zones of {region}") from None
        return found

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
        return self._status_of(handle, vm, vm.provisioning_state)

    def _status_of(self, handle: Handle, vm: Any, provisioning: str | None) -> Status:
        """The :class:`Status` of ``handle`` from its VM's instance view (``provisioning``:
        the model's provisioning state, when the view leaves it out)."""
        subscription, group = handle.extra["subscription"], handle.extra["resource_group"]
        spot = handle.extra.get("priority", "").lower() == "spot"
        ours = (subscription, group.lower(), handle.instance_id.lower()) in self._deleted
        view = vm.instance_view
        statuses = list(view.statuses or []) if view is not None else []
        codes = [str(s.code or "") for s in statuses]
        if provisioning and not any(c.startswith("ProvisioningState/") for c in codes):
            codes.append(f"ProvisioningState/{provisioning.lower()}")
        state = classify(codes, spot, ours)
        detail = "; ".join(str(s.display_status or s.code) for s in statuses)
        if state is State.PREEMPTED:
            detail = f"inferred eviction of a Spot VM ({detail})"
        return Status(handle, state, detail, launched_at=getattr(vm, "time_created", None))

    def statuses(self, handles: Sequence[Handle]) -> list[Status]:
        """Many VMs' states from one listing per subscription: ``virtualMachines.listAll``
        with ``statusOnly=true``, the one listing that carries instance views (a resource
        group's listing takes ``$expand=instanceView`` only with a scale set's
        ``$filter``), matched to the handles by resource id (subscription, group and
        name), paged only until every handle's VM is seen, for at most
        :attr:`list_pages` pages; a VM it does not show running or starting is read
        alone by :meth:`status` (:meth:`Launcher.batched
        <costguard.spot.launcher.base.Launcher.batched>`). The listing is at the
        subscription's scope: a credential allowed only on the resource group is refused
        it (HTTP 403), and then every VM is read alone, as :meth:`status` does."""
        return self.batched(handles, self._listed)

    def _listed(self, handles: Sequence[Handle]) -> dict[int, Status]:
        wanted: dict[str, dict[str, list[int]]] = {}
        for at, handle in enumerate(handles):
            subscription = handle.extra["subscription"]
            key = _vm_id(subscription, handle.extra["resource_group"], handle.instance_id)
            wanted.setdefault(subscription, {}).setdefault(key, []).append(at)
        shown: dict[int, Status] = {}
        for subscription, by_id in wanted.items():
            if subscription in self._unlisted:
                continue
            left = set(by_id)
            compute = self._compute(subscription)
            try:
                pages = compute.virtual_machines.list_all(status_only="true").by_page()
                for number, page in enumerate(pages, start=1):
                    for vm in page:
                        key = str(vm.id or "").lower()
                        for at in by_id.get(key, []):
                            shown[at] = self._status_of(handles[at], vm, None)
                        left.discard(key)
                    if not left or number >= self.list_pages:
                        break
            except azure_clouds.errors() as exc:
                if getattr(exc, "status_code", None) != 403:
                    raise azure_clouds.translate(exc, "listing the VMs' states") from None
                # The launcher's role, assigned on the resource group as infra/azure says,
                # may not read the subscription's listing: each VM is read alone, as before.
                self._unlisted.add(subscription)
        return shown

    # -------------------------------------------------------------- terminate

    def terminate(self, handle: Handle) -> None:
        """``virtualMachines.delete`` (its NIC and OS disk go with it), polled, and sent
        again while ARM says the VM is busy (another operation in progress); a VM that is
        already gone is fine. A :class:`CostguardError` names one it did not delete."""
        subscription, group = handle.extra["subscription"], handle.extra["resource_group"]
        self._deleted.add((subscription, group.lower(), handle.instance_id.lower()))
        action = f"deleting {handle.instance_id}"

        def delete() -> None:
            poller = self._compute(subscription).virtual_machines.begin_delete(
                group, handle.instance_id
            )
            poller.result(timeout=OPERATION_TIMEOUT_S)
            if not poller.done():
                msg = f"{action} did not finish within {OPERATION_TIMEOUT_S} s"
                raise CostguardError(msg)

        left = self._deleting(delete, action, _delete_vm_command(group, handle.instance_id))
        if left:
            raise CostguardError(left, hint="costguard reap finds it too")

    # ------------------------------------------------------------------- find

    def find(self, job_id: str) -> list[Handle]:
        """VMs tagged ``costguard:job=<job_id>`` in the launcher's resource group that are
        not being deleted, deallocated or stopped.

        The group listing cannot carry the instance view: ``$expand=instanceView`` "can only
        be specified if a valid $filter option is specified" (a scale set's id; the service
        answers 400 otherwise), so each VM of the job is read with its instance view.
        """
        if not (self.subscription_id and self.resource_group):
            msg = "finding the VMs of a job on azure needs a subscription and resource group"
            raise InputError(msg, hint="give the launcher the ones the job runs in")
        check_job_id(job_id, "the job to find")
        compute = self._compute(self.subscription_id)
        core = require("azure.core.exceptions", azure_clouds.EXTRA)
        found = []
        try:
            for listed in compute.virtual_machines.list(self.resource_group):
                tags = {k.lower(): v for k, v in (listed.tags or {}).items()}
                if tags.get(JOB_TAG) != job_id:
                    continue
                try:
                    vm = compute.virtual_machines.get(
                        self.resource_group, listed.name, expand="instanceView"
                    )
                except core.ResourceNotFoundError:
                    continue  # deleted since the listing
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
                            "owner": tags.get(OWNER_TAG, ""),
                            **node.noted(tags),
                        },
                    )
                )
        except azure_clouds.errors() as exc:
            raise azure_clouds.translate(exc, f"listing the VMs of {job_id}") from None
        return found
