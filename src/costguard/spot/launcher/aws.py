"""AWS: one EC2 instance per attempt, through ``RunInstances``.

Every instance is created in one call with everything it needs: the spot market options
(one-time request, terminate on interruption) unless the offer is on-demand, IMDSv2 only
(``HttpTokens=required``, a hop limit of 1 unless asked), the job's tags on the instance
*and* its volumes (so ``ec2:RunInstances`` can be allowed only with the tag, see
``infra/aws/launcher-policy.json``), an instance profile instead of any key in user-data,
the boot script of :mod:`costguard.spot.bootstrap`, and a guest shutdown that terminates.
The client token is derived from the job and attempt, so a controller that retries a
launch after losing the answer gets the same instance, not a second one.

What became of an instance is read from ``DescribeInstances``: the state, and for a
stopped or terminated one its ``StateReason`` code (``Server.SpotInstanceTermination`` is a
reclaim, ``Client.UserInitiatedShutdown`` is someone's doing).

Options (``LaunchSpec.options``): ``image`` (AMI id, required), ``instance_profile``
(name or ARN, required), ``subnet``, ``security_groups`` (comma-separated ids),
``key_name``, ``disk_gb`` with ``root_device`` (default ``/dev/sda1``),
``metadata_hop_limit`` (default 1; 2 for jobs in containers), ``max_price`` (spot cap,
USD/h; default the on-demand price), plus those of :mod:`costguard.spot.bootstrap`.
``--max-price`` reaches ``SpotOptions.MaxPrice`` the same way (the two must agree when
both are given).

Zones: :meth:`AwsLauncher.zones` lists the region's available Availability Zones
(``DescribeAvailabilityZones``, zone type ``availability-zone``: no Local or Wavelength
Zones) where the instance type is offered (``DescribeInstanceTypeOfferings``; when EC2
names none, every available zone). A ``subnet`` option pins the zone (a subnet lives in
one), so with it the launcher names none and recovery moves between regions only.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from costguard.clouds import aws as aws_clouds
from costguard.errors import InputError
from costguard.pricing.catalog import Market
from costguard.spot import bootstrap
from costguard.spot.launcher.base import CapacityError, Handle, LaunchSpec, Offer, State, Status
from costguard.tags import ATTEMPT_TAG, JOB_TAG, check_job_id

#: States of an instance that runs or is about to (``find`` reports only these).
LIVE_STATES = ("pending", "running")
#: ``StateReason`` codes that mean the spot service took the instance back.
RECLAIM_CODES = (
    "Server.SpotInstanceTermination",
    "Server.SpotInstanceShutdown",
)
#: Error codes of ``RunInstances`` that another zone, region or market may not hit.
CAPACITY_CODES = (
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "SpotMaxPriceTooLow",
    "MaxSpotInstanceCountExceeded",
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
    "Unsupported",
)
_NOT_FOUND = ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed")
_AMI = re.compile(r"^ami-[0-9a-f]{8,17}$")
_SUBNET = re.compile(r"^subnet-[0-9a-f]{8,17}$")
_GROUP = re.compile(r"^sg-[0-9a-f]{8,17}$")
_PROFILE = re.compile(r"^(arn:aws[a-z-]*:iam::\d{12}:instance-profile/)?[\w+=,.@/-]{1,128}$")
_DEVICE = re.compile(r"^/dev/[a-z0-9]+$")


def classify(state: str, reason_code: str, spot: bool) -> State:
    """An EC2 instance state (and state reason code) as a launcher :class:`State`.

    >>> classify("running", "", True)
    <State.RUNNING: 'running'>
    >>> classify("terminated", "Server.SpotInstanceTermination", True)
    <State.PREEMPTED: 'preempted'>
    >>> classify("shutting-down", "Client.UserInitiatedShutdown", True)
    <State.TERMINATED: 'terminated'>
    >>> classify("stopped", "Client.UserInitiatedShutdown", False)
    <State.STOPPED: 'stopped'>
    """
    if state == "pending":
        return State.PENDING
    if state == "running":
        return State.RUNNING
    if spot and reason_code in RECLAIM_CODES:
        return State.PREEMPTED
    if state in ("stopping", "stopped"):
        return State.STOPPED
    return State.TERMINATED


def client_token(job_id: str, attempt: int) -> str:
    """The idempotency token of one attempt (at most 64 ASCII characters).

    >>> client_token("run-1", 2)
    'costguard-run-1-2'
    >>> len(client_token("x" * 80, 2))
    64
    """
    token = f"costguard-{job_id}-{attempt}"
    if len(token) <= 64 and token.isascii() and token.isprintable():
        return token
    digest = hashlib.sha256(token.encode()).hexdigest()
    return f"costguard-{digest}"[:64]


def _tags(pairs: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in pairs.items()]


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


class AwsLauncher:
    """EC2 in the regions of the offers it is given. ``clients(region)`` builds the EC2
    client (default :func:`costguard.clouds.aws.client`); ``regions`` are where
    :meth:`find` looks (besides every region this launcher has launched into). Example::

        launcher = AwsLauncher(regions=["us-east-1", "us-west-2"])
        handle = launcher.launch(offer, spec, attempt=1)
    """

    provider = "aws"

    def __init__(
        self,
        *,
        regions: Sequence[str] = (),
        clients: Callable[[str], Any] | None = None,
        environ: dict[str, str] | None = None,
        options: Mapping[str, str] | None = None,
    ) -> None:
        self.options = dict(options or {})
        self.regions = list(dict.fromkeys(regions))
        self._factory = clients or (lambda region: aws_clouds.client("ec2", region))
        self._clients: dict[str, Any] = {}
        self._environ = environ

    def _ec2(self, region: str) -> Any:
        if region not in self._clients:
            self._clients[region] = self._factory(region)
            if region not in self.regions:
                self.regions.append(region)
        return self._clients[region]

    # ------------------------------------------------------------------ check

    def check(self, spec: LaunchSpec) -> None:
        """Validate every option offline (no AWS call) and render the boot script once."""
        image = bootstrap.option(
            spec,
            "image",
            self.provider,
            "an AMI id with the NVIDIA driver, e.g. a Deep "
            "Learning AMI: image=ami-0123456789abcdef0",
        )
        if not _AMI.match(image):
            msg = f"the image option must be an AMI id like ami-0123456789abcdef0, not {image!r}"
            raise InputError(msg, hint="aws ec2 describe-images --owners amazon ...")
        profile = bootstrap.option(
            spec,
            "instance_profile",
            self.provider,
            "the instance reaches the checkpoint bucket with its role, never with keys: "
            "see infra/aws/launcher-instance-role-*.json, then instance_profile=costguard-instance",
        )
        if not _PROFILE.match(profile):
            msg = f"the instance_profile option is not a profile name or ARN: {profile!r}"
            raise InputError(msg, hint="e.g. instance_profile=costguard-instance")
        subnet = spec.options.get("subnet", "")
        if subnet and not _SUBNET.match(subnet):
            msg = f"the subnet option must be a subnet id like subnet-0abc1234, not {subnet!r}"
            raise InputError(msg, hint="or leave it out to use the default VPC")
        for group in self._groups(spec):
            if not _GROUP.match(group):
                msg = f"the security_groups option must list ids like sg-0abc1234, not {group!r}"
                raise InputError(msg, hint="security_groups=sg-0abc1234,sg-0def5678")
        bootstrap.int_option(spec, "metadata_hop_limit", 1, 1, 64)
        bootstrap.int_option(spec, "disk_gb", 100, 8, 65536)
        device = spec.options.get("root_device", "/dev/sda1")
        if not _DEVICE.match(device):
            msg = f"the root_device option must look like /dev/sda1 or /dev/xvda, not {device!r}"
            raise InputError(msg, hint="aws ec2 describe-images --image-ids AMI: RootDeviceName")
        self._max_price(spec)
        bootstrap.render(spec, 1, self.provider, environ=self._environ)

    @staticmethod
    def _groups(spec: LaunchSpec) -> list[str]:
        return [g.strip() for g in spec.options.get("security_groups", "").split(",") if g.strip()]

    @staticmethod
    def _max_price(spec: LaunchSpec) -> str | None:
        """The spot cap: ``--max-price`` or the ``max_price`` option (equal if both)."""
        cap = bootstrap.max_price(spec)
        return None if cap is None else str(cap)

    # ----------------------------------------------------------------- launch

    def request(self, offer: Offer, spec: LaunchSpec, attempt: int) -> dict[str, Any]:
        """The ``RunInstances`` parameters of one attempt (no call made): for dry runs."""
        self.check(spec)
        if offer.provider != self.provider:
            msg = f"an offer on {offer.provider} cannot be launched on AWS"
            raise InputError(msg, hint="pick an AWS offer")
        tags = {**spec.tags(attempt), "Name": f"costguard-{spec.job_id}-{attempt}"[:255]}
        options = spec.options
        params: dict[str, Any] = {
            "ImageId": options["image"].strip(),
            "InstanceType": offer.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": client_token(spec.job_id, attempt),
            "UserData": bootstrap.render(spec, attempt, self.provider, environ=self._environ),
            "MetadataOptions": {
                "HttpTokens": "required",
                "HttpEndpoint": "enabled",
                "HttpPutResponseHopLimit": bootstrap.int_option(
                    spec, "metadata_hop_limit", 1, 1, 64
                ),
            },
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": _tags(tags)},
                {"ResourceType": "volume", "Tags": _tags(tags)},
            ],
            "InstanceInitiatedShutdownBehavior": "terminate",
        }
        profile = options["instance_profile"].strip()
        params["IamInstanceProfile"] = (
            {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
        )
        if offer.market is Market.SPOT:
            spot: dict[str, str] = {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            }
            cap = self._max_price(spec)
            if cap:
                spot["MaxPrice"] = cap
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        if offer.zone:
            params["Placement"] = {"AvailabilityZone": offer.zone}
        if options.get("subnet"):
            params["SubnetId"] = options["subnet"]
        if self._groups(spec):
            params["SecurityGroupIds"] = self._groups(spec)
        if options.get("key_name"):
            params["KeyName"] = options["key_name"]
        if options.get("disk_gb"):
            params["BlockDeviceMappings"] = [
                {
                    "DeviceName": options.get("root_device", "/dev/sda1"),
                    "Ebs": {
                        "VolumeSize": bootstrap.int_option(spec, "disk_gb", 100, 8, 65536),
                        "VolumeType": "gp3",
                        "DeleteOnTermination": True,
                    },
                }
            ]
        return params

    def launch(self, offer: Offer, spec: LaunchSpec, attempt: int) -> Handle:
        """One ``RunInstances`` call; a :class:`CapacityError` when the place is full."""
        params = self.request(offer, spec, attempt)
        ec2 = self._ec2(offer.region)
        try:
            answer = ec2.run_instances(**params)
        except aws_clouds.errors() as exc:
            code = _code(exc)
            if code in CAPACITY_CODES:
                message = aws_clouds.translate(exc, f"launching {offer.instance_type}").message
                raise CapacityError(message, place=offer.place, code=code) from None
            raise aws_clouds.translate(exc, f"launching {offer.instance_type}") from None
        (instance,) = answer["Instances"]
        return Handle(
            provider=self.provider,
            region=offer.region,
            instance_id=instance["InstanceId"],
            zone=instance.get("Placement", {}).get("AvailabilityZone", offer.zone),
            extra={"market": offer.market.value, "attempt": str(attempt)},
        )

    # ------------------------------------------------------------------ zones

    def zones(self, region: str, instance_type: str = "") -> list[str]:
        """Available Availability Zones of ``region`` offering ``instance_type``, sorted.

        None when a ``subnet`` option pins the zone (``RunInstances`` would refuse any
        other). Two describe calls, each one page (a region has a handful of zones).
        """
        if self.options.get("subnet"):
            return []
        ec2 = self._ec2(region)
        action = f"listing the zones of {region}"
        try:
            answer = ec2.describe_availability_zones(
                Filters=[
                    {"Name": "state", "Values": ["available"]},
                    {"Name": "zone-type", "Values": ["availability-zone"]},
                ]
            )
            available = sorted(
                str(z["ZoneName"])
                for z in answer.get("AvailabilityZones", [])
                if z.get("State", "available") == "available"
                and z.get("ZoneType", "availability-zone") == "availability-zone"
            )
            if not instance_type or not available:
                return available
            offered = ec2.describe_instance_type_offerings(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": [instance_type]}],
                MaxResults=1000,
            )
        except aws_clouds.errors() as exc:
            raise aws_clouds.translate(exc, action) from None
        where = {str(o["Location"]) for o in offered.get("InstanceTypeOfferings", [])}
        return [z for z in available if z in where] or available

    # ----------------------------------------------------------------- status

    def status(self, handle: Handle) -> Status:
        """``DescribeInstances`` of one instance; an unknown id is :attr:`State.MISSING`."""
        ec2 = self._ec2(handle.region)
        try:
            answer = ec2.describe_instances(InstanceIds=[handle.instance_id])
        except aws_clouds.errors() as exc:
            if _code(exc) in _NOT_FOUND:
                return Status(handle, State.MISSING, "EC2 no longer knows the instance")
            raise aws_clouds.translate(exc, f"describing {handle.instance_id}") from None
        found = [i for r in answer.get("Reservations", []) for i in r.get("Instances", [])]
        if not found:
            return Status(handle, State.MISSING, "EC2 no longer knows the instance")
        instance = found[0]
        reason = instance.get("StateReason", {})
        spot = instance.get("InstanceLifecycle") == "spot" or handle.extra.get("market") == "spot"
        state = classify(instance["State"]["Name"], str(reason.get("Code", "")), spot)
        detail = str(reason.get("Message") or instance.get("StateTransitionReason") or "")
        return Status(handle, state, detail, launched_at=instance.get("LaunchTime"))

    # -------------------------------------------------------------- terminate

    def terminate(self, handle: Handle) -> None:
        """``TerminateInstances``; an instance that is already gone is fine."""
        ec2 = self._ec2(handle.region)
        try:
            ec2.terminate_instances(InstanceIds=[handle.instance_id])
        except aws_clouds.errors() as exc:
            if _code(exc) in _NOT_FOUND:
                return
            raise aws_clouds.translate(exc, f"terminating {handle.instance_id}") from None

    # ------------------------------------------------------------------- find

    def find(self, job_id: str) -> list[Handle]:
        """Pending and running instances tagged ``costguard:job=job_id``, in every region
        this launcher knows (``regions`` and those launched into)."""
        if not self.regions:  # the default region of the credential chain
            default = self._factory("")
            self._clients.setdefault(default.meta.region_name, default)
            self.regions.append(default.meta.region_name)
        check_job_id(job_id, "the job to find")
        found: list[Handle] = []
        for where in list(self.regions):
            ec2 = self._ec2(where)
            filters = [
                {"Name": f"tag:{JOB_TAG}", "Values": [job_id]},
                {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
            ]
            try:
                reservations: Iterable[Any] = list(
                    aws_clouds.paginate(ec2, "describe_instances", "Reservations", Filters=filters)
                )
            except aws_clouds.errors() as exc:
                raise aws_clouds.translate(exc, f"listing the instances of {job_id}") from None
            for reservation in reservations:
                for instance in reservation.get("Instances", []):
                    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                    if tags.get(JOB_TAG) != job_id:  # the filter's value is a pattern
                        continue
                    found.append(
                        Handle(
                            provider=self.provider,
                            region=where,
                            instance_id=instance["InstanceId"],
                            zone=instance.get("Placement", {}).get("AvailabilityZone", ""),
                            extra={
                                "market": "spot"
                                if instance.get("InstanceLifecycle") == "spot"
                                else "on-demand",
                                "attempt": tags.get(ATTEMPT_TAG, ""),
                            },
                        )
                    )
        return found
