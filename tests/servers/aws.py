"""Helpers for the AWS side of the suites: moto (the real EC2 API over HTTP) needs no fake,
only an account set up the way ``infra/aws`` describes, a spot reclaim (moto has no API
for one) and a look at what the SDK sent.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import pytest

from costguard.clouds import aws as aws_clouds
from tests.servers.http import Loopback

REPO = Path(__file__).resolve().parents[2]
AWS_LAUNCH_OPTIONS = {"image": "ami-12345678", "instance_profile": "costguard-instance"}


def launch_account() -> dict[str, str]:
    """In a clean moto account (``aws_env``): the ``costguard-instance`` role and instance
    profile that ``infra/aws/launcher-instance-role-*.json`` describe; the options that
    launch into it."""

    iam = aws_clouds.client("iam", attempts=1)
    trust = (REPO / "infra" / "aws" / "launcher-instance-role-trust.json").read_text()
    iam.create_role(RoleName="costguard-instance", AssumeRolePolicyDocument=trust)
    iam.create_instance_profile(InstanceProfileName="costguard-instance")
    iam.add_role_to_instance_profile(
        InstanceProfileName="costguard-instance", RoleName="costguard-instance"
    )
    return dict(AWS_LAUNCH_OPTIONS)


def reclaim_aws_instance(instance_id: str, region: str = "us-east-1") -> None:
    """What a spot interruption leaves behind: the instance terminated with the state reason
    ``Server.SpotInstanceTermination``.

    moto cannot interrupt an instance through its API; its server runs in this process
    (``moto_server``), so the instance is terminated in moto's backend and given the reason
    EC2 records for a reclaim.
    """
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    instance = ec2_backends[DEFAULT_ACCOUNT_ID][region].get_instance(instance_id)
    instance.terminate()
    instance.state_reason = StateReason(
        "Server.SpotInstanceTermination: Spot instance termination",
        "Server.SpotInstanceTermination",
    )


def recording_clients(sent: list[bytes]) -> Any:
    """EC2 clients that keep the body of every RunInstances request sent to moto."""

    def make(region: str) -> Any:
        client = aws_clouds.client("ec2", region, attempts=1)

        def keep(request: Any, **_: Any) -> None:
            body = request.body or b""
            sent.append(body.encode() if isinstance(body, str) else bytes(body))

        client.meta.events.register(  # once: the client is shared
            "before-send.ec2.RunInstances", keep, unique_id=f"keep-{id(sent)}"
        )
        return client

    return make


@contextmanager
def moto_clock(at: datetime) -> Iterator[None]:
    """Launch instances as if at ``at`` (moto stamps LaunchTime with its own clock)."""
    from moto.ec2.models import instances as moto_instances

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(moto_instances, "utcnow", lambda: at.astimezone(UTC).replace(tzinfo=None))
        yield


def launch_instance(ec2: Any, name: str, instance_type: str = "g5.xlarge", *, at: datetime,
                    tags: dict[str, str] | None = None) -> str:  # fmt: skip
    """A running instance named ``name``, launched (for moto) at ``at``; its id."""
    all_tags = [{"Key": "Name", "Value": name}] + [
        {"Key": k, "Value": v} for k, v in (tags or {}).items()
    ]
    with moto_clock(at):
        reply = ec2.run_instances(
            ImageId="ami-12c6146b",
            MinCount=1,
            MaxCount=1,
            InstanceType=instance_type,
            TagSpecifications=[{"ResourceType": "instance", "Tags": all_tags}],
        )
    return str(reply["Instances"][0]["InstanceId"])


def every_five_minutes(now: datetime, values: list[float] | float) -> list[tuple[datetime, float]]:
    """Thirteen datapoints, one per 5 minutes back from 2 minutes before ``now`` (covers 60
    minutes)."""
    seq = values if isinstance(values, list) else [values] * 13
    return [(now - timedelta(minutes=2 + 5 * k), v) for k, v in enumerate(seq)]


class Metrics:
    """CloudWatch datapoints up to ``now``, gathered per namespace, sent in a few
    PutMetricData calls."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.data: dict[str, list[dict[str, Any]]] = {}

    def put(self, namespace: str, metric: str, dims: dict[str, str],
            data: list[tuple[datetime, float]]) -> None:  # fmt: skip
        dimensions = [{"Name": k, "Value": v} for k, v in dims.items()]
        self.data.setdefault(namespace, []).extend(
            {"MetricName": metric, "Dimensions": dimensions, "Timestamp": t, "Value": v}
            for t, v in data
        )

    def seed(self, instance_id: str, *, gpu: list[float] | float | None = 1.0,
             cpu: float = 2.0, net_bytes: float = 1000.0, gpus: int = 1) -> None:  # fmt: skip
        """CPU and network as EC2 publishes them; the GPU series as the CloudWatch agent
        with ``infra/cloudwatch-agent.json`` does: one per GPU (``index``, ``name`` and the
        appended ``InstanceId``) and the per-instance aggregate."""
        dims = {"InstanceId": instance_id}
        if gpu is not None:
            self.put("CWAgent", "nvidia_smi_utilization_gpu", dims, self.points(gpu))
            for index in range(gpus):
                per_gpu = {**dims, "index": str(index), "name": "NVIDIA A10G"}
                self.put("CWAgent", "nvidia_smi_utilization_gpu", per_gpu, self.points(gpu))
        self.put("AWS/EC2", "CPUUtilization", dims, self.points(cpu))
        self.put("AWS/EC2", "NetworkIn", dims, self.points(net_bytes))
        self.put("AWS/EC2", "NetworkOut", dims, self.points(net_bytes))

    def points(self, values: list[float] | float) -> list[tuple[datetime, float]]:
        return every_five_minutes(self.now, values)

    def send(self, cloudwatch: Any) -> None:
        for namespace, data in self.data.items():
            for start in range(0, len(data), 1000):  # the PutMetricData limit
                cloudwatch.put_metric_data(
                    Namespace=namespace, MetricData=data[start : start + 1000]
                )


# -- EC2 as the real service behaves and moto does not: eventual consistency, paging ---------

#: An HTTP answer: status, headers, body.
Reply = tuple[int, Sequence[tuple[str, str]], bytes]
#: Headers not passed back from moto (the loopback server sets its own).
_HOP = ("content-length", "transfer-encoding", "connection", "server", "date")
#: A ``DescribeInstances`` answer that lists nothing.
_EMPTY_RESERVATIONS = (
    b"<?xml version='1.0' encoding='UTF-8'?>"
    b'<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
    b"<requestId>costguard-fault-layer</requestId><reservationSet/>"
    b"</DescribeInstancesResponse>"
)


@dataclass
class Ec2Faults:
    """What the fault layer in front of moto does to EC2 (query protocol) requests.

    ``hidden_calls``: a freshly launched instance stays invisible for this many requests
    that name it, counted per instance (``DescribeInstances`` by id, ``TerminateInstances``
    and ``CreateTags`` answer ``InvalidInstanceID.NotFound`` without reaching moto;
    filtered ``DescribeInstances`` leave it out), as EC2's eventual consistency does right
    after ``RunInstances`` ("a NotFound does not mean the instance does not exist").
    ``stale_calls``: after a ``TerminateInstances``, this many ``DescribeInstances`` by id
    still show the instance ``running``. ``page_size``: ``DescribeInstanceTypes`` answers
    at most this many types per page, with a ``NextToken`` (0: moto's single page).
    Counts, not seconds: a test's outcome does not depend on the machine's load.

    ``RunInstances`` with a ``ClientToken`` is idempotent, as EC2 documents it and moto
    does not (it ignores the token): a repeat of a successful request with the same token
    in the same region answers the first request's response and launches nothing; with
    other parameters (the Availability Zone aside) it answers
    ``IdempotentParameterMismatch``. ``DescribeInstances`` takes the ``client-token``
    filter (moto has none) and, like any filtered listing, leaves hidden instances out.
    """

    hidden_calls: int = 0
    stale_calls: int = 0
    page_size: int = 0
    #: The next this many successful ``RunInstances`` lose their answer: the instance is
    #: launched, the client gets an HTTP 503 (a timeout or a dropped connection after EC2
    #: acted looks the same to it).
    lost_answers: int = 0
    #: The next this many ``RunInstances`` answer ``RequestLimitExceeded`` (EC2's API
    #: throttling: HTTP 503, launching nothing), counted in ``throttled``; the time of every
    #: ``RunInstances`` that reached the layer is kept in ``run_times`` (monotonic).
    throttle_runs: int = 0
    #: The next this many ``CreateFleet`` answer ``RequestLimitExceeded`` too ("Account
    #: ... has been throttled on ec2:CreateFleet because it exceeded its request rate
    #: limit"): refused before EC2 acts, so nothing is launched and the client token is
    #: not taken. Counted in ``throttled`` with the throttled ``RunInstances``.
    throttle_fleets: int = 0
    throttled: int = 0
    run_times: list[float] = field(default_factory=list)
    #: Availability Zones with no capacity: a ``RunInstances`` placed in one answers
    #: ``InsufficientInstanceCapacity``.
    full_zones: set[str] = field(default_factory=set)
    #: instance id -> requests naming it still to answer NotFound / stale.
    hidden: dict[str, int] = field(default_factory=dict)
    stale: dict[str, int] = field(default_factory=dict)
    #: How many NotFound answers and stale views were given, and every Action seen.
    not_found: int = 0
    stale_views: int = 0
    launched: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    #: (region, client token) -> the parameters and the answer of the request that used it.
    tokens: dict[tuple[str, str], tuple[list[tuple[str, str]], Reply]] = field(default_factory=dict)
    #: How many repeated tokens were answered from the first request / refused.
    replayed: int = 0
    mismatched: int = 0
    #: How many instances the place has room for when a ``CreateFleet`` asks (None: as
    #: many as asked). A fleet whose ``MinTargetCapacity`` is more than the room launches
    #: nothing and says so in its ``errorSet`` ("If this minimum capacity isn't reached,
    #: no instances are launched"); one without a minimum launches what fits.
    fleet_room: int | None = None
    #: The next this many fleets launch one instance fewer than asked whatever their
    #: minimum says (capacity gone between EC2's check and the launch), with an error.
    short_fleets: int = 0
    #: The parameters of every ``CreateFleet`` that reached the layer.
    fleets: list[dict[str, str]] = field(default_factory=list)
    #: Cluster placement groups (moto has none): (region, name) -> strategy and tags, and
    #: the groups' instances: (region, name) -> instance ids launched into it.
    placement_groups: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    #: Launch template id -> the security groups and placement group its fleets use, and
    #: the instances launched in each security group (for ``DependencyViolation``).
    template_groups: dict[str, list[str]] = field(default_factory=dict)
    in_group: dict[str, list[str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hide(self, ids: list[str]) -> bool:
        """Whether a request naming ``ids`` finds one of them invisible (and count it)."""
        with self.lock:
            hiding = [i for i in ids if self.hidden.get(i, 0) > 0]
            for instance_id in hiding:
                self.hidden[instance_id] -= 1
            self.not_found += bool(hiding)
            return bool(hiding)


def _ids(form: Mapping[str, list[str]]) -> list[str]:
    return [v[0] for k, v in form.items() if re.fullmatch(r"InstanceId\.\d+", k)]


def _error(code: str, message: str) -> Reply:
    """An EC2 error answer (query protocol), as EC2 words it."""
    body = (
        "<?xml version='1.0' encoding='UTF-8'?><Response><Errors><Error>"
        f"<Code>{code}</Code><Message>{message}</Message>"
        "</Error></Errors><RequestID>costguard-fault-layer</RequestID></Response>"
    )
    return 400, [("Content-Type", "text/xml")], body.encode()


def _not_found(ids: list[str]) -> Reply:
    return _error("InvalidInstanceID.NotFound", f"The instance IDs '{', '.join(ids)}' do not exist")


def _region(headers: Mapping[str, str]) -> str:
    """The region a SigV4-signed request was signed for (its credential scope)."""
    auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    found = re.search(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/ec2/", auth)
    return found.group(1) if found else ""


def _parameters(form: Mapping[str, list[str]]) -> list[tuple[str, str]]:
    """What EC2 compares between two requests with one client token: every parameter but
    the token and the Availability Zone."""
    return sorted(
        (k, v[0]) for k, v in form.items() if k not in ("ClientToken", "Placement.AvailabilityZone")
    )


def _token_filter(form: Mapping[str, list[str]]) -> tuple[list[str], dict[str, list[str]]]:
    """The values of a ``client-token`` filter, and the request without it (other filters
    renumbered), for moto, which has no such filter."""
    filters: dict[str, dict[str, list[str]]] = {}
    rest: dict[str, list[str]] = {}
    for key, values in form.items():
        parts = key.split(".")
        if parts[0] == "Filter" and len(parts) >= 3:
            filters.setdefault(parts[1], {})[".".join(parts[2:])] = values
        else:
            rest[key] = values
    tokens: list[str] = []
    kept = 0
    for number in sorted(filters, key=int):
        one = filters[number]
        if one.get("Name") == ["client-token"]:
            tokens += [v[0] for k, v in one.items() if k.startswith("Value.")]
            continue
        kept += 1
        rest.update({f"Filter.{kept}.{k}": v for k, v in one.items()})
    return tokens, rest


def _tagger(root: ET.Element) -> Callable[[str], str]:
    """Names of elements in the namespace of the response (EC2's API version)."""
    namespace = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    return lambda name: f"{namespace}{name}"


class Ec2FaultLayer:
    """A loopback HTTP proxy to moto for EC2 (``AWS_ENDPOINT_URL_EC2``) that applies
    :class:`Ec2Faults`; every other service keeps reaching moto directly."""

    def __init__(self, upstream: str, faults: Ec2Faults) -> None:
        self.upstream = upstream
        self.faults = faults
        self._loopback = Loopback(self._answer)
        self.url = self._loopback.url

    def stop(self) -> None:
        self._loopback.stop()

    def _forward(self, target: str, headers: Mapping[str, str], body: bytes) -> Reply:
        sent = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}
        forward = urllib.request.Request(self.upstream + target, data=body, method="POST",
                                         headers=sent)  # fmt: skip
        try:
            with urllib.request.urlopen(forward, timeout=30) as answer:
                passed = [(k, v) for k, v in answer.headers.items() if k.lower() not in _HOP]
                return answer.status, passed, answer.read()
        except urllib.error.HTTPError as error:
            passed = [(k, v) for k, v in error.headers.items() if k.lower() not in _HOP]
            return error.code, passed, error.read()

    def _answer(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> Reply:
        form = parse_qs(body.decode())
        action = form.get("Action", [""])[0]
        faults = self.faults
        faults.actions.append(action)
        ids = _ids(form)
        if action in ("DescribeInstances", "TerminateInstances") and ids and faults.hide(ids):
            return _not_found(ids)
        tagged = [v[0] for k, v in form.items()
                  if re.fullmatch(r"ResourceId\.\d+", k) and v[0].startswith("i-")]  # fmt: skip
        if action == "CreateTags" and tagged and faults.hide(tagged):
            return _not_found(tagged)
        if action == "RunInstances":
            refusal = self._refuse_run(form)
            if refusal is not None:
                return refusal
        if action == "CreateFleet" and self._throttle_fleet():
            refused = _error(
                "RequestLimitExceeded",
                "Request limit exceeded. Account has been throttled on ec2:CreateFleet "
                "because it exceeded its request rate limit.",
            )
            return 503, refused[1], refused[2]
        launching = action in ("RunInstances", "CreateFleet")
        token = form.get("ClientToken", [""])[0] if launching else ""
        key = (_region(headers), token)
        if token and key in faults.tokens:
            return self._repeat(key, _parameters(form))
        if action in _PLACEMENT_ACTIONS:
            return self._placement(action, key[0], form)
        if action == "DeleteSecurityGroup" and self._in_use(form.get("GroupId", [""])[0]):
            return _error("DependencyViolation", "resource sg has a dependent object")
        if action == "CreateFleet":
            return self._fleet(target, headers, form, key)
        if action == "DescribeInstances":
            tokens, rest = _token_filter(form)
            if tokens:
                body = self._by_token(key[0], tokens, rest)
                if not body:
                    return 200, [("Content-Type", "text/xml")], _EMPTY_RESERVATIONS
        status, passed, data = self._forward(target, headers, body)
        if status != 200:
            return status, passed, data
        if action == "RunInstances":
            launched = re.findall(rb"<instanceId>(i-[0-9a-f]+)</instanceId>", data)
            with faults.lock:
                if token:
                    faults.tokens[key] = (_parameters(form), (status, passed, data))
                for raw in launched:
                    faults.launched.append(raw.decode())
                    faults.hidden[raw.decode()] = faults.hidden_calls
                if faults.lost_answers > 0:
                    faults.lost_answers -= 1
                    return (
                        503,
                        [("Content-Type", "text/xml")],
                        _error(
                            "Unavailable", "The service is unavailable. Please try again shortly."
                        )[2],
                    )
        elif action == "TerminateInstances":
            with faults.lock:
                faults.stale.update(dict.fromkeys(ids, faults.stale_calls))
        elif action == "CreateLaunchTemplate":
            made = re.search(rb"<launchTemplateId>(lt-[0-9a-f]+)<", data)
            groups = [
                v[0]
                for k, v in form.items()
                if re.fullmatch(r"LaunchTemplateData\.SecurityGroupId\.\d+", k)
            ]
            if made:
                with faults.lock:
                    faults.template_groups[made.group(1).decode()] = groups
        elif action == "DescribeInstances":
            data = self._describe(data, by_id=bool(ids))
        elif action == "DescribeInstanceTypes" and faults.page_size:
            data = self._page(data, form.get("NextToken", [""])[0])
        return status, passed, data

    def _refuse_run(self, form: Mapping[str, list[str]]) -> Reply | None:
        """A ``RunInstances`` refused as EC2 refuses it when throttled or full, or None."""
        with self.faults.lock:
            self.faults.run_times.append(time.monotonic())
            if self.faults.throttle_runs > 0:
                self.faults.throttle_runs -= 1
                self.faults.throttled += 1
                _, headers, body = _error("RequestLimitExceeded", "Request limit exceeded.")
                return 503, headers, body
        zone = form.get("Placement.AvailabilityZone", [""])[0]
        if zone in self.faults.full_zones:
            return _error(
                "InsufficientInstanceCapacity",
                f"We currently do not have sufficient capacity in the Availability Zone {zone}.",
            )
        return None

    def _throttle_fleet(self) -> bool:
        """Whether this ``CreateFleet`` is refused for the request rate (and count it)."""
        with self.faults.lock:
            if self.faults.throttle_fleets <= 0:
                return False
            self.faults.throttle_fleets -= 1
            self.faults.throttled += 1
            return True

    def _repeat(self, key: tuple[str, str], parameters: list[tuple[str, str]]) -> Reply:
        """A ``RunInstances`` with a token seen before: the first answer, or the mismatch."""
        with self.faults.lock:
            first, answer = self.faults.tokens[key]
            if first != parameters:
                self.faults.mismatched += 1
                return _error(
                    "IdempotentParameterMismatch",
                    "Arguments on this idempotent request are inconsistent with arguments "
                    "used in previous request(s).",
                )
            self.faults.replayed += 1
            return answer

    def _by_token(self, region: str, tokens: list[str], rest: dict[str, list[str]]) -> bytes:
        """The request for moto that lists the instances launched with ``tokens`` (as an
        ``instance-id`` filter); empty when no request used them."""
        with self.faults.lock:
            answers = [self.faults.tokens[(region, t)][1][2] for t in tokens
                       if (region, t) in self.faults.tokens]  # fmt: skip
        ids = [i.decode() for a in answers for i in re.findall(rb"<instanceId>(i-[0-9a-f]+)<", a)]
        if not ids:
            return b""
        number = 1 + len({k.split(".")[1] for k in rest if k.startswith("Filter.")})
        rest[f"Filter.{number}.Name"] = ["instance-id"]
        rest.update({f"Filter.{number}.Value.{n}": [i] for n, i in enumerate(ids, 1)})
        return urlencode([(k, v[0]) for k, v in rest.items()]).encode()

    def _describe(self, data: bytes, *, by_id: bool) -> bytes:
        """Leave hidden instances out of a filtered listing; show a just-terminated one as
        ``running`` to a describe by id."""
        root = ET.fromstring(data)
        _tag = _tagger(root)
        reservations = root.find(_tag("reservationSet"))
        changed = False
        for reservation in list(reservations if reservations is not None else []):
            instances = reservation.find(_tag("instancesSet"))
            for instance in list(instances if instances is not None else []):
                instance_id = instance.findtext(_tag("instanceId"), "")
                with self.faults.lock:
                    hidden = not by_id and self.faults.hidden.get(instance_id, 0) > 0
                    stale = by_id and self.faults.stale.get(instance_id, 0) > 0
                    if stale:
                        self.faults.stale[instance_id] -= 1
                        self.faults.stale_views += 1
                if hidden and instances is not None:
                    instances.remove(instance)
                    changed = True
                elif stale:
                    state = instance.find(_tag("instanceState"))
                    assert state is not None
                    state.find(_tag("code")).text = "16"  # type: ignore[union-attr]
                    state.find(_tag("name")).text = "running"  # type: ignore[union-attr]
                    changed = True
            if instances is not None and len(instances) == 0 and reservations is not None:
                reservations.remove(reservation)
        return ET.tostring(root, encoding="utf-8", xml_declaration=True) if changed else data

    def _page(self, data: bytes, token: str) -> bytes:
        """One page of ``DescribeInstanceTypes``: ``page_size`` types from the offset the
        ``NextToken`` carries, and the next token while types remain."""
        root = ET.fromstring(data)
        _tag = _tagger(root)
        listed = root.find(_tag("instanceTypeSet"))
        assert listed is not None
        items = list(listed)
        start = int(token) if token else 0
        end = start + self.faults.page_size
        for item in items[:start] + items[end:]:
            listed.remove(item)
        if end < len(items):
            ET.SubElement(root, _tag("nextToken")).text = str(end)
        return ET.tostring(root, encoding="utf-8", xml_declaration=True)

    # -- CreateFleet (instant): moto launches every instance asked for, whatever the
    # minimum; the layer decides how many there is room for first.

    def _fleet(
        self,
        target: str,
        headers: Mapping[str, str],
        form: dict[str, list[str]],
        key: tuple[str, str],
    ) -> Reply:
        faults = self.faults
        parameters = _parameters(form)
        asked = int(form["TargetCapacitySpecification.TotalTargetCapacity"][0])
        minimum = max(
            int(form.get(f"{kind}.MinTargetCapacity", ["0"])[0])
            for kind in ("SpotOptions", "OnDemandOptions")
        )
        with faults.lock:
            faults.fleets.append({k: v[0] for k, v in form.items()})
            room = asked if faults.fleet_room is None else min(asked, faults.fleet_room)
            short = faults.short_fleets > 0
            if short:
                faults.short_fleets -= 1
                room = min(room, asked - 1)
        if not short and (room < minimum or room == 0):
            answer = _fleet_answer(
                b"",
                "InsufficientInstanceCapacity",
                "There is no Spot capacity available that matches your request.",
            )
            if key[1]:
                with faults.lock:
                    faults.tokens[key] = (parameters, answer)
            return answer
        if room < asked:
            for name in ("TotalTargetCapacity", "SpotTargetCapacity", "OnDemandTargetCapacity"):
                if f"TargetCapacitySpecification.{name}" in form:
                    form[f"TargetCapacitySpecification.{name}"] = [str(room)]
        sent = urlencode([(k, v[0]) for k, v in form.items()]).encode()
        status, passed, data = self._forward(target, headers, sent)
        if status != 200:
            return status, passed, data
        if room < asked:
            data = _fleet_answer(
                data,
                "InsufficientInstanceCapacity",
                f"Only {room} of {asked} instances could be launched.",
            )[2]
        launched = [i.decode() for i in re.findall(rb"<(?:\w+:)?item>(i-[0-9a-f]+)</", data)]
        template = form.get("LaunchTemplateConfigs.1.LaunchTemplateSpecification.LaunchTemplateId")
        placement = form.get("LaunchTemplateConfigs.1.Overrides.1.Placement.GroupName")
        with faults.lock:
            for instance_id in launched:
                faults.launched.append(instance_id)
                faults.hidden[instance_id] = faults.hidden_calls
            for group in faults.template_groups.get(template[0] if template else "", []):
                faults.in_group.setdefault(group, []).extend(launched)
            if placement:
                faults.in_group.setdefault(f"pg:{key[0]}:{placement[0]}", []).extend(launched)
            answer = (status, passed, data)
            if key[1]:
                faults.tokens[key] = (parameters, answer)
        return answer

    def _in_use(self, group: str) -> bool:
        """Whether an instance launched into ``group`` is not terminated yet (moto's own
        state of it, in this process)."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends

        with self.faults.lock:
            ids = list(self.faults.in_group.get(group, []))
        for backend in ec2_backends[DEFAULT_ACCOUNT_ID].values():
            for instance_id in ids:
                try:
                    instance = backend.get_instance(instance_id)
                except Exception:  # moto's NotFound: an instance of another region
                    continue
                if instance.state != "terminated":
                    return True
        return False

    # -- placement groups, as the EC2 API reference words them (moto has none)

    def _placement(self, action: str, region: str, form: dict[str, list[str]]) -> Reply:
        groups = self.faults.placement_groups
        if action == "CreatePlacementGroup":
            name = form["GroupName"][0]
            if (region, name) in groups:
                return _error(
                    "InvalidPlacementGroup.Duplicate",
                    f"The placement group '{name}' already exists.",
                )
            tags = {
                form[k][0]: form.get(k[: -len("Key")] + "Value", [""])[0]
                for k in form
                if re.fullmatch(r"TagSpecification\.1\.Tag\.\d+\.Key", k)
            }
            groups[(region, name)] = {"strategy": form.get("Strategy", [""])[0], "tags": tags}
            body = f"<placementGroup>{_group_xml(name, groups[(region, name)])}</placementGroup>"
            return _ok("CreatePlacementGroupResponse", body)
        if action == "DeletePlacementGroup":
            name = form["GroupName"][0]
            if (region, name) not in groups:
                return _error(
                    "InvalidPlacementGroup.Unknown", f"The placement group '{name}' is unknown."
                )
            if self._in_use(f"pg:{region}:{name}"):
                return _error(
                    "InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use."
                )
            del groups[(region, name)]
            return _ok("DeletePlacementGroupResponse", "<return>true</return>")
        names = [v[0] for k, v in form.items() if re.fullmatch(r"GroupName\.\d+", k)]
        wanted: dict[str, str] = {}
        for key, values in form.items():
            found = re.fullmatch(r"Filter\.(\d+)\.Name", key)
            if found and values[0].startswith("tag:"):
                wanted[values[0][4:]] = form.get(f"Filter.{found[1]}.Value.1", [""])[0]
        items = "".join(
            f"<item>{_group_xml(name, group)}</item>"
            for (where, name), group in sorted(groups.items())
            if where == region
            and (not names or name in names)
            and all(group["tags"].get(k) == v for k, v in wanted.items())
        )
        missing = [n for n in names if (region, n) not in groups]
        if missing:
            return _error(
                "InvalidPlacementGroup.Unknown", f"The placement group '{missing[0]}' is unknown."
            )
        return _ok(
            "DescribePlacementGroupsResponse", f"<placementGroupSet>{items}</placementGroupSet>"
        )


_PLACEMENT_ACTIONS = ("CreatePlacementGroup", "DeletePlacementGroup", "DescribePlacementGroups")
_XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"


def _ok(name: str, body: str) -> Reply:
    text = (
        f"<?xml version='1.0' encoding='UTF-8'?><{name} xmlns=\"{_XMLNS}\">"
        f"<requestId>costguard-fault-layer</requestId>{body}</{name}>"
    )
    return 200, [("Content-Type", "text/xml")], text.encode()


def _group_xml(name: str, group: Mapping[str, Any]) -> str:
    tags = "".join(
        f"<item><key>{k}</key><value>{v}</value></item>" for k, v in group["tags"].items()
    )
    return (
        f"<groupName>{name}</groupName><strategy>{group['strategy']}</strategy>"
        f"<state>available</state><groupId>pg-{abs(hash(name)) % 16**17:017x}</groupId>"
        f"<tagSet>{tags}</tagSet>"
    )


def _fleet_answer(data: bytes, code: str, message: str) -> Reply:
    """A ``CreateFleet`` answer with an ``errorSet`` item (``data``: moto's answer to add
    it to; empty: a fleet that launched nothing)."""
    if not data:
        body = "<fleetId>fleet-00000000-0000-0000-0000-000000000000</fleetId><fleetInstanceSet/>"
        data = _ok("CreateFleetResponse", body)[2]
    root = ET.fromstring(data)
    _tag = _tagger(root)
    errors = root.find(_tag("errorSet"))
    if errors is None:
        errors = ET.SubElement(root, _tag("errorSet"))
    item = ET.SubElement(errors, _tag("item"))
    ET.SubElement(item, _tag("errorCode")).text = code
    ET.SubElement(item, _tag("errorMessage")).text = message
    body = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return 200, [("Content-Type", "text/xml")], body
