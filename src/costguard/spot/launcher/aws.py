"""AWS: one EC2 instance per attempt, through ``RunInstances``.

Every instance is created in one call with everything it needs: the spot market options
(one-time request, terminate on interruption) unless the offer is on-demand, IMDSv2 only
(``HttpTokens=required``, a hop limit of 1 unless asked), the job's tags on the instance
*and* its volumes (so ``ec2:RunInstances`` can be allowed only with the tag, see
``infra/aws/launcher-policy.json``), an instance profile instead of any key in user-data,
the boot script of :mod:`costguard.spot.bootstrap`, and a guest shutdown that terminates.
The client token is derived from the job and attempt (:func:`launch_token`; the
controller writes it to ``job.json`` before the call), so a launch whose answer was lost
(a timeout, or a controller that died before writing the instance id) is found again by
it (:meth:`AwsLauncher.resume`) rather than launched a second time.

What became of an instance is read from ``DescribeInstances``: the state, and for a
stopped or terminated one its ``StateReason`` code (``Server.SpotInstanceTermination`` is a
reclaim, ``Client.UserInitiatedShutdown`` is someone's doing).

EC2's API is eventually consistent: right after ``RunInstances`` a describe or a terminate
of the new instance may answer ``InvalidInstanceID.NotFound`` ("does not mean the
instance does not exist"). Within :data:`VISIBLE_WITHIN_S` of its launch such an answer
is "not visible yet": :meth:`AwsLauncher.status` describes again a few times with backoff
and then reports the instance ``pending`` (never ``missing``, which would make the
controller launch a second one), and :meth:`AwsLauncher.terminate` retries until EC2
answers with the instance's new state: a terminate is confirmed by ``shutting-down`` or
``terminated``, never by a NotFound.

Options (``LaunchSpec.options``, declared in :data:`OPTIONS`): ``image`` (AMI id,
required), ``instance_profile`` (name or ARN, required), ``subnet``, ``security_groups``
(comma-separated ids), ``key_name``, ``disk_gb`` with ``root_device`` (default
``/dev/sda1``), ``metadata_hop_limit`` (default 1; 2 for jobs in containers),
``max_price`` (spot cap, USD/h; default the on-demand price), ``placement`` (``cluster``:
a gang's placement group), plus those of
:mod:`costguard.spot.bootstrap`. ``--max-price`` reaches ``SpotOptions.MaxPrice`` the same
way (the two must agree when both are given).

A gang (``--nodes N``, :meth:`AwsLauncher.launch_gang`) is one ``CreateFleet`` of type
``instant`` whose total and minimum target capacity are both N, in one Availability Zone
(EC2's all-or-nothing request), from a launch template per attempt, in the job's security
group (the rendezvous and collective ports from itself only) and, with
``placement=cluster``, the job's cluster placement group; each node is then told its rank
and node 0's private address in its own tags, read from IMDSv2. :meth:`AwsLauncher.release`
deletes the job's group, templates and placement group once its instances are gone.

Zones: :meth:`AwsLauncher.zones` lists the region's available Availability Zones
(``DescribeAvailabilityZones``, zone type ``availability-zone``: no Local or Wavelength
Zones) where the instance type is offered (``DescribeInstanceTypeOfferings``; when EC2
names none, every available zone). A ``subnet`` option pins the zone (a subnet lives in
one), so with it the launcher names none and recovery moves between regions only.
"""

from __future__ import annotations

import base64
import functools
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from costguard.clouds import aws as aws_clouds
from costguard.errors import CostguardError, InputError
from costguard.pricing.catalog import Market
from costguard.spot import bootstrap, node
from costguard.spot.launcher.base import (
    CapacityError,
    Handle,
    Launcher,
    LaunchSpec,
    Offer,
    State,
    Status,
    ThrottledError,
    launch_token,
)
from costguard.spot.launcher.options import Option, Options, placement_option
from costguard.tags import ATTEMPT_TAG, JOB_TAG, OWNER_TAG, check_job_id

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
    "UnfulfillableCapacity",
)
#: Error codes of a request EC2 refused for the account's request rate (its API
#: throttling): the launch is asked again later (:class:`ThrottledError`), no place is
#: backed off from.
THROTTLE_CODES = ("RequestLimitExceeded", "Throttling", "ThrottlingException")
_NOT_FOUND = ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed")
#: An EC2 instance id: what goes into a filter (``*`` and ``?`` are wildcards there).
_INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,32}")
#: How long after ``RunInstances`` a NotFound means "not visible yet" rather than "gone"
#: (EC2 keeps a terminated instance visible for about an hour, so a NotFound later is
#: an instance long gone).
VISIBLE_WITHIN_S = 600.0
#: The waits between the describes of an instance EC2 does not show yet, in one status.
DESCRIBE_BACKOFF_S = (0.2, 0.5, 1.0)
#: The most instance ids one ``DescribeInstances`` of many (:meth:`AwsLauncher.statuses`)
#: filters by: a request of bounded size, one call for a poll of that many tasks.
DESCRIBE_IDS = 200
#: The waits between the terminates of an instance EC2 does not show yet (the last one
#: repeats until :data:`TERMINATE_WAIT_S` has passed).
TERMINATE_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
#: The longest one terminate waits for EC2 to show a fresh instance (the default of
#: ``AwsLauncher(terminate_wait_s=...)``): then it says so instead of blocking a command
#: for the whole :data:`VISIBLE_WITHIN_S`.
TERMINATE_WAIT_S = 120.0
#: The longest :meth:`AwsLauncher.release` waits for a group the job's last instances
#: still use (EC2 ends a terminated instance in a minute or two).
RELEASE_WAIT_S = 300.0
#: Error codes of a group that is still in use, and of one already gone.
_IN_USE = ("DependencyViolation", "InvalidPlacementGroup.InUse")
_GONE = (
    "InvalidGroup.NotFound",
    "InvalidPlacementGroup.Unknown",
    "InvalidLaunchTemplateId.NotFound",
)
#: The states that confirm a terminate.
ENDING_STATES = ("shutting-down", "terminated")
#: The options this launcher reads (the boot script's besides), in the order checked.
OPTIONS = Options(
    Option(
        "image",
        "an AMI id with the NVIDIA driver, e.g. a Deep Learning AMI: image=ami-0123456789abcdef0",
        example="ami-0123456789abcdef0",
        required=True,
        pattern=re.compile(r"ami-[0-9a-f]{8,17}"),
        invalid="the image option must be an AMI id like ami-0123456789abcdef0, not {value!r}",
        hint="aws ec2 describe-images --owners amazon ...",
    ),
    Option(
        "instance_profile",
        "the instance reaches the checkpoint bucket with its role, never with keys: "
        "see infra/aws/launcher-instance-role-*.json, then instance_profile=costguard-instance",
        example="costguard-instance",
        required=True,
        pattern=re.compile(
            r"(arn:aws[a-z-]*:iam::\d{12}:instance-profile/)?[\w+=,.@/-]{1,128}", re.ASCII
        ),
        invalid="the instance_profile option is not a profile name or ARN: {value!r}",
        hint="e.g. instance_profile=costguard-instance",
    ),
    Option(
        "subnet",
        "the subnet to launch in (it pins the zone); default: the default VPC's",
        example="subnet-0abc1234",
        pattern=re.compile(r"subnet-[0-9a-f]{8,17}"),
        invalid="the subnet option must be a subnet id like subnet-0abc1234, not {value!r}",
        hint="or leave it out to use the default VPC",
    ),
    Option(
        "security_groups",
        "security group ids, comma-separated; default: the VPC's default group",
        example="sg-0abc1234,sg-0def5678",
        listed=True,
        pattern=re.compile(r"sg-[0-9a-f]{8,17}"),
        invalid="the security_groups option must list ids like sg-0abc1234, not {value!r}",
        hint="security_groups=sg-0abc1234,sg-0def5678",
    ),
    Option("key_name", "an EC2 key pair for SSH (none by default)", example="my-key"),
    Option(
        "metadata_hop_limit",
        "IMDSv2 hops (2 for jobs in containers)",
        example="2",
        default="1",
        whole=(1, 64),
    ),
    Option(
        "disk_gb",
        "the root volume's size in GB",
        example="200",
        default="100",
        whole=(8, 65536),
    ),
    placement_option("cluster", "in the job's cluster placement group"),
    Option(
        "root_device",
        "the AMI's root device name (its RootDeviceName)",
        example="/dev/xvda",
        default="/dev/sda1",
        pattern=re.compile(r"/dev/[a-z0-9]+"),
        invalid="the root_device option must look like /dev/sda1 or /dev/xvda, not {value!r}",
        hint="aws ec2 describe-images --image-ids AMI: RootDeviceName",
    ),
)


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


def _status_of(handle: Handle, instance: Mapping[str, Any]) -> Status:
    """The :class:`Status` of ``handle`` from its instance as ``DescribeInstances`` shows it."""
    reason = instance.get("StateReason", {})
    spot = instance.get("InstanceLifecycle") == "spot" or handle.extra.get("market") == "spot"
    state = classify(instance["State"]["Name"], str(reason.get("Code", "")), spot)
    detail = str(reason.get("Message") or instance.get("StateTransitionReason") or "")
    return Status(handle, state, detail, launched_at=instance.get("LaunchTime"))


def _tags(pairs: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in pairs.items()]


def _profile(profile: str) -> dict[str, str]:
    """``IamInstanceProfile`` by ARN or by name."""
    return {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}


def _placement(offer: Offer, values: Mapping[str, str]) -> dict[str, Any]:
    """Where the instance goes: the offer's zone, the subnet, groups and key pair given."""
    params: dict[str, Any] = {}
    if offer.zone:
        params["Placement"] = {"AvailabilityZone": offer.zone}
    if values.get("subnet"):
        params["SubnetId"] = values["subnet"]
    groups = [g.strip() for g in values.get("security_groups", "").split(",") if g.strip()]
    if groups:
        params["SecurityGroupIds"] = groups
    if values.get("key_name"):
        params["KeyName"] = values["key_name"]
    return params


def _root_volume(spec: LaunchSpec, values: Mapping[str, str]) -> dict[str, Any]:
    """A gp3 root volume of ``disk_gb``, deleted with the instance, when that was given
    (else the AMI's own)."""
    if not spec.options.get("disk_gb", "").strip():
        return {}
    volume = {
        "VolumeSize": int(values["disk_gb"]),
        "VolumeType": "gp3",
        "DeleteOnTermination": True,
    }
    return {"BlockDeviceMappings": [{"DeviceName": values["root_device"], "Ebs": volume}]}


class _NotYetError(Exception):
    """EC2 does not show every instance of a fresh gang whole yet (a describe retries)."""


def _job_tags(spec: LaunchSpec) -> dict[str, str]:
    """The tags of what a gang's job holds besides its instances (group, template)."""
    return {JOB_TAG: spec.job_id, OWNER_TAG: spec.owner}


def job_resource_name(job_id: str) -> str:
    """The name of the job's security group and placement group.

    >>> job_resource_name("cg-alice-20261206-0955-ab12")
    'costguard-cg-alice-20261206-0955-ab12'
    """
    return f"costguard-{check_job_id(job_id, 'the job to launch')}"


def private_address(value: object) -> str:
    """``value`` if it is a private IPv4 address (where a gang's nodes meet), else a
    :class:`CostguardError`.

    >>> private_address("10.0.3.7")
    '10.0.3.7'
    >>> private_address("8.8.8.8")
    Traceback (most recent call last):
    ...
    costguard.errors.CostguardError: node 0's address '8.8.8.8' is not a private IPv4 address
    """
    address = node.private_ipv4(value)
    if address is None:
        msg = f"node 0's address {str(value)[:60]!r} is not a private IPv4 address"
        raise CostguardError(msg, hint="this launch was ended; launch again")
    return address


def _short_fleet(
    offer: Offer, spec: LaunchSpec, given: int, errors: Sequence[Mapping[str, Any]]
) -> CostguardError:
    """The refusal of a fleet that gave ``given`` of ``spec.nodes`` instances: a
    :class:`CapacityError` when EC2 had no room (its error codes, or none), else the
    error EC2 named."""
    codes = [str(e.get("ErrorCode", "")) for e in errors if e.get("ErrorCode")]
    words = next((str(e.get("ErrorMessage", "")) for e in errors if e.get("ErrorMessage")), "")
    msg = f"EC2 gave {given} of the {spec.nodes} {offer.instance_type} instances of the gang"
    msg += f" in {offer.place}" + (f": {words[:200]}" if words else "")
    if given:
        msg += f" (the {given} given are terminated: all or none)"
    code = codes[0] if codes else "InsufficientInstanceCapacity"
    if code in CAPACITY_CODES:
        return CapacityError(msg, place=offer.place, code=code)
    return CostguardError(msg, hint=f"EC2's code: {code}")


class AwsLauncher(Launcher):
    """EC2 in the regions of the offers it is given. ``clients(region)`` builds the EC2
    client (default :func:`costguard.clouds.aws.client`); ``regions`` are where
    :meth:`find` looks (besides every region this launcher has launched into). Example::

        launcher = AwsLauncher(regions=["us-east-1", "us-west-2"])
        handle = launcher.launch(offer, spec, attempt=1)
    """

    provider = "aws"
    OPTIONS = OPTIONS
    #: The most instance ids one ``DescribeInstances`` of :meth:`statuses` filters by.
    describe_ids = DESCRIBE_IDS

    def __init__(
        self,
        *,
        regions: Sequence[str] = (),
        clients: Callable[[str], Any] | None = None,
        environ: dict[str, str] | None = None,
        options: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        terminate_wait_s: float | None = None,
    ) -> None:
        self.options = dict(options or {})
        self.terminate_wait_s = TERMINATE_WAIT_S if terminate_wait_s is None else terminate_wait_s
        self._clock = clock
        self._sleep = sleep
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
        super().check(spec)
        self._max_price(spec)
        bootstrap.render(spec, 1, self.provider, environ=self._environ)

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
        values = OPTIONS.check(spec.options, self.provider)
        tags = {**spec.tags(attempt), "Name": f"costguard-{spec.job_id}-{attempt}"[:255]}
        return {
            "ImageId": values["image"],
            "InstanceType": offer.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": launch_token(spec.job_id, attempt),
            "UserData": bootstrap.render(spec, attempt, self.provider, environ=self._environ),
            "MetadataOptions": {
                "HttpTokens": "required",
                "HttpEndpoint": "enabled",
                "HttpPutResponseHopLimit": int(values["metadata_hop_limit"]),
            },
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": _tags(tags)},
                {"ResourceType": "volume", "Tags": _tags(tags)},
            ],
            "InstanceInitiatedShutdownBehavior": "terminate",
            "IamInstanceProfile": _profile(values["instance_profile"]),
            **self._market(offer, spec),
            **_placement(offer, values),
            **_root_volume(spec, values),
        }

    def _market(self, offer: Offer, spec: LaunchSpec) -> dict[str, Any]:
        """``InstanceMarketOptions`` of a spot offer: one-time, terminated on interruption,
        capped at the max price when one is given; nothing for on-demand."""
        if offer.market is not Market.SPOT:
            return {}
        spot: dict[str, str] = {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        }
        cap = self._max_price(spec)
        if cap:
            spot["MaxPrice"] = cap
        return {"InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": spot}}

    def launch(self, offer: Offer, spec: LaunchSpec, attempt: int) -> Handle:
        """One ``RunInstances`` call; a :class:`CapacityError` when the place is full."""
        return self._run(offer, self.request(offer, spec, attempt), attempt)

    def _run(self, offer: Offer, params: Mapping[str, Any], attempt: int) -> Handle:
        ec2 = self._ec2(offer.region)
        try:
            answer = ec2.run_instances(**params)
        except aws_clouds.errors() as exc:
            code = aws_clouds.error_code(exc)
            if code in CAPACITY_CODES:
                message = aws_clouds.translate(exc, f"launching {offer.instance_type}").message
                raise CapacityError(message, place=offer.place, code=code) from None
            if code in THROTTLE_CODES:
                msg = f"EC2 throttled launching {offer.instance_type} in {offer.region} ({code})"
                raise ThrottledError(msg, code=code) from None
            if code == "IdempotentParameterMismatch":
                token = params["ClientToken"]
                msg = (
                    f"attempt {attempt} was launched with the client token {token}, but EC2 "
                    "does not show its instance yet"
                )
                raise CostguardError(
                    msg,
                    hint="attach again in a few minutes (costguard launch --attach URL); "
                    f"aws ec2 describe-instances --region {offer.region} "
                    f"--filters Name=client-token,Values={token}",
                ) from None
            raise aws_clouds.translate(exc, f"launching {offer.instance_type}") from None
        (instance,) = answer["Instances"]
        return self._launched(offer, instance, attempt, self._clock())

    def resume(
        self, offer: Offer, spec: LaunchSpec, attempt: int, token: str, launched_unix: float
    ) -> Handle | None:
        """The instance of attempt ``attempt`` whose launch (with ``token``) was sent at
        ``launched_unix`` but whose answer never reached ``job.json`` (the controller died
        or timed out between the call and the write).

        ``DescribeInstances`` by the ``client-token`` filter first (any state). Within
        :data:`VISIBLE_WITHIN_S` of the launch a listing may not show a new instance yet,
        so the launch is then sent again with the same token and parameters: EC2 answers
        a repeated token with the first request's instance and launches nothing more, or,
        if the first request never arrived, launches the attempt's instance now. Later, a
        token no instance carries is a launch that never happened (``None``). A token EC2
        knows with other parameters (``IdempotentParameterMismatch``) is a
        :class:`CostguardError`, never a second instance.
        """
        ec2 = self._ec2(offer.region)
        try:
            answer = ec2.describe_instances(Filters=[{"Name": "client-token", "Values": [token]}])
        except aws_clouds.errors() as exc:
            raise aws_clouds.translate(exc, f"finding the instance of attempt {attempt}") from None
        for reservation in answer.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                if tags.get(JOB_TAG) == spec.job_id:
                    return self._launched(offer, instance, attempt, launched_unix)
        if self._clock() - launched_unix >= VISIBLE_WITHIN_S:
            return None
        params = self.request(offer, spec, attempt)
        params["ClientToken"] = token
        return self._run(offer, params, attempt)

    def _launched(
        self, offer: Offer, instance: Mapping[str, Any], attempt: int, launched_unix: float
    ) -> Handle:
        """The handle of attempt ``attempt``'s instance, launched for ``offer`` at
        ``launched_unix`` (its visibility window starts then)."""
        return self._handle(
            offer.region,
            instance,
            market=offer.market.value,
            attempt=str(attempt),
            launched_unix=f"{launched_unix:.3f}",
        )

    def _handle(self, region: str, instance: Mapping[str, Any], **extra: str) -> Handle:
        """The handle of an instance as EC2 describes it; ``extra``: ``attempt``, and
        ``market`` / ``launched_unix`` (for the visibility window) when known."""
        spot = instance.get("InstanceLifecycle") == "spot"
        return Handle(
            provider=self.provider,
            region=region,
            instance_id=str(instance["InstanceId"]),
            zone=str(instance.get("Placement", {}).get("AvailabilityZone", "")),
            extra={"market": "spot" if spot else "on-demand", **extra},
        )

    def _fresh(self, handle: Handle) -> bool:
        """Whether ``handle`` was launched so recently that EC2 may not show it yet."""
        try:
            launched = float(handle.extra.get("launched_unix", ""))
        except ValueError:  # a handle found by tag, or from before this field: visible once
            return False
        return self._clock() - launched < VISIBLE_WITHIN_S

    # ------------------------------------------------------------------- gang

    def launch_gang(self, offer: Offer, spec: LaunchSpec, attempt: int) -> tuple[Handle, ...]:
        """The ``spec.nodes`` instances of attempt ``attempt``, all or none, in one zone:
        one ``CreateFleet`` of type ``instant`` (:meth:`fleet_request`) whose minimum
        target capacity is the whole gang, so EC2 launches every node or none.

        Before it: the job's security group (its nodes reach each other on the
        rendezvous and collective ports, nothing else reaches them), a launch template
        per attempt and, with ``placement=cluster``, the job's cluster placement group,
        each tagged with the job and made once (found again by name and tags). After
        it: each node's rank and the rendezvous (node 0's private address) as tags of
        its instance, which the node reads from IMDSv2 (``InstanceMetadataTags``).

        A fleet that gives fewer than ``spec.nodes`` instances (whatever its minimum
        said), or anything failing after the fleet, terminates every instance it gave
        before raising: a :class:`CapacityError` when EC2 had no room, so recovery tries
        another place. A fleet refused for the request rate launched nothing: a
        :class:`ThrottledError`, sent again later with the same client token. The handles
        come in node-rank order (instance ids sorted, so a fleet answered again for its
        client token ranks its nodes the same way).
        """
        if spec.nodes == 1:
            return (self.launch(offer, spec, attempt),)
        self.check(spec)
        if offer.provider != self.provider:
            msg = f"an offer on {offer.provider} cannot be launched on AWS"
            raise InputError(msg, hint="pick an AWS offer")
        values = OPTIONS.check(spec.options, self.provider)
        ec2 = self._ec2(offer.region)
        group = self._gang_group(ec2, spec, values)
        template = self._gang_template(ec2, offer, spec, attempt, group)
        placement = self._cluster_group(ec2, spec) if values.get("placement") == "cluster" else ""
        params = self.fleet_request(offer, spec, attempt, template, placement)
        action = f"launching {spec.nodes} x {offer.instance_type} together"
        try:
            answer = ec2.create_fleet(**params)
        except aws_clouds.errors() as exc:
            code = aws_clouds.error_code(exc)
            if code in CAPACITY_CODES:
                message = aws_clouds.translate(exc, action).message
                raise CapacityError(message, place=offer.place, code=code) from None
            if code in THROTTLE_CODES:  # refused before EC2 acted: nothing launched
                msg = f"EC2 throttled {action} in {offer.region} ({code})"
                raise ThrottledError(msg, code=code) from None
            raise aws_clouds.translate(exc, action) from None
        launched_unix = self._clock()
        ids = sorted(
            {
                str(i)
                for item in answer.get("Instances") or []
                for i in item.get("InstanceIds") or []
            }
        )
        handles = [
            self._handle(
                offer.region,
                {"InstanceId": i},
                market=offer.market.value,
                attempt=str(attempt),
                launched_unix=f"{launched_unix:.3f}",
                node=str(rank),
                nodes=str(spec.nodes),
            )
            for rank, i in enumerate(ids)
        ]
        try:
            if len(ids) != spec.nodes:
                raise _short_fleet(offer, spec, len(ids), answer.get("Errors") or [])
            return self._tag_gang(ec2, handles, spec, attempt)
        except BaseException as exc:
            left = self._end_gang(handles)
            if left:
                raise left from exc
            raise

    def fleet_request(
        self, offer: Offer, spec: LaunchSpec, attempt: int, template: str, placement: str = ""
    ) -> dict[str, Any]:
        """The ``CreateFleet`` parameters of a gang (no call made): type ``instant``, the
        total and the minimum target capacity both ``spec.nodes`` with one instance type
        in one Availability Zone (EC2's all-or-nothing request), spot or on-demand as the
        offer is listed, the launch template ``template``, the cluster placement group
        ``placement`` if any, and the attempt's client token."""
        values = OPTIONS.check(spec.options, self.provider)
        spot = offer.market is Market.SPOT
        market = "spot" if spot else "on-demand"
        override: dict[str, Any] = {"InstanceType": offer.instance_type}
        if offer.zone:
            override["AvailabilityZone"] = offer.zone
        if values.get("subnet"):
            override["SubnetId"] = values["subnet"]
        if placement:
            override["Placement"] = {"GroupName": placement}
        cap = self._max_price(spec)
        if spot and cap:
            override["MaxPrice"] = cap
        together = {
            "SingleInstanceType": True,
            "SingleAvailabilityZone": True,
            "MinTargetCapacity": spec.nodes,
        }
        options: dict[str, Any] = (
            {
                "SpotOptions": {
                    **together,
                    "AllocationStrategy": "price-capacity-optimized",
                    "InstanceInterruptionBehavior": "terminate",
                }
            }
            if spot
            else {"OnDemandOptions": {**together, "AllocationStrategy": "lowest-price"}}
        )
        return {
            "Type": "instant",
            "ClientToken": launch_token(spec.job_id, attempt),
            "LaunchTemplateConfigs": [
                {
                    "LaunchTemplateSpecification": {"LaunchTemplateId": template, "Version": "1"},
                    "Overrides": [override],
                }
            ],
            "TargetCapacitySpecification": {
                "TotalTargetCapacity": spec.nodes,
                "DefaultTargetCapacityType": market,
                ("SpotTargetCapacity" if spot else "OnDemandTargetCapacity"): spec.nodes,
            },
            # The instances' tags in the request too (an instant fleet may tag them), so
            # ``aws:RequestTag`` conditions on ``CreateFleet`` see them.
            "TagSpecifications": [
                {"ResourceType": kind, "Tags": _tags(spec.tags(attempt))}
                for kind in ("fleet", "instance")
            ],
            **options,
        }

    def template_data(
        self, offer: Offer, spec: LaunchSpec, attempt: int, group: str
    ) -> dict[str, Any]:
        """The launch template of a gang's attempt: what :meth:`request` gives one
        instance, less what the fleet decides (count, market, zone, subnet, type, token),
        with the user-data base64-encoded, the job's security group ``group`` added and
        the instance's tags readable from IMDSv2 (``InstanceMetadataTags``)."""
        data = self.request(offer, spec, attempt)
        for key in (
            "MinCount",
            "MaxCount",
            "ClientToken",
            "InstanceMarketOptions",
            "Placement",
            "SubnetId",
            "InstanceType",
        ):
            data.pop(key, None)
        data["UserData"] = base64.b64encode(data["UserData"].encode()).decode()
        data["MetadataOptions"] = {**data["MetadataOptions"], "InstanceMetadataTags": "enabled"}
        data["SecurityGroupIds"] = [group, *data.get("SecurityGroupIds", [])]
        return data

    def _owned(self, tags: Sequence[Mapping[str, Any]], spec: LaunchSpec) -> bool:
        """Whether ``tags`` (EC2's ``Key``/``Value`` list) name this job and its owner."""
        found = {str(t.get("Key")): str(t.get("Value")) for t in tags}
        return found.get(JOB_TAG) == spec.job_id and found.get(OWNER_TAG) == spec.owner

    def _vpc(self, ec2: Any, values: Mapping[str, str]) -> str:
        """The VPC the gang launches in: the ``subnet`` option's, else the default VPC."""
        try:
            if values.get("subnet"):
                subnets = ec2.describe_subnets(SubnetIds=[values["subnet"]])["Subnets"]
                return str(subnets[0]["VpcId"])
            vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
        except aws_clouds.errors() as exc:
            raise aws_clouds.translate(exc, "finding the gang's VPC") from None
        if not vpcs:
            msg = "the region has no default VPC for the gang's nodes"
            raise InputError(msg, hint="give a subnet: --option subnet=subnet-0abc1234")
        return str(vpcs[0]["VpcId"])

    def _gang_group(self, ec2: Any, spec: LaunchSpec, values: Mapping[str, str]) -> str:
        """The job's security group in the gang's VPC (made once): TCP on the rendezvous
        port and the collective ports (:data:`bootstrap.COLLECTIVE_PORTS`) from the
        group itself, that is from the job's own nodes; nothing else inbound."""
        vpc = self._vpc(ec2, values)
        name = job_resource_name(spec.job_id)
        region = ec2.meta.region_name
        try:
            found = ec2.describe_security_groups(
                Filters=[
                    {"Name": "group-name", "Values": [name]},
                    {"Name": "vpc-id", "Values": [vpc]},
                ]
            )["SecurityGroups"]
            if found:
                if not self._owned(found[0].get("Tags", []), spec):
                    msg = f"the security group {name} in {region} exists and is not tagged as "
                    msg += "this job's: costguard leaves it alone"
                    raise CostguardError(
                        msg, hint="delete it if it is a leftover, then launch again"
                    )
                group = str(found[0]["GroupId"])
            else:
                group = str(
                    ec2.create_security_group(
                        GroupName=name,
                        Description=f"costguard job {spec.job_id}: its nodes reach each other",
                        VpcId=vpc,
                        TagSpecifications=[
                            {"ResourceType": "security-group", "Tags": _tags(_job_tags(spec))}
                        ],
                    )["GroupId"]
                )
            low, high = bootstrap.COLLECTIVE_PORTS
            ports = ((bootstrap.RDZV_PORT, bootstrap.RDZV_PORT), (low, high))
            for first, last in ports:
                rule = {
                    "IpProtocol": "tcp",
                    "FromPort": first,
                    "ToPort": last,
                    "UserIdGroupPairs": [{"GroupId": group}],
                }
                try:
                    ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[rule])
                except aws_clouds.errors() as exc:
                    if aws_clouds.error_code(exc) != "InvalidPermission.Duplicate":
                        raise
        except aws_clouds.errors() as exc:
            raise aws_clouds.translate(exc, f"making the security group {name}") from None
        return group

    def _gang_template(
        self, ec2: Any, offer: Offer, spec: LaunchSpec, attempt: int, group: str
    ) -> str:
        """The id of the attempt's launch template (named by its client token; made once)."""
        name = launch_token(spec.job_id, attempt)
        made, found = self._once(
            spec,
            f"the launch template {name}",
            functools.partial(
                ec2.create_launch_template,
                LaunchTemplateName=name,
                ClientToken=name,
                LaunchTemplateData=self.template_data(offer, spec, attempt, group),
                TagSpecifications=[
                    {"ResourceType": "launch-template", "Tags": _tags(_job_tags(spec))}
                ],
            ),
            "InvalidLaunchTemplateName.AlreadyExistsException",
            lambda: ec2.describe_launch_templates(LaunchTemplateNames=[name])["LaunchTemplates"],
        )
        template: Mapping[str, Any] = made["LaunchTemplate"] if made else found or {}
        return str(template["LaunchTemplateId"])

    def _cluster_group(self, ec2: Any, spec: LaunchSpec) -> str:
        """The job's cluster placement group (made once), by name."""
        name = job_resource_name(spec.job_id)
        tags = {
            "TagSpecifications": [
                {"ResourceType": "placement-group", "Tags": _tags(_job_tags(spec))}
            ]
        }
        _, found = self._once(
            spec,
            f"the placement group {name}",
            lambda: ec2.create_placement_group(GroupName=name, Strategy="cluster", **tags),
            "InvalidPlacementGroup.Duplicate",
            lambda: ec2.describe_placement_groups(GroupNames=[name])["PlacementGroups"],
        )
        if found and found.get("Strategy") != "cluster":
            msg = f"the placement group {name} is not a cluster group: costguard leaves it alone"
            raise CostguardError(msg, hint="delete it if it is a leftover, then launch again")
        return name

    def _once(
        self,
        spec: LaunchSpec,
        what: str,
        create: Callable[[], Any],
        duplicate: str,
        find: Callable[[], Sequence[Mapping[str, Any]]],
    ) -> tuple[Any, Mapping[str, Any] | None]:
        """``(create()'s answer, None)``; or, when EC2 answers ``duplicate`` (an earlier
        try made it), ``(None, what find() lists)``, provided that carries the job's tags
        (anything else of the same name is left alone, and nothing is launched)."""
        try:
            try:
                return create(), None
            except aws_clouds.errors() as exc:
                if aws_clouds.error_code(exc) != duplicate:
                    raise
            found = list(find())
        except aws_clouds.errors() as exc:
            raise aws_clouds.translate(exc, f"making {what}") from None
        if len(found) != 1 or not self._owned(found[0].get("Tags", []), spec):
            msg = f"{what} exists and is not tagged as this job's: costguard leaves it alone"
            raise CostguardError(
                msg, hint="delete or rename it if it is a leftover, then launch again"
            )
        return None, found[0]

    def _tag_gang(
        self, ec2: Any, handles: Sequence[Handle], spec: LaunchSpec, attempt: int
    ) -> tuple[Handle, ...]:
        """Every node of a whole gang described (its zone, node 0's private address), then
        told its rank and the rendezvous in tags, signed for its instance
        (:meth:`LaunchSpec.told`); the handles with their zones."""
        ids = [h.instance_id for h in handles]
        found = self._visible(ec2, ids)
        zones = sorted(
            {str(found[i].get("Placement", {}).get("AvailabilityZone", "")) for i in ids}
        )
        if len(zones) != 1:
            msg = f"EC2 placed the gang's nodes in {', '.join(zones)}, not in one zone"
            raise CostguardError(msg, hint="this launch was ended; launch again")
        address = private_address(found[ids[0]].get("PrivateIpAddress"))
        for rank, instance_id in enumerate(ids):
            tags = node.signed(spec, attempt, instance_id, rank, address)
            self._retry_visible(
                functools.partial(ec2.create_tags, Resources=[instance_id], Tags=_tags(tags)),
                f"telling {instance_id} its node rank",
            )
        return tuple(
            Handle(
                provider=h.provider,
                region=h.region,
                instance_id=h.instance_id,
                zone=zones[0],
                extra={
                    **h.extra,
                    "market": "spot"
                    if found[h.instance_id].get("InstanceLifecycle") == "spot"
                    else "on-demand",
                },
            )
            for h in handles
        )

    def _visible(self, ec2: Any, ids: Sequence[str]) -> dict[str, Mapping[str, Any]]:
        """The instances ``ids`` as ``DescribeInstances`` shows them, each with its private
        address, described again with backoff while EC2 does not show them all yet."""

        def describe() -> dict[str, Mapping[str, Any]]:
            answer = ec2.describe_instances(InstanceIds=list(ids))
            found = {
                str(i["InstanceId"]): i
                for r in answer.get("Reservations", [])
                for i in r.get("Instances", [])
            }
            if not all(found.get(i, {}).get("PrivateIpAddress") for i in ids):
                raise _NotYetError
            return found

        result: dict[str, Mapping[str, Any]] = self._retry_visible(
            describe, "describing the gang's instances"
        )
        return result

    def _retry_visible(self, call: Callable[[], Any], action: str) -> Any:
        """``call()``, again with backoff while EC2 answers that a fresh instance does not
        exist (or is not shown whole) yet, for at most :attr:`terminate_wait_s`."""
        delays = iter(TERMINATE_BACKOFF_S)
        deadline = self._clock() + self.terminate_wait_s
        while True:
            try:
                return call()
            except _NotYetError:
                pass
            except aws_clouds.errors() as exc:
                if aws_clouds.error_code(exc) not in _NOT_FOUND:
                    raise aws_clouds.translate(exc, action) from None
            delay = next(delays, TERMINATE_BACKOFF_S[-1])
            if self._clock() + delay > deadline:
                msg = (
                    f"{action}: EC2 did not show the new instances in {self.terminate_wait_s:.0f} s"
                )
                raise CostguardError(msg, hint="this launch was ended; launch again")
            self._sleep(delay)

    def _end_gang(self, handles: Sequence[Handle]) -> CostguardError | None:
        """Terminate every instance of a gang that cannot run whole; the error naming
        those whose end EC2 did not confirm (``None`` when all are ending)."""
        left = []
        for handle in handles:
            try:
                self.terminate(handle)
            except CostguardError:
                left.append(handle.instance_id)
        if not left:
            return None
        msg = (
            f"the gang could not start whole, and EC2 did not confirm terminating "
            f"{', '.join(left)}: they may still run"
        )
        region = handles[0].region
        return CostguardError(
            msg,
            hint=f"aws ec2 terminate-instances --region {region} --instance-ids {' '.join(left)}",
        )

    def release(self, spec: LaunchSpec) -> None:
        """Delete the job's launch templates, security group and placement group in every
        region this launcher knows (those tagged with the job and its owner only), once
        its instances are gone: a group still in use (``DependencyViolation``,
        ``InvalidPlacementGroup.InUse``, while EC2 ends the last instances) is deleted
        again with backoff for at most :data:`RELEASE_WAIT_S`, then a
        :class:`CostguardError` names what is left and the command that deletes it."""
        check_job_id(spec.job_id, "the job to release")
        filters = [{"Name": f"tag:{JOB_TAG}", "Values": [spec.job_id]}]
        for region in list(self.regions):
            ec2 = self._ec2(region)
            action = f"releasing what {spec.job_id} held in {region}"
            try:
                templates = ec2.describe_launch_templates(Filters=filters)["LaunchTemplates"]
                groups = ec2.describe_security_groups(Filters=filters)["SecurityGroups"]
                placements = ec2.describe_placement_groups(Filters=filters)["PlacementGroups"]
                for template in templates:
                    if self._owned(template.get("Tags", []), spec):
                        ec2.delete_launch_template(LaunchTemplateId=template["LaunchTemplateId"])
            except aws_clouds.errors() as exc:
                raise aws_clouds.translate(exc, action) from None
            for group in groups:
                if self._owned(group.get("Tags", []), spec):
                    self._delete_in_use(
                        functools.partial(ec2.delete_security_group, GroupId=group["GroupId"]),
                        f"aws ec2 delete-security-group --region {region} --group-id "
                        f"{group['GroupId']}",
                    )
            for placement in placements:
                if self._owned(placement.get("Tags", []), spec):
                    self._delete_in_use(
                        functools.partial(
                            ec2.delete_placement_group, GroupName=placement["GroupName"]
                        ),
                        f"aws ec2 delete-placement-group --region {region} --group-name "
                        f"{placement['GroupName']}",
                    )

    def _delete_in_use(self, delete: Callable[[], Any], command: str) -> None:
        """``delete()``, again with backoff while EC2 says the thing is still in use."""
        delays = iter(TERMINATE_BACKOFF_S)
        deadline = self._clock() + RELEASE_WAIT_S
        while True:
            try:
                delete()
                return
            except aws_clouds.errors() as exc:
                code = aws_clouds.error_code(exc)
                if code in _GONE:
                    return
                if code not in _IN_USE:
                    raise aws_clouds.translate(exc, command) from None
            delay = next(delays, TERMINATE_BACKOFF_S[-1])
            if self._clock() + delay > deadline:
                msg = (
                    f"still in use after {RELEASE_WAIT_S:.0f} s: "
                    "the job's instances are not all gone"
                )
                raise CostguardError(msg, hint=f"once they are: {command}")
            self._sleep(delay)

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
        """``DescribeInstances`` of one instance; an unknown id is :attr:`State.MISSING`,
        unless it was launched within :data:`VISIBLE_WITHIN_S` (then it is described again
        with backoff, and :attr:`State.PENDING` while EC2 does not show it yet)."""
        instance = self._describe(handle)
        fresh = instance is None and self._fresh(handle)
        for delay in DESCRIBE_BACKOFF_S if fresh else ():
            self._sleep(delay)
            instance = self._describe(handle)
            if instance is not None:
                break
        if instance is None:
            if fresh:
                return Status(handle, State.PENDING, "launched; EC2 does not show the instance yet")
            return Status(handle, State.MISSING, "EC2 no longer knows the instance")
        return _status_of(handle, instance)

    def statuses(self, handles: Sequence[Handle]) -> list[Status]:
        """Many instances' states from one ``DescribeInstances`` per region (per
        :attr:`describe_ids` of them), filtered by ``instance-id`` rather than naming
        ``InstanceIds``: one id EC2 does not know (yet, or any more) would fail the whole
        call; filtered, it is only left out, and :meth:`status` asks of it alone
        (:meth:`Launcher.batched <costguard.spot.launcher.base.Launcher.batched>`)."""
        return self.batched(handles, self._listed)

    def _listed(self, handles: Sequence[Handle]) -> dict[int, Status]:
        where: dict[str, list[int]] = {}
        for at, handle in enumerate(handles):
            # An id that is no instance id (job.json is not trusted; a wildcard would list
            # the account) is described alone, never written into a filter.
            if _INSTANCE_ID.fullmatch(handle.instance_id):
                where.setdefault(handle.region, []).append(at)
        shown: dict[int, Status] = {}
        for region, positions in where.items():
            ec2 = self._ec2(region)
            for start in range(0, len(positions), self.describe_ids):
                chunk = positions[start : start + self.describe_ids]
                ids = list(dict.fromkeys(handles[at].instance_id for at in chunk))
                filters = [{"Name": "instance-id", "Values": ids}]
                try:
                    pages = aws_clouds.paginate(
                        ec2, "describe_instances", "Reservations", Filters=filters
                    )
                    reservations = list(pages)
                except aws_clouds.errors() as exc:
                    action = f"describing {len(ids)} instances in {region}"
                    raise aws_clouds.translate(exc, action) from None
                found = {
                    str(i.get("InstanceId")): i
                    for r in reservations
                    for i in r.get("Instances", [])
                }
                for at in chunk:
                    instance = found.get(handles[at].instance_id)
                    if instance is not None:
                        shown[at] = _status_of(handles[at], instance)
        return shown

    def _describe(self, handle: Handle) -> Mapping[str, Any] | None:
        """The instance as ``DescribeInstances`` shows it; None when EC2 does not."""
        ec2 = self._ec2(handle.region)
        try:
            answer = ec2.describe_instances(InstanceIds=[handle.instance_id])
        except aws_clouds.errors() as exc:
            if aws_clouds.error_code(exc) in _NOT_FOUND:
                return None
            raise aws_clouds.translate(exc, f"describing {handle.instance_id}") from None
        found = [i for r in answer.get("Reservations", []) for i in r.get("Instances", [])]
        return found[0] if found else None

    # -------------------------------------------------------------- terminate

    def terminate(self, handle: Handle) -> None:
        """``TerminateInstances``, confirmed by the state EC2 answers (``shutting-down`` or
        ``terminated``). A NotFound is "already gone" only for an instance launched longer
        than :data:`VISIBLE_WITHIN_S` ago; for a fresh one the terminate is sent again with
        backoff for at most :attr:`terminate_wait_s`, then a :class:`CostguardError` says
        that EC2 does not show the instance yet and how to finish the terminate (it may
        still start: it must not be left unsaid, nor may a command hang for it)."""
        ec2 = self._ec2(handle.region)
        delays = iter(TERMINATE_BACKOFF_S)
        deadline = self._clock() + self.terminate_wait_s
        sent = 0
        while True:
            sent += 1
            try:
                answer = ec2.terminate_instances(InstanceIds=[handle.instance_id])
            except aws_clouds.errors() as exc:
                if aws_clouds.error_code(exc) not in _NOT_FOUND:
                    raise aws_clouds.translate(exc, f"terminating {handle.instance_id}") from None
                if not self._fresh(handle):
                    return
                seen = "EC2 does not show the instance yet"
            else:
                states = [
                    str(i.get("CurrentState", {}).get("Name", ""))
                    for i in answer.get("TerminatingInstances", [])
                ]
                if states and all(s in ENDING_STATES for s in states):
                    return
                seen = f"EC2 answered the state {', '.join(states) or 'of nothing'}"
                if not self._fresh(handle):
                    break
            delay = next(delays, TERMINATE_BACKOFF_S[-1])
            if self._clock() + delay > deadline:
                break
            self._sleep(delay)
        msg = (
            f"EC2 did not confirm terminating {handle.instance_id} in {handle.region} "
            f"({sent} requests in {self.terminate_wait_s:.0f} s): {seen}, and it may still run"
        )
        raise CostguardError(
            msg,
            hint="attach to the job again to finish it (costguard launch --attach URL), or "
            f"check: aws ec2 describe-instances --region {handle.region} "
            f"--instance-ids {handle.instance_id}",
        )

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
                        self._handle(
                            where,
                            instance,
                            attempt=tags.get(ATTEMPT_TAG, ""),
                            owner=tags.get(OWNER_TAG, ""),
                            client_token=str(instance.get("ClientToken", "")),
                            **node.noted(tags),
                        )
                    )
        return found
