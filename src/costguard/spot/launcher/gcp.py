"""GCP: one Compute Engine VM per attempt, through ``instances.insert``.

It covers the life of an attempt's VM on Compute Engine (its body, insert, read,
delete, find), with the refusals the API answers handled next to the calls that meet
them.

The VM is created with ``scheduling.provisioningModel=SPOT`` (unless on-demand), the
termination action the user chose (``DELETE`` by default, or ``STOP``),
``onHostMaintenance=TERMINATE`` (GPUs cannot live-migrate) and no automatic restart. N1
machine types get their GPUs as ``guestAccelerators``; the accelerator-optimised
families (A2, A3, A4, G2) have them built in. The job's tags become labels
(``costguard-job``...: GCP label keys cannot hold ``:``, and values only lower-case letters,
digits, ``_`` and ``-``, so ``costguard-expires-at`` is Unix seconds, as the reaper reads
it). The boot script is the ``startup-script`` metadata value; the VM runs as the service
account given, which is what reaches the checkpoint bucket. The instance name is derived
from the job and attempt, so a retried launch cannot make two VMs (the second insert is a
``409``, and the VM is used); the request id is new for every launch, because Compute Engine
answers a request id it has seen with that request's old operation and creates nothing.

A quota refusal can come at once, as HTTP 403 (``Quota 'GPUS_ALL_REGIONS' exceeded``,
reason ``quotaExceeded``), not only as a finished operation with ``QUOTA_EXCEEDED``: both
are a :class:`CapacityError` (another region or market may have quota). Any other 403 is a
permission problem, and stops the job.

Preemption: Compute Engine records a ``compute.instances.preempted`` operation (a system
event, in ``zoneOperations.list``) targeting the VM. Host maintenance stops a GPU VM too
(``onHostMaintenance=TERMINATE``, announced on the metadata key ``maintenance-event``), as
does a failed host: system events ``compute.instances.terminateOnHostMaintenance`` and
``compute.instances.hostError``. A VM that is gone (termination action ``DELETE``) or
stopped (status ``TERMINATED``) is :attr:`State.PREEMPTED` when such an operation exists
for it - the provider took it, recovery relaunches - and :attr:`State.MISSING` /
:attr:`State.STOPPED` (someone stopped it: the job ends) otherwise.

Options (declared in :data:`OPTIONS`): ``project`` (required unless the launcher was given
one), ``image`` (required: ``projects/P/global/images/family/F`` or an image URL),
``service_account`` (required), ``scopes`` (comma-separated; default ``cloud-platform``),
``zone`` (when the offer has none; default ``<region>-a``), ``network`` or ``subnetwork``,
``external_ip`` (default ``true``: the boot script downloads packages), ``disk_gb``
(default 100), ``disk_type`` (default ``pd-balanced``), ``termination_action`` (``DELETE``
or ``STOP``), plus those of :mod:`costguard.spot.bootstrap`.

A gang (``--nodes N``, :meth:`GcpLauncher.launch_gang`) is one zonal
``instances.bulkInsert`` whose ``count`` and ``minCount`` are both N, the VMs carrying the
job's network tag, which the job's firewall rule opens the rendezvous and collective ports
to from that tag only; each VM is then told its rank and node 0's private address in its
metadata. :meth:`GcpLauncher.release` deletes the rule.

Spot VMs on GCP take no price cap: Compute Engine has no maximum price for them (their
price changes at most once a month), so ``--max-price`` only filters the offers, and a
``max_price`` option is ignored here.

Zones: :meth:`GcpLauncher.zones` names the region's ``UP`` zones (``regions.get``) that
offer the machine type (``machineTypes.aggregatedList``), or only the ``zone`` option's
when one is given. A zone without the type refuses an insert at once with HTTP 400
``invalid`` ("... does not exist in zone ..."): for the attached GPU of an N1 machine,
which the zone listing does not know, that refusal is a :class:`CapacityError` of the
zone, so recovery tries the next one instead of ending the job.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from costguard.clouds import READ_TIMEOUT_S, require
from costguard.clouds import gcp as gcp_clouds
from costguard.errors import CostguardError, InputError
from costguard.pricing.catalog import Market
from costguard.settings import Settings
from costguard.spot import bootstrap, node
from costguard.spot.launcher import base
from costguard.spot.launcher.base import CapacityError, Handle, LaunchSpec, Offer, State, Status
from costguard.spot.launcher.options import Option, Options, placement_option
from costguard.tags import (
    ATTEMPT_TAG,
    EXPIRES_TAG,
    JOB_TAG,
    NODE_RANK_TAG,
    OWNER_TAG,
    check_job_id,
    gcp_label,
)

#: The most seconds one insert or delete operation is waited for.
OPERATION_TIMEOUT_S = READ_TIMEOUT_S * 5
LIVE_STATES = ("PROVISIONING", "STAGING", "RUNNING", "REPAIRING")
PREEMPTED_OPERATION = "compute.instances.preempted"
#: System events that take a VM away (zoneOperations ``operationType``): the provider's
#: doing, so the attempt is relaunched rather than read as stopped by someone.
SYSTEM_EVENTS = (
    PREEMPTED_OPERATION,
    "compute.instances.terminateOnHostMaintenance",
    "compute.instances.hostError",
)
#: The immediate 400 of an insert naming a machine or accelerator type the zone lacks.
_NOT_IN_ZONE = re.compile(r"does not exist in zone", re.IGNORECASE)
#: Canonical GPU names of the price tables -> ``acceleratorTypes`` for N1 machines.
ACCELERATOR_TYPES = {
    gpu: name
    for name, gpu in gcp_clouds.ACCELERATORS.items()
    if gpu in ("T4", "P4", "P100", "V100") and not name.endswith("-vws")
}
#: ``error.errors[].code`` values of a failed insert that another place may not hit.
CAPACITY_CODES = (
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "QUOTA_EXCEEDED",
    "RESOURCE_NOT_FOUND_IN_ZONE",
    "UNSUPPORTED_OPERATION_IN_ZONE",
)
DEFAULT_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
#: A Compute Engine resource name (RFC 1035, at most 63 characters).
_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
#: The most VM names one ``instances.aggregatedList`` of many (:meth:`GcpLauncher.statuses`)
#: filters by: a filter (in the request's URL) of bounded length.
LIST_NAMES = 50
#: The options this launcher reads (the boot script's besides), in the order checked.
OPTIONS = Options(
    Option(
        "project",
        "e.g. project=my-lab (gcloud projects list)",
        example="my-lab",
        required=True,
        pattern=re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]"),
        invalid="not a GCP project id: {value!r}",
        hint="the project ID (lower case), not its name or number",
    ),
    Option(
        "image",
        "an image with the NVIDIA driver, e.g. image="
        "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11",
        example="projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11",
        required=True,
    ),
    Option(
        "service_account",
        "the VM reaches the checkpoint bucket as this account, never with keys: e.g. "
        "service_account=costguard-instance@my-lab.iam.gserviceaccount.com "
        "(see infra/gcp/launcher-role.yaml)",
        example="costguard-instance@my-lab.iam.gserviceaccount.com",
        required=True,
        pattern=re.compile(r"[^@\s]+@[a-z0-9.-]+\.iam\.gserviceaccount\.com|default"),
        invalid="not a service account email: {value!r}",
        hint="NAME@PROJECT.iam.gserviceaccount.com",
    ),
    Option(
        "zone",
        "the zone (it pins the zone); default: the offer's, else <region>-a",
        example="us-central1-a",
        pattern=_ZONE,
        invalid="not a GCP zone: {value!r}",
        hint="a zone looks like us-central1-a",
    ),
    Option(
        "termination_action",
        "what a preemption does to the VM: DELETE, or STOP (its disk bills on)",
        example="STOP",
        default="DELETE",
        case="upper",
        choices=("DELETE", "STOP"),
        invalid="the termination_action option must be DELETE or STOP, not {value!r}",
        hint="DELETE leaves nothing behind to pay for",
    ),
    Option(
        "external_ip",
        "whether the VM gets a public address (the boot script downloads packages)",
        example="false",
        default="true",
        case="lower",
        choices=("true", "false"),
        invalid="the external_ip option must be true or false",
        hint="false needs Cloud NAT for the boot script's downloads",
    ),
    Option(
        "disk_gb", "the boot disk's size in GB", example="200", default="100", whole=(10, 65536)
    ),
    Option("disk_type", "the boot disk's type", example="pd-ssd", default="pd-balanced"),
    Option(
        "network",
        "the VPC network",
        example="global/networks/default",
        default="global/networks/default",
    ),
    Option(
        "subnetwork",
        "the subnetwork (instead of a network)",
        example="regions/us-central1/subnetworks/jobs",
    ),
    Option(
        "scopes",
        "OAuth scopes of the VM's service account, comma-separated",
        example=DEFAULT_SCOPES[0],
        default=",".join(DEFAULT_SCOPES),
    ),
    placement_option("compact", "under the job's compact placement policy"),
)


def label_value(text: str) -> str:
    """``text`` as a GCP label value: lower case, letters, digits, ``_`` and ``-``, at
    most 63 characters.

    >>> label_value("Alice@Example.com"), label_value("run-1")
    ('alice-example-com', 'run-1')
    """
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def labels(spec: LaunchSpec, attempt: int) -> dict[str, str]:
    """The job's tags as GCP labels (``costguard-`` keys; the expiry in Unix seconds).

    >>> from datetime import datetime, UTC
    >>> spec = LaunchSpec("Run.1", "gs://b/r", ("true",), "me@x.org",
    ...                   datetime(2026, 12, 2, tzinfo=UTC))
    >>> labels(spec, 2)["costguard-expires-at"], labels(spec, 2)["costguard-job"]
    ('1796169600', 'run-1')
    """
    out = {}
    for key, value in spec.tags(attempt).items():
        name = gcp_label(key)
        if key == EXPIRES_TAG:
            out[name] = str(int(spec.expires_at.timestamp()))
        else:
            out[name] = label_value(value)
    return out


def classify(status: str, preempted: bool) -> State:
    """A Compute Engine instance status as a launcher :class:`State`.

    >>> classify("STAGING", False), classify("TERMINATED", True)
    (<State.PENDING: 'pending'>, <State.PREEMPTED: 'preempted'>)
    >>> classify("TERMINATED", False), classify("RUNNING", False)
    (<State.STOPPED: 'stopped'>, <State.RUNNING: 'running'>)
    """
    if status in ("PROVISIONING", "STAGING", "REPAIRING"):
        return State.PENDING
    if status == "RUNNING":
        return State.RUNNING
    return State.PREEMPTED if preempted else State.STOPPED


def _status_of(handle: Handle, item: Any) -> Status:
    """The :class:`Status` of ``handle`` from its VM as Compute Engine shows it (a stopped
    VM not yet checked for a preemption)."""
    started = item.last_start_timestamp or item.creation_timestamp
    return Status(
        handle,
        classify(item.status, False),
        item.status_message or item.status,
        launched_at=gcp_clouds.timestamp(started) if started else None,
    )


_QUOTA = re.compile(r"Quota '[A-Z0-9_]+' exceeded")


def quota_refusal(exc: BaseException) -> str | None:
    """The message of an immediate quota refusal (HTTP 403, reason ``quotaExceeded``, or
    the ``Quota '...' exceeded`` text), or None for any other 403 (a permission problem).

    >>> from google.api_core.exceptions import Forbidden
    >>> quota_refusal(Forbidden("Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."))
    "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."
    >>> quota_refusal(Forbidden("Required 'compute.instances.create' permission")) is None
    True
    """
    message = str(getattr(exc, "message", "") or exc)
    reasons = {
        str(e.get("reason", "")) for e in getattr(exc, "errors", None) or [] if isinstance(e, dict)
    }
    if "quotaExceeded" in reasons or _QUOTA.search(message):
        return message
    return None


#: The reasons of a refusal for the project's request rate (Compute Engine's API rate
#: limits: HTTP 403 or 429), not for quota or capacity.
RATE_LIMIT_REASONS = ("rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED")


def throttled(exc: BaseException, action: str) -> base.ThrottledError | None:
    """An insert refused for the request rate (an HTTP 429, or a 403 whose reason is
    ``rateLimitExceeded``) as a :class:`ThrottledError` (asked again later), else None.

    >>> from google.api_core.exceptions import Forbidden, TooManyRequests
    >>> throttled(TooManyRequests("Too many requests"), "creating vm-1").code
    '429'
    >>> rate = Forbidden("Rate Limit Exceeded", errors=[{"reason": "rateLimitExceeded"}])
    >>> throttled(rate, "creating vm-1").code, throttled(Forbidden("no permission"), "x")
    ('rateLimitExceeded', None)
    """
    code = str(getattr(exc, "code", "") or "")
    reasons = [
        str(e.get("reason", "")) for e in getattr(exc, "errors", None) or [] if isinstance(e, dict)
    ]
    limited = [r for r in reasons if r in RATE_LIMIT_REASONS]
    if code != "429" and not limited:
        return None
    message = str(getattr(exc, "message", "") or exc)
    return base.ThrottledError(
        f"Google Cloud throttled {action}: {message}", code=limited[0] if limited else code
    )


def _accelerators(compute: Any, offer: Offer, zone: str) -> list[Any]:
    """The GPUs attached to an N1 machine (the accelerator-optimised families have them
    built in: none attached)."""
    family = offer.instance_type.split("-")[0]
    if family in gcp_clouds.GPU_FAMILIES or not offer.gpu_count:
        return []
    accelerator = ACCELERATOR_TYPES.get(offer.gpu.upper())
    if accelerator is None:
        msg = f"no {offer.gpu} accelerator can be attached to {offer.instance_type}"
        raise InputError(msg, hint=f"N1 machines take {', '.join(ACCELERATOR_TYPES)}")
    return [
        compute.AcceleratorConfig(
            accelerator_type=f"zones/{zone}/acceleratorTypes/{accelerator}",
            accelerator_count=offer.gpu_count,
        )
    ]


def _scheduling(compute: Any, offer: Offer, values: Mapping[str, str]) -> Any:
    """Spot (with the termination action chosen) or standard; never migrated or restarted:
    GPUs cannot live-migrate, and a preempted Spot VM must not come back by itself."""
    scheduling = compute.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=False)
    if offer.market is Market.SPOT:
        scheduling.provisioning_model = "SPOT"
        scheduling.instance_termination_action = values["termination_action"]
    else:
        scheduling.provisioning_model = "STANDARD"
    return scheduling


def _network(compute: Any, values: Mapping[str, str]) -> Any:
    """The VM's one interface: in the subnetwork, else the network; a public address
    unless ``external_ip=false``."""
    network = compute.NetworkInterface()
    if values.get("subnetwork"):
        network.subnetwork = values["subnetwork"]
    else:
        network.network = values["network"]
    if values["external_ip"] == "true":
        network.access_configs = [compute.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    return network


def _boot_disk(compute: Any, values: Mapping[str, str], zone: str, tags: dict[str, str]) -> Any:
    """The boot disk from the image, deleted with the VM, labelled as the VM is."""
    return compute.AttachedDisk(
        boot=True,
        auto_delete=True,
        initialize_params=compute.AttachedDiskInitializeParams(
            source_image=values["image"],
            disk_size_gb=int(values["disk_gb"]),
            disk_type=f"zones/{zone}/diskTypes/{values['disk_type']}",
            labels=tags,
        ),
    )


def network_tag(job_id: str) -> str:
    """The network tag of a gang's VMs, and the name of the job's firewall rule.

    >>> network_tag("cg-alice-20261206-0955-ab12")
    'costguard-cg-alice-20261206-0955-ab12'
    """
    return f"costguard-{label_value(check_job_id(job_id, 'the job to launch'))}"[:63].rstrip("-")


def gang_name(job_id: str, attempt: int, rank: int) -> str:
    """The name of node ``rank``'s VM in attempt ``attempt`` of a gang.

    >>> gang_name("Run-1", 2, 0)
    'costguard-run-1-2-n0'
    """
    suffix = f"-n{rank}"
    return bootstrap.resource_name(job_id, attempt, 63 - len(suffix)) + suffix


def gang_firewall(compute: Any, tag: str, network: str) -> Any:
    """The job's firewall rule: ingress TCP on the rendezvous and collective ports, from
    and to the VMs with the job's network tag ``tag`` only."""
    low, high = bootstrap.COLLECTIVE_PORTS
    return compute.Firewall(
        name=tag,
        network=network,
        direction="INGRESS",
        description="costguard: a gang's nodes reach each other, nothing else reaches them",
        source_tags=[tag],
        target_tags=[tag],
        allowed=[
            compute.Allowed(I_p_protocol="tcp", ports=[str(bootstrap.RDZV_PORT), f"{low}-{high}"])
        ],
    )


def _is_gang_firewall(found: Any, tag: str) -> bool:
    """Whether the rule ``found`` opens only what a gang's rule does (its own tag)."""
    return (
        list(found.source_tags) == [tag]
        and list(found.target_tags) == [tag]
        and not list(found.source_ranges)
        and str(found.direction) in ("INGRESS", "Direction.INGRESS")
    )


def _is_compact(policy: Any) -> bool:
    """Whether the resource policy ``policy`` is a compact placement (collocated) one."""
    collocation = policy.group_placement_policy.collocation
    return str(getattr(collocation, "name", collocation)) == "COLLOCATED"


def _properties(compute: Any, instance: Any, tag: str, policy: str = "") -> Any:
    """A bulk insert's ``instanceProperties`` from one VM's body: the same VM, its machine,
    accelerator and disk types by name (no zone), the gang's network tag and, when given,
    its compact placement policy (by name, as ``instanceProperties`` takes it)."""
    disks = []
    for disk in instance.disks:
        params = disk.initialize_params
        disks.append(
            compute.AttachedDisk(
                boot=disk.boot,
                auto_delete=disk.auto_delete,
                initialize_params=compute.AttachedDiskInitializeParams(
                    source_image=params.source_image,
                    disk_size_gb=params.disk_size_gb,
                    disk_type=gcp_clouds.last_segment(params.disk_type),
                    labels=dict(params.labels),
                ),
            )
        )
    return compute.InstanceProperties(
        machine_type=gcp_clouds.last_segment(instance.machine_type),
        labels=dict(instance.labels),
        scheduling=instance.scheduling,
        guest_accelerators=[
            compute.AcceleratorConfig(
                accelerator_type=gcp_clouds.last_segment(a.accelerator_type),
                accelerator_count=a.accelerator_count,
            )
            for a in instance.guest_accelerators
        ],
        disks=disks,
        network_interfaces=list(instance.network_interfaces),
        metadata=instance.metadata,
        service_accounts=list(instance.service_accounts),
        tags=compute.Tags(items=[tag]),
        resource_policies=[policy] if policy else [],
    )


def _refused(operation: Any, action: str) -> None:
    """A finished operation's ``error.errors`` as a :class:`CostguardError` naming them
    (nothing when there are none)."""
    errors = list(operation.error.errors)
    if errors:
        detail = "; ".join(f"{e.code}: {e.message}" for e in errors)
        msg = f"Google Cloud refused {action}: {detail}"
        raise CostguardError(msg)


class GcpLauncher(base.Launcher):
    """Compute Engine in one project (``project``, or each spec's ``project`` option).
    Pass ``credentials`` (or ready clients) to bypass Application Default Credentials;
    ``settings.gcp_endpoint`` redirects every call. Example::

        launcher = GcpLauncher(Settings.load(), project="my-lab")
    """

    provider = "gcp"
    OPTIONS = OPTIONS
    #: The most VM names one ``instances.aggregatedList`` of :meth:`statuses` filters by.
    list_names = LIST_NAMES

    def __init__(
        self,
        settings: Settings,
        *,
        project: str = "",
        credentials: Any = None,
        instances_client: Any = None,
        operations_client: Any = None,
        environ: Mapping[str, str] | None = None,
        poll_interval_s: float = 2.0,
        options: Mapping[str, str] | None = None,
        regions_client: Any = None,
        machine_types_client: Any = None,
    ) -> None:
        self.settings = settings
        self.options = dict(options or {})
        self._regions = regions_client
        self._machine_types = machine_types_client
        self.poll_interval_s = poll_interval_s
        self.project = project
        self._credentials = credentials
        self._instances = instances_client
        self._operations = operations_client
        self._gang_clients: dict[str, Any] = {}
        self._environ = environ

    def _client(self, name: str) -> Any:
        if self._credentials is None:
            self._credentials = gcp_clouds.default_credentials()
        return gcp_clouds.client("google.cloud.compute_v1", name, self.settings, self._credentials)

    @property
    def instances(self) -> Any:
        if self._instances is None:
            self._instances = self._client("InstancesClient")
        return self._instances

    @property
    def operations(self) -> Any:
        if self._operations is None:
            self._operations = self._client("ZoneOperationsClient")
        return self._operations

    @property
    def global_operations(self) -> Any:
        return self._gang_client("GlobalOperationsClient")

    @property
    def firewalls(self) -> Any:
        return self._gang_client("FirewallsClient")

    def _gang_client(self, name: str) -> Any:
        """A client only gangs use (their firewall rule), built on first use."""
        if name not in self._gang_clients:
            self._gang_clients[name] = self._client(name)
        return self._gang_clients[name]

    @property
    def regions(self) -> Any:
        if self._regions is None:
            self._regions = self._client("RegionsClient")
        return self._regions

    @property
    def machine_types(self) -> Any:
        if self._machine_types is None:
            self._machine_types = self._client("MachineTypesClient")
        return self._machine_types

    # ------------------------------------------------------------------ zones

    def zones(self, region: str, instance_type: str = "") -> list[str]:
        """The zones of ``region`` that are ``UP`` (``regions.get``: the region lists its
        zones) and offer ``instance_type`` (one ``machineTypes.aggregatedList`` by name),
        sorted; only the ``zone`` option's when one is given (it pins the zone).

        A zone without the machine type would refuse the insert at once (400 ``invalid``).
        An N1 machine's attached GPU is not in the listing: a zone without it refuses the
        insert the same way, a :class:`CapacityError` of that zone, and recovery tries the
        next one.
        """
        pinned = self.options.get("zone", "").strip()
        if pinned:
            return [pinned] if pinned.rsplit("-", 1)[0] == region else []
        project = self.options.get("project", "").strip() or self.project
        if not project:
            return []
        core = require("google.api_core.exceptions", gcp_clouds.EXTRA)
        try:
            found = self.regions.get(project=project, region=region)
        except core.NotFound:
            return []
        except gcp_clouds.errors() as exc:
            raise gcp_clouds.translate(exc, f"reading the region {region}") from None
        if found.status and found.status != "UP":
            return []
        names = (gcp_clouds.last_segment(url) for url in found.zones)
        up = sorted(name for name in names if _ZONE.fullmatch(name))
        if not instance_type or not up:
            return up
        offered = self._offering(project, instance_type)
        return [zone for zone in up if zone in offered]

    def _offering(self, project: str, instance_type: str) -> set[str]:
        """The zones that offer the machine type ``instance_type`` (a zone without it
        answers its scope with a warning instead of the type)."""
        compute = require("google.cloud.compute_v1", gcp_clouds.EXTRA)
        request = compute.AggregatedListMachineTypesRequest(
            project=project, filter=f'name = "{instance_type}"', max_results=500
        )
        found = set()
        try:
            for scope, scoped in self.machine_types.aggregated_list(request=request):
                if any(item.name == instance_type for item in scoped.machine_types):
                    found.add(gcp_clouds.last_segment(scope))
        except gcp_clouds.errors() as exc:
            raise gcp_clouds.translate(exc, f"listing the zones of {instance_type}") from None
        return found

    # ------------------------------------------------------------------ check

    def option_defaults(self) -> dict[str, str]:
        """The project the launcher was built with, when the job's options name none."""
        return {"project": self.project}

    def _project(self, spec: LaunchSpec) -> str:
        return OPTIONS.value(spec.options, "project", self.project)

    def check(self, spec: LaunchSpec) -> None:
        """Validate every option offline (no Google call) and render the boot script once."""
        super().check(spec)
        bootstrap.render(spec, 1, self.provider, environ=self._environ)

    # ----------------------------------------------------------------- launch

    def _zone(self, offer: Offer, spec: LaunchSpec) -> str:
        zone = offer.zone or OPTIONS.value(spec.options, "zone") or f"{offer.region}-a"
        if zone.rsplit("-", 1)[0] != offer.region:
            msg = f"zone {zone!r} is not in region {offer.region!r}"
            raise InputError(msg, hint="leave the zone option out, or pick one of the region")
        return zone

    def request(self, offer: Offer, spec: LaunchSpec, attempt: int) -> Any:
        """The ``compute_v1.Instance`` of one attempt (no call made): for dry runs."""
        self.check(spec)
        if offer.provider != self.provider:
            msg = f"an offer on {offer.provider} cannot be launched on GCP"
            raise InputError(msg, hint="pick a GCP offer")
        compute = require("google.cloud.compute_v1", gcp_clouds.EXTRA)
        values = OPTIONS.check(spec.options, self.provider, self.option_defaults())
        zone = self._zone(offer, spec)
        if offer.instance_type.split("-")[0] == "tpu":
            msg = f"{offer.instance_type} is a TPU, not a VM type"
            raise InputError(msg, hint="costguard launch runs GPU VMs: pick a GPU offer")
        script = bootstrap.render(spec, attempt, self.provider, environ=self._environ)
        scopes = [s.strip() for s in values["scopes"].split(",") if s.strip()]
        return compute.Instance(
            name=bootstrap.resource_name(spec.job_id, attempt, 63),
            machine_type=f"zones/{zone}/machineTypes/{offer.instance_type}",
            labels=labels(spec, attempt),
            scheduling=_scheduling(compute, offer, values),
            guest_accelerators=_accelerators(compute, offer, zone),
            disks=[_boot_disk(compute, values, zone, labels(spec, attempt))],
            network_interfaces=[_network(compute, values)],
            metadata=compute.Metadata(items=[compute.Items(key="startup-script", value=script)]),
            service_accounts=[
                compute.ServiceAccount(email=values["service_account"], scopes=scopes)
            ],
        )

    def _wait(
        self, operation: Any, project: str, zone: str, action: str, *, region: str = ""
    ) -> Any:
        """Poll a zone operation (a regional one when ``region`` is given: a placement
        policy's; a global one when ``zone`` is empty too: a firewall rule's) until it is
        DONE, for at most :data:`OPERATION_TIMEOUT_S`.

        Polled with our own ``ZoneOperationsClient``: the one inside ``InstancesClient``
        ignores the endpoint override and would poll the public API.
        """
        deadline = time.monotonic() + OPERATION_TIMEOUT_S
        delay = self.poll_interval_s
        while str(getattr(operation.status, "name", operation.status)) != "DONE":
            if time.monotonic() + delay > deadline:
                msg = f"{action} did not finish within {OPERATION_TIMEOUT_S} s"
                raise CostguardError(msg, hint="costguard jobs status shows what came of it")
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
            if zone:
                operation = self.operations.get(
                    project=project, zone=zone, operation=operation.name
                )
            elif region:
                operation = self._gang_client("RegionOperationsClient").get(
                    project=project, region=region, operation=operation.name
                )
            else:
                operation = self.global_operations.get(project=project, operation=operation.name)
        return operation

    def launch(self, offer: Offer, spec: LaunchSpec, attempt: int) -> Handle:
        """``instances.insert``, waited for; a :class:`CapacityError` when the zone is full."""
        instance = self.request(offer, spec, attempt)
        project = self._project(spec)
        zone = gcp_clouds.last_segment(instance.machine_type.rsplit("/machineTypes/", 1)[0])
        # A fresh request id per launch: Compute Engine answers a request id it has seen
        # with that request's (finished) operation and creates nothing (compute.proto,
        # request_id), so one derived from the name would "launch" nothing when a job id is
        # reused. The SDK resends this same request object on its own retries.
        request_id = str(uuid.uuid4())
        action = f"creating {instance.name} in {zone}"
        compute = require("google.cloud.compute_v1", gcp_clouds.EXTRA)
        core = require("google.api_core.exceptions", gcp_clouds.EXTRA)
        request = compute.InsertInstanceRequest(
            project=project, zone=zone, instance_resource=instance, request_id=request_id
        )
        target_id = ""
        try:
            operation = self._wait(
                self.instances.insert_unary(request=request), project, zone, action
            )
            target_id = str(operation.target_id or "")
        except core.Conflict:
            operation = None  # this attempt's VM exists already: a retried launch, use it
        except gcp_clouds.errors() as exc:
            raise self._refusal(exc, offer, zone, action) from None
        if operation is not None:
            self._raise_errors(list(operation.error.errors), offer, zone, action)
        return Handle(
            provider=self.provider,
            region=offer.region,
            instance_id=instance.name,
            zone=zone,
            extra={"project": project, "id": target_id, "attempt": str(attempt)},
        )

    def _refusal(self, exc: BaseException, offer: Offer, zone: str, action: str) -> CostguardError:
        """An insert's (or a bulk insert's) immediate refusal: a :class:`ThrottledError`
        for the request rate (429, or a 403 ``rateLimitExceeded``), a :class:`CapacityError`
        when the zone lacks the type (400 ``invalid``, "does not exist in zone") or the
        quota is spent (403), else the refusal translated."""
        core = require("google.api_core.exceptions", gcp_clouds.EXTRA)
        place = f"{self.provider}/{offer.region}/{zone}"
        limited = throttled(exc, action)
        if isinstance(exc, (core.Forbidden, core.TooManyRequests)) and limited is not None:
            return limited
        if isinstance(exc, core.BadRequest):
            message = str(getattr(exc, "message", "") or exc)
            if _NOT_IN_ZONE.search(message):
                text = f"Google Cloud has no {offer.instance_type} ({offer.gpu}) in {zone}: "
                return CapacityError(text + message, place=place, code="RESOURCE_NOT_FOUND_IN_ZONE")
        if isinstance(exc, core.Forbidden):
            quota = quota_refusal(exc)
            if quota is not None:
                text = f"Google Cloud has no quota for {offer.instance_type} in {zone}: {quota}"
                return CapacityError(text, place=place, code="QUOTA_EXCEEDED")
        return gcp_clouds.translate(exc, action)

    def _raise_errors(self, errors: list[Any], offer: Offer, zone: str, action: str) -> None:
        """A finished insert's ``error.errors``: a :class:`CapacityError` for a full zone
        or a spent quota, else a :class:`CostguardError` naming them; nothing if none."""
        if not errors:
            return
        full = [e.code for e in errors if e.code in CAPACITY_CODES]
        if full:
            text = f"Google Cloud has no room for {offer.instance_type} in {zone}: {full[0]}"
            raise CapacityError(text, place=f"{self.provider}/{offer.region}/{zone}", code=full[0])
        detail = "; ".join(f"{e.code}: {e.message}" for e in errors)
        msg = f"Google Cloud refused {action}: {detail}"
        raise CostguardError(msg)

    # ------------------------------------------------------------------- gang

    def launch_gang(self, offer: Offer, spec: LaunchSpec, attempt: int) -> tuple[Handle, ...]:
        """The ``spec.nodes`` VMs of attempt ``attempt``, all or none, in one zone: one
        zonal ``instances.bulkInsert`` with ``count`` and ``minCount`` both ``spec.nodes``
        ("If min_count instances cannot be created, then no instances will be created"),
        each VM named for its rank (``<attempt's name>-n<rank>``) and carrying the job's
        network tag, which the job's firewall rule opens the rendezvous and collective
        ports to, from that tag only. Then each VM is told its rank and node 0's
        private address in its own metadata (``instances.setMetadata``), which the node
        reads from the metadata server. A bulk insert that leaves fewer VMs than the gang,
        or anything failing after it, deletes those it made before raising (a
        :class:`CapacityError` when the zone had no room). The handles come in rank order.
        """
        if spec.nodes == 1:
            return (self.launch(offer, spec, attempt),)
        instance = self.request(offer, spec, attempt)
        compute = require("google.cloud.compute_v1", gcp_clouds.EXTRA)
        core = require("google.api_core.exceptions", gcp_clouds.EXTRA)
        project = self._project(spec)
        zone = self._zone(offer, spec)
        values = OPTIONS.check(spec.options, self.provider, self.option_defaults())
        tag = network_tag(spec.job_id)
        self._gang_firewall(project, values["network"], tag)
        policy = (
            self._compact_policy(project, offer.region, tag)
            if values.get("placement") == "compact"
            else ""
        )
        names = [gang_name(spec.job_id, attempt, rank) for rank in range(spec.nodes)]
        resource = compute.BulkInsertInstanceResource(
            count=spec.nodes,
            min_count=spec.nodes,
            instance_properties=_properties(compute, instance, tag, policy),
            per_instance_properties={
                name: compute.BulkInsertInstanceResourcePerInstanceProperties(name=name)
                for name in names
            },
        )
        action = f"creating {spec.nodes} x {offer.instance_type} in {zone}"
        handles = [
            Handle(
                self.provider,
                offer.region,
                name,
                zone,
                {
                    "project": project,
                    "attempt": str(attempt),
                    "node": str(rank),
                    "nodes": str(spec.nodes),
                },
            )
            for rank, name in enumerate(names)
        ]
        try:
            try:
                operation = self._wait(
                    self.instances.bulk_insert_unary(
                        request=compute.BulkInsertInstanceRequest(
                            project=project,
                            zone=zone,
                            bulk_insert_instance_resource_resource=resource,
                            request_id=str(uuid.uuid4()),
                        )
                    ),
                    project,
                    zone,
                    action,
                )
            except core.Conflict:
                operation = None  # this attempt's VMs exist already: a retried launch
            except gcp_clouds.errors() as exc:
                raise self._refusal(exc, offer, zone, action) from None
            if operation is not None:
                self._raise_errors(list(operation.error.errors), offer, zone, action)
            return self._tell_gang(offer, handles, spec, attempt)
        except BaseException as exc:
            left = self._end_gang(handles, spec)
            if left is not None:
                raise left from exc
            raise

    def _end_gang(self, handles: list[Handle], spec: LaunchSpec) -> CostguardError | None:
        """Delete the VMs of a gang that cannot run whole: those that exist and carry the
        job's label and the attempt's (a VM of the same name that is not the job's is
        left alone). Every VM is tried; the error naming those not deleted, with the
        command that deletes them, or ``None``."""
        core = require("google.api_core.exceptions", gcp_clouds.EXTRA)
        left = []
        for handle in handles:
            where = {"project": handle.extra["project"], "zone": handle.zone}
            try:
                item = self.instances.get(**where, instance=handle.instance_id)
            except core.NotFound:
                continue
            except gcp_clouds.errors():
                left.append(handle)  # cannot tell: it may exist and bill
                continue
            labels = item.labels
            if labels.get(gcp_label(JOB_TAG)) != label_value(spec.job_id) or labels.get(
                gcp_label(ATTEMPT_TAG)
            ) != handle.extra.get("attempt"):
                continue
            try:
                self.terminate(handle)
            except CostguardError:
                left.append(handle)
        if not left:
            return None
        names = ", ".join(h.instance_id for h in left)
        msg = f"the gang could not start whole, and Google Cloud did not delete {names}: "
        msg += "they may still run and bill"
        commands = "; ".join(
            f"gcloud compute instances delete {h.instance_id} --zone {h.zone} "
            f"--project {h.extra['project']} --quiet"
            for h in left
        )
        return CostguardError(msg, hint=commands)

    def _tell_gang(
        self, offer: Offer, handles: list[Handle], spec: LaunchSpec, attempt: int
    ) -> tuple[Handle, ...]:
        """Every VM of the gang read (a :class:`CapacityError` if any is missing: the bulk
        insert left fewer than its minimum) and proven this job's by its label, then told
        its rank and the rendezvous in its metadata, signed for the VM
        (:meth:`LaunchSpec.told`); the handles with the VMs' ids."""
        core = require("google.api_core.exceptions", gcp_clouds.EXTRA)
        project, zone = handles[0].extra["project"], handles[0].zone
        found = {}
        for handle in handles:
            try:
                found[handle.instance_id] = self.instances.get(
                    project=project, zone=zone, instance=handle.instance_id
                )
            except core.NotFound:
                continue
            except gcp_clouds.errors() as exc:
                raise gcp_clouds.translate(exc, f"reading {handle.instance_id}") from None
        if len(found) != len(handles):
            msg = (
                f"Google Cloud made {len(found)} of the {len(handles)} VMs of the gang in "
                f"{zone} (the {len(found)} made are deleted: all or none)"
            )
            raise CapacityError(msg, place=f"{offer.region_place}/{zone}", code="MIN_COUNT")
        job_label = label_value(spec.job_id)
        if any(item.labels.get(gcp_label(JOB_TAG)) != job_label for item in found.values()):
            msg = f"a VM named like this job's gang in {zone} is not labelled as the job's"
            raise CostguardError(msg, hint="delete it if it is a leftover, then launch again")
        first = found[handles[0].instance_id]
        address = node.private_ipv4(first.network_interfaces[0].network_i_p)
        if address is None:
            msg = f"node 0 ({handles[0].instance_id}) has no private IPv4 address"
            raise CostguardError(msg, hint="this launch was ended; launch again")
        for rank, handle in enumerate(handles):
            item = found[handle.instance_id]
            told = node.signed(spec, attempt, handle.instance_id, rank, address)
            told = {gcp_label(k): v for k, v in told.items()}
            self._set_metadata(project, zone, item, told)
        return tuple(
            Handle(
                h.provider,
                h.region,
                h.instance_id,
                h.zone,
                {**h.extra, "id": str(found[h.instance_id].id)},
            )
            for h in handles
        )

    def _set_metadata(self, project: str, zone: str, item: Any, told: Mapping[str, str]) -> None:
        """``instances.setMetadata`` of ``item`` with ``told`` added (its other items kept,
        its fingerprint sent, so a concurrent change is refused rather than lost)."""
        compute = require("google.cloud.compute_v1", gcp_clouds.EXTRA)
        kept = [i for i in item.metadata.items if i.key not in told]
        metadata = compute.Metadata(
            fingerprint=item.metadata.fingerprint,
            items=[*kept, *(compute.Items(key=k, value=v) for k, v in told.items())],
        )
        action = f"telling {item.name} its node rank"
        try:
            operation = self.instances.set_metadata_unary(
                project=project, zone=zone, instance=item.name, metadata_resource=metadata
            )
            operation = self._wait(operation, project, zone, action)
        except gcp_clouds.errors() as exc:
            raise gcp_clouds.translate(exc, action) from None
        _refused(operation, action)

    def _gang_firewall(self, project: str, network: str, tag: str) -> None:
        """The job's firewall rule (made once): TCP on the rendezvous port and the
        collective ports into VMs with the job's network tag, from VMs with that tag only."""
        compute = require("google.cloud.compute_v1", gcp_clouds.EXTRA)
        core = require("google.api_core.exceptions", gcp_clouds.EXTRA)
        rule = gang_firewall(compute, tag, network)
        action = f"making the firewall rule {tag}"
        try:
            operation = self._wait(
                self.firewalls.insert_unary(project=project, firewall_resource=rule),
                project,
                "",
                action,
            )
        except core.Conflict:
            try:
                found = self.firewalls.get(project=project, firewall=tag)
            except gcp_clouds.errors() as exc:
                raise gcp_clouds.translate(exc, action) from None
            if not _is_gang_firewall(found, tag):
                msg = f"the firewall rule {tag} exists and is not this job's: costguard leaves it"
                raise CostguardError(
                    msg, hint="delete it if it is a leftover, then launch again"
                ) from None
            return
        except gcp_clouds.errors() as exc:
            raise gcp_clouds.translate(exc, action) from None
        _refused(operation, action)

    def _compact_policy(self, project: str, region: str, name: str) -> str:
        """The job's compact placement policy in ``region`` (made once; one of that name
        that is not a compact placement policy is refused), by name."""
        compute = require("google.cloud.compute_v1", gcp_clouds.EXTRA)
        core = require("google.api_core.exceptions", gcp_clouds.EXTRA)
        policies = self._gang_client("ResourcePoliciesClient")
        action = f"making the placement policy {name} in {region}"
        policy = compute.ResourcePolicy(
            name=name,
            description="costguard: a gang's VMs close together",
            group_placement_policy=compute.ResourcePolicyGroupPlacementPolicy(
                collocation="COLLOCATED"
            ),
        )
        try:
            operation = policies.insert_unary(
                project=project, region=region, resource_policy_resource=policy
            )
            _refused(self._wait(operation, project, "", action, region=region), action)
        except core.Conflict:
            try:
                found = policies.get(project=project, region=region, resource_policy=name)
            except gcp_clouds.errors() as exc:
                raise gcp_clouds.translate(exc, action) from None
            if not _is_compact(found):
                msg = f"the resource policy {name} in {region} is not a compact placement"
                raise CostguardError(msg, hint="delete it if it is a leftover") from None
        except gcp_clouds.errors() as exc:
            raise gcp_clouds.translate(exc, action) from None
        return name

    def release(self, spec: LaunchSpec) -> None:
        """Delete the job's firewall rule, when it is the one a gang of the job made (its
        source and target tags the job's network tag, nothing else), and its compact
        placement policies (found by name in every region, compact ones only); gone is
        fine."""
        core = require("google.api_core.exceptions", gcp_clouds.EXTRA)
        project = self._project(spec)
        tag = network_tag(spec.job_id)
        action = f"deleting the firewall rule {tag}"
        try:
            found = self.firewalls.get(project=project, firewall=tag)
            if _is_gang_firewall(found, tag):
                self._wait(
                    self.firewalls.delete_unary(project=project, firewall=tag), project, "", action
                )
        except core.NotFound:
            pass
        except gcp_clouds.errors() as exc:
            raise gcp_clouds.translate(exc, action) from None
        compute = require("google.cloud.compute_v1", gcp_clouds.EXTRA)
        policies = self._gang_client("ResourcePoliciesClient")
        listing = compute.AggregatedListResourcePoliciesRequest(
            project=project, filter=f'name = "{tag}"'
        )
        action = f"deleting the placement policies {tag}"
        try:
            for scope, scoped in policies.aggregated_list(request=listing):
                region = gcp_clouds.last_segment(scope)
                for policy in scoped.resource_policies:
                    if policy.name == tag and _is_compact(policy):
                        operation = policies.delete_unary(
                            project=project, region=region, resource_policy=tag
                        )
                        self._wait(operation, project, "", action, region=region)
        except gcp_clouds.errors() as exc:
            raise gcp_clouds.translate(exc, action) from None

    # ----------------------------------------------------------------- status

    def _preempted(self, handle: Handle) -> str:
        """The message of the system event that took this VM (a preemption, a host
        maintenance or error stop), or ``""`` when there is none."""
        compute = require("google.cloud.compute_v1", gcp_clouds.EXTRA)
        request = compute.ListZoneOperationsRequest(
            project=handle.extra["project"],
            zone=handle.zone,
            filter=" OR ".join(f'(operationType = "{kind}")' for kind in SYSTEM_EVENTS),
            max_results=500,
        )
        suffix = f"/zones/{handle.zone}/instances/{handle.instance_id}"
        pager = self.operations.list(request=request)
        for page_number, page in enumerate(pager.pages):
            for operation in page.items:
                mine = handle.extra.get("id") and str(operation.target_id) == handle.extra["id"]
                if operation.operation_type in SYSTEM_EVENTS and (
                    mine or operation.target_link.endswith(suffix)
                ):
                    return operation.status_message or operation.operation_type
            if page_number >= 20:  # bounded: a zone with that many preemptions in its log
                break
        return ""

    def status(self, handle: Handle) -> Status:
        """``instances.get``; a stopped or vanished VM is checked for a preemption."""
        core = require("google.api_core.exceptions", gcp_clouds.EXTRA)
        where = {"project": handle.extra["project"], "zone": handle.zone}
        try:
            try:
                item = self.instances.get(**where, instance=handle.instance_id)
            except core.NotFound:
                preempted = self._preempted(handle)
                if preempted:
                    return Status(handle, State.PREEMPTED, preempted)
                return Status(handle, State.MISSING, "Compute Engine no longer knows the VM")
            found = _status_of(handle, item)
            if found.state is State.STOPPED:
                preempted = self._preempted(handle)
                if preempted:
                    found = replace(found, state=State.PREEMPTED, detail=preempted)
        except gcp_clouds.errors() as exc:
            raise gcp_clouds.translate(exc, f"reading {handle.instance_id}") from None
        return found

    def statuses(self, handles: Sequence[Handle]) -> list[Status]:
        """Many VMs' states from one ``instances.aggregatedList`` per project (per
        :attr:`list_names` of them) filtered by their names, ``(name = "a") OR (name =
        "b")``; a VM it does not show running or starting is read alone by :meth:`status`,
        which checks it for a preemption (:meth:`Launcher.batched
        <costguard.spot.launcher.base.Launcher.batched>`)."""
        return self.batched(handles, self._listed)

    def _listed(self, handles: Sequence[Handle]) -> dict[int, Status]:
        compute = require("google.cloud.compute_v1", gcp_clouds.EXTRA)
        projects: dict[str, list[int]] = {}
        for at, handle in enumerate(handles):
            # A name that is no VM name (job.json is not trusted) is read alone, never
            # written into a filter.
            if _NAME.fullmatch(handle.instance_id) and handle.extra.get("project"):
                projects.setdefault(handle.extra["project"], []).append(at)
        shown: dict[int, Status] = {}
        for project, positions in projects.items():
            for start in range(0, len(positions), self.list_names):
                chunk = positions[start : start + self.list_names]
                names = dict.fromkeys(handles[at].instance_id for at in chunk)
                request = compute.AggregatedListInstancesRequest(
                    project=project, filter=" OR ".join(f'(name = "{n}")' for n in names)
                )
                seen = {}
                try:
                    for scope, scoped in self.instances.aggregated_list(request=request):
                        zone = gcp_clouds.last_segment(scope)
                        seen.update({(zone, item.name): item for item in scoped.instances})
                except gcp_clouds.errors() as exc:
                    action = f"listing {len(names)} VMs in {project}"
                    raise gcp_clouds.translate(exc, action) from None
                for at in chunk:
                    item = seen.get((handles[at].zone, handles[at].instance_id))
                    if item is not None:
                        shown[at] = _status_of(handles[at], item)
        return shown

    def stopped(self, handle: Handle, job_id: str) -> base.Stopped | None:
        """The attempt's VM when Compute Engine stopped it (status ``TERMINATED``: host
        maintenance, a failed host, a preemption with the termination action ``STOP``)
        and it is provably this job's: its ``costguard-job`` label, and the id
        ``job.json`` recorded. ``None`` when it is gone, runs, or cannot be proven the
        job's (a VM of that name someone else created): such a VM is never touched."""
        core = require("google.api_core.exceptions", gcp_clouds.EXTRA)
        project, zone, name = handle.extra["project"], handle.zone, handle.instance_id
        try:
            item = self.instances.get(project=project, zone=zone, instance=name)
        except core.NotFound:
            return None
        except gcp_clouds.errors() as exc:
            raise gcp_clouds.translate(exc, f"reading {handle.instance_id}") from None
        known = handle.extra.get("id", "")
        if (
            item.status != "TERMINATED"
            or item.labels.get(gcp_label(JOB_TAG)) != label_value(job_id)
            or (known and str(item.id) != known)
        ):
            return None
        action = str(item.scheduling.instance_termination_action or "")
        return base.Stopped(
            handle,
            disk_gb=sum(int(d.disk_size_gb or 0) for d in item.disks if d.type_ == "PERSISTENT"),
            kept_because="its termination_action=STOP asks to keep it" if action == "STOP" else "",
            delete_command=f"gcloud compute instances delete {name} --zone {zone} "
            f"--project {project}",
        )

    # -------------------------------------------------------------- terminate

    def terminate(self, handle: Handle) -> None:
        """``instances.delete``, waited for; a VM that is already gone is fine."""
        core = require("google.api_core.exceptions", gcp_clouds.EXTRA)
        project = handle.extra["project"]
        action = f"deleting {handle.instance_id}"
        try:
            operation = self.instances.delete_unary(
                project=project, zone=handle.zone, instance=handle.instance_id
            )
            operation = self._wait(operation, project, handle.zone, action)
        except core.NotFound:
            return
        except gcp_clouds.errors() as exc:
            raise gcp_clouds.translate(exc, action) from None
        errors = list(operation.error.errors)
        if errors and not all(e.code == "RESOURCE_NOT_FOUND" for e in errors):
            detail = "; ".join(f"{e.code}: {e.message}" for e in errors)
            msg = f"Google Cloud refused {action}: {detail}"
            raise CostguardError(msg)

    # ------------------------------------------------------------------- find

    def find(self, job_id: str) -> list[Handle]:
        """Live VMs labelled ``costguard-job=<job_id>``: one aggregated listing."""
        if not self.project:
            msg = "finding the VMs of a job on gcp needs a project"
            raise InputError(msg, hint="give the launcher the project the job runs in")
        compute = require("google.cloud.compute_v1", gcp_clouds.EXTRA)
        key = gcp_label(JOB_TAG)
        value = label_value(check_job_id(job_id, "the job to find"))
        request = compute.AggregatedListInstancesRequest(
            project=self.project, filter=f'labels.{key} = "{value}"'
        )
        found = []
        try:
            for scope, scoped in self.instances.aggregated_list(request=request):
                zone = gcp_clouds.last_segment(scope)
                for item in scoped.instances:
                    if item.labels.get(key) == value and item.status in LIVE_STATES:
                        found.append(
                            Handle(
                                provider=self.provider,
                                region=zone.rsplit("-", 1)[0],
                                instance_id=item.name,
                                zone=zone,
                                extra={
                                    "project": self.project,
                                    "id": str(item.id),
                                    "attempt": item.labels.get(gcp_label(ATTEMPT_TAG), ""),
                                    "owner": item.labels.get(gcp_label(OWNER_TAG), ""),
                                    **node.noted(
                                        {i.key: i.value for i in item.metadata.items},
                                        gcp_label(NODE_RANK_TAG),
                                    ),
                                },
                            )
                        )
        except gcp_clouds.errors() as exc:
            raise gcp_clouds.translate(exc, f"listing the VMs of {job_id}") from None
        return found
