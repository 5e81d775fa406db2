"""AWS: EC2 instances and CloudWatch metrics for the reaper, in batches.

Per region and run: one paginated ``DescribeInstances``; one paginated ``ListMetrics`` of
the GPU series; ``GetMetricData`` with up to 500 queries a call (4 per candidate instance:
GPU, CPU, network in and out, and one per per-GPU series), never a call per instance for
metrics; ``DescribeInstanceAttribute`` only for instances about to be acted
on (EC2 returns termination/stop protection nowhere else); stop/terminate/tag calls in
batches of 100.

GPU utilisation comes from the CloudWatch agent's ``nvidia_gpu`` section (namespace
``CWAgent``, metric ``nvidia_smi_utilization_gpu``). The agent must add the ``InstanceId``
dimension (``append_dimensions``) for a metric to be tied to an instance, and should also
publish the per-instance series (``aggregation_dimensions: [["InstanceId"]]``); see
``infra/cloudwatch-agent.json``. Both kinds are read, and each series is a witness of
its own for the policy (``InstanceSamples.per_gpu``; the rules are in
:mod:`costguard.reaper.policy` and docs/reaper.md): anyone allowed
``cloudwatch:PutMetricData`` can publish a series for any instance id, so no series is
preferred and none hides another. When there is no GPU series, the listing tells why.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from costguard.clouds import aws as aws_clouds
from costguard.clouds import pages
from costguard.errors import UnknownNameError
from costguard.reaper.fleet import ActionOutcome, FleetRequest, PriceBook, Sampling
from costguard.reaper.policy import GPU_MAX_LAG_SECONDS as _AGENT_MAX_LAG
from costguard.reaper.policy import Action, Instance, InstanceSamples, Sample, format_timestamp
from costguard.tags import MARK_TAG

#: CloudWatch's basic EC2 metrics come every 5 minutes; asking finer gives nothing more.
#: CloudWatch stamps each datapoint with the *start* of its period.
PERIOD_SECONDS = 300
#: How long before now the newest CPU/network period may end: basic EC2 metrics for a
#: 5-minute period appear up to ~10 minutes after it ends.
MAX_LAG_SECONDS = 600
#: The same for the CloudWatch agent's GPU series, published every minute (see
#: :data:`costguard.reaper.policy.GPU_MAX_LAG_SECONDS`): one silent for longer has stopped.
GPU_MAX_LAG_SECONDS = _AGENT_MAX_LAG
SAMPLING = Sampling(PERIOD_SECONDS, MAX_LAG_SECONDS, GPU_MAX_LAG_SECONDS)
#: The GetMetricData limit on queries per call.
MAX_QUERIES = 500
#: Instances per StopInstances/TerminateInstances/CreateTags call.
ACTION_BATCH = 100
GPU_NAMESPACE = "CWAgent"
GPU_METRIC = "nvidia_smi_utilization_gpu"
#: Instances that bill (or are about to) for compute; stopped ones are not looked at.
LIVE_STATES = ("pending", "running")
AGENT_CONFIG = "infra/cloudwatch-agent.json"

_T = TypeVar("_T")


@dataclass
class _GpuListing:
    """What ``ListMetrics`` says about the region's GPU series."""

    #: Per-GPU series (their full dimensions) by ``InstanceId``.
    per_gpu: defaultdict[str, list[list[dict[str, str]]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    #: Instances with a per-instance series (dimension ``InstanceId`` alone).
    own: set[str] = field(default_factory=set)
    #: Hosts whose GPU series lack the ``InstanceId`` dimension, with how many.
    hosts_without_id: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))


def available_regions() -> list[str]:
    """EC2 regions in botocore's bundled endpoint data (no API call), all partitions."""
    session = aws_clouds.session()
    return sorted(
        {
            region
            for partition in session.get_available_partitions()
            for region in session.get_available_regions("ec2", partition_name=partition)
        }
    )


def check_regions(regions: Sequence[str]) -> tuple[str, ...]:
    """Validate region names offline; :class:`UnknownNameError` (exit 2) for a bad one."""
    known = available_regions()
    for region in regions:
        if region not in known:
            raise UnknownNameError(kind="AWS region", name=region, known=known)
    return tuple(dict.fromkeys(regions))


def default_region() -> str:
    """The region boto3 would use (``AWS_DEFAULT_REGION``, the profile), else us-east-1."""
    return str(aws_clouds.session().region_name or "us-east-1")


def enabled_regions(ec2: Any = None) -> list[str]:
    """The regions this account can use (``--all-regions``): one ``DescribeRegions`` call."""
    ec2 = ec2 if ec2 is not None else aws_clouds.client("ec2")
    try:
        reply = ec2.describe_regions(
            Filters=[{"Name": "opt-in-status", "Values": ["opt-in-not-required", "opted-in"]}]
        )
    except aws_clouds.errors() as exc:
        raise aws_clouds.translate(exc, "listing the enabled regions") from None
    return sorted(r["RegionName"] for r in reply["Regions"])


def _chunks(items: Sequence[_T], size: int) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _dims(instance_id: str) -> list[dict[str, str]]:
    return [{"Name": "InstanceId", "Value": instance_id}]


def _query(query_id: str, namespace: str, name: str, dims: Any, stat: str) -> dict[str, Any]:
    metric = {"Namespace": namespace, "MetricName": name, "Dimensions": dims}
    return {
        "Id": query_id,
        "MetricStat": {"Metric": metric, "Period": PERIOD_SECONDS, "Stat": stat},
        "ReturnData": True,
    }


class AwsFleet:
    """One AWS region. Clients may be injected (tests); by default they come from
    :func:`costguard.clouds.aws.client`, which honours ``AWS_ENDPOINT_URL``. Example::

        fleet = AwsFleet("us-east-1", PriceBook(load_catalog()))
        report = reap([fleet], IdlePolicy(), ReapLimits(), datetime.now(UTC), execute=False)
    """

    provider = "aws"
    sampling = SAMPLING

    def __init__(
        self, region: str, prices: PriceBook, *, ec2: Any = None, cloudwatch: Any = None
    ) -> None:
        self.region = region
        self.prices = prices
        self._clients = {"ec2": ec2, "cloudwatch": cloudwatch}
        self._hosts: dict[str, set[str]] = {}

    @property
    def ec2(self) -> Any:
        """The region's EC2 client (made on first use)."""
        return self._client("ec2")

    @property
    def cloudwatch(self) -> Any:
        """The region's CloudWatch client (made on first use: ``burn`` never needs one)."""
        return self._client("cloudwatch")

    def _client(self, service: str) -> Any:
        if self._clients[service] is None:
            self._clients[service] = aws_clouds.client(service, self.region)
        return self._clients[service]

    @classmethod
    def for_options(cls, request: FleetRequest) -> list[AwsFleet]:
        """One fleet per region asked for (``--region``, ``--all-regions``), else per
        ``request.default_regions``, else the profile's region. Names are checked offline
        first."""
        asked = request.options["regions"]
        regions = check_regions(asked) if asked else ()
        aws_clouds.require_credentials("listing instances")
        if request.options["all_regions"]:
            regions = tuple(enabled_regions())
        chosen = regions or tuple(request.default_regions) or (default_region(),)
        return [cls(region, request.prices) for region in chosen]

    def _call(self, what: str, method: Any, **kwargs: Any) -> Any:
        try:
            return method(**kwargs)
        except aws_clouds.errors() as exc:
            raise aws_clouds.translate(exc, f"{what} in {self.region}") from None

    def instances(self) -> list[Instance]:
        """Pending and running instances, with GPU facts from the tables or the API."""
        try:
            raw = [
                item
                for reservation in aws_clouds.paginate(
                    self.ec2,
                    "describe_instances",
                    "Reservations",
                    Filters=[{"Name": "instance-state-name", "Values": list(LIVE_STATES)}],
                )
                for item in reservation.get("Instances", [])
            ]
        except aws_clouds.errors() as exc:
            raise aws_clouds.translate(exc, f"listing instances in {self.region}") from None
        types = {item["InstanceType"] for item in raw}
        gpus = {t: self.prices.gpus(self.provider, t) for t in types}
        unknown = sorted(t for t, known in gpus.items() if known is None)
        gpus.update(self._describe_types(unknown))
        return [self._instance(item, gpus) for item in raw]

    def _describe_types(self, types: Sequence[str]) -> dict[str, tuple[str | None, int]]:
        """GPU facts for instance types the price tables do not know (new families)."""
        found: dict[str, tuple[str | None, int]] = {}
        for batch in _chunks(types, 100):
            infos = self._call(  # paged: EC2 answers a NextToken, even for named types
                "describing instance types", self._every_type, InstanceTypes=list(batch)
            )
            for info in infos:
                gpu_list = info.get("GpuInfo", {}).get("Gpus", [])
                count = sum(int(g.get("Count", 0)) for g in gpu_list)
                name = gpu_list[0].get("Name") if gpu_list else None
                found[info["InstanceType"]] = (name, count)
        return found

    def _every_type(self, **kwargs: Any) -> list[Any]:
        pages = aws_clouds.paginate(self.ec2, "describe_instance_types", "InstanceTypes", **kwargs)
        return list(pages)

    def _instance(
        self, item: Mapping[str, Any], gpus: Mapping[str, tuple[str | None, int] | None]
    ) -> Instance:
        instance_id = item["InstanceId"]
        instance_type = item["InstanceType"]
        accelerator, count = gpus.get(instance_type) or (None, 0)
        spot = item.get("InstanceLifecycle") == "spot"
        tags = {t["Key"]: t.get("Value", "") for t in item.get("Tags", [])}
        dns = item.get("PrivateDnsName") or ""
        self._hosts[instance_id] = {dns, dns.split(".")[0]} - {""}
        state = item.get("State", {}).get("Name", "")
        return Instance(
            provider=self.provider,
            region=self.region,
            instance_id=instance_id,
            instance_type=instance_type,
            running=state == "running",
            gpu_count=count,
            launched_at=item.get("LaunchTime"),
            tags=tags,
            accelerator=accelerator,
            usd_per_hour=self.prices.usd_per_hour(
                self.provider, self.region, instance_type, spot=spot
            ),
            spot=spot,
            name=tags.get("Name", ""),
            zone=item.get("Placement", {}).get("AvailabilityZone", ""),
            state=state,
        )

    def _metric_data(
        self, queries: Sequence[dict[str, Any]], start: datetime, end: datetime
    ) -> dict[str, list[tuple[datetime, float]]]:
        """Run queries in calls of at most 500, following NextToken; points by query id.

        Asks from one period before ``start``: CloudWatch stamps a datapoint with the start
        of its period and rounds ``StartTime`` down to the minute, so the datapoint whose
        period holds ``start`` is stamped before it, and must be asked for.
        """
        points: dict[str, list[tuple[datetime, float]]] = defaultdict(list)
        for batch in _chunks(queries, MAX_QUERIES):

            def fetch(
                token: str | None, batch: Sequence[dict[str, Any]] = batch
            ) -> tuple[list[dict[str, Any]], str | None]:
                kwargs: dict[str, Any] = {
                    "MetricDataQueries": list(batch),
                    "StartTime": start - timedelta(seconds=PERIOD_SECONDS),
                    "EndTime": end,
                    "ScanBy": "TimestampAscending",
                }
                if token:
                    kwargs["NextToken"] = token
                reply = self._call(
                    "reading CloudWatch metrics", self.cloudwatch.get_metric_data, **kwargs
                )
                return reply.get("MetricDataResults", []), reply.get("NextToken")

            for result in pages(fetch):
                points[result["Id"]].extend(
                    zip(result.get("Timestamps", []), result.get("Values", []), strict=True)
                )
        return points

    def samples(
        self, instances: Sequence[Instance], start: datetime, end: datetime
    ) -> list[InstanceSamples]:
        """One ``ListMetrics`` listing of the GPU series, then ``GetMetricData`` in calls of
        500 queries: per instance its GPU (max), CPU (max) and network in/out (sum) series,
        and each per-GPU series that carries its ``InstanceId``.

        Every GPU series goes to the policy as a witness of its own (``per_gpu``): none
        is preferred, and none is merged into another (a maximum over GPUs per timestamp
        hides a GPU that went silent; a preferred per-instance series can be forged).
        """
        if not instances:
            return []
        listing = self._gpu_listing()
        queries: list[dict[str, Any]] = []
        per_gpu_ids: list[list[tuple[str, str]]] = []  # (GPU, query id) per instance
        for n, instance in enumerate(instances):
            dims = _dims(instance.instance_id)
            queries += [
                _query(f"g{n}", GPU_NAMESPACE, GPU_METRIC, dims, "Maximum"),
                _query(f"c{n}", "AWS/EC2", "CPUUtilization", dims, "Maximum"),
                _query(f"i{n}", "AWS/EC2", "NetworkIn", dims, "Sum"),
                _query(f"o{n}", "AWS/EC2", "NetworkOut", dims, "Sum"),
            ]
            ids = []
            for gpu_dims in listing.per_gpu.get(instance.instance_id, []):
                ids.append((_gpu_name(gpu_dims), f"d{len(queries)}"))
                queries.append(_query(ids[-1][1], GPU_NAMESPACE, GPU_METRIC, gpu_dims, "Maximum"))
            per_gpu_ids.append(ids)
        points = self._metric_data(queries, start, end)
        result = []
        for n, instance in enumerate(instances):
            gpu = _samples(points.get(f"g{n}"))
            per_gpu = tuple(
                (gpu_name, _samples(points.get(query_id))) for gpu_name, query_id in per_gpu_ids[n]
            )
            why = None
            if not gpu and not any(series for _, series in per_gpu):
                why = self._why_no_gpu(instance, listing)
            result.append(
                InstanceSamples(
                    instance,
                    gpu=gpu,
                    cpu=_samples(points.get(f"c{n}")),
                    network=_network(points.get(f"i{n}", []), points.get(f"o{n}", [])),
                    gpu_missing=why,
                    per_gpu=per_gpu,
                )
            )
        return result

    def _gpu_listing(self) -> _GpuListing:
        """The region's GPU series of the last 3 hours (one paginated ``ListMetrics``): the
        per-GPU ones by ``InstanceId``, the per-instance ones, and hosts without an id."""
        try:
            listed = list(
                aws_clouds.paginate(
                    self.cloudwatch,
                    "list_metrics",
                    "Metrics",
                    Namespace=GPU_NAMESPACE,
                    MetricName=GPU_METRIC,
                    RecentlyActive="PT3H",
                )
            )
        except aws_clouds.errors() as exc:
            raise aws_clouds.translate(
                exc, f"listing CloudWatch metrics in {self.region}"
            ) from None
        listing = _GpuListing()
        seen: set[frozenset[tuple[str, str]]] = set()
        for metric in listed:
            dims = metric.get("Dimensions", [])
            key = frozenset((d["Name"], d["Value"]) for d in dims)
            if key in seen:  # ListMetrics may repeat a series (moto does)
                continue
            seen.add(key)
            by_name = dict(key)
            instance_id = by_name.get("InstanceId")
            if instance_id is None:
                listing.hosts_without_id[by_name.get("host", "")] += 1
            elif len(by_name) == 1:
                listing.own.add(instance_id)
            else:
                listing.per_gpu[instance_id].append(dims)
        return listing

    def _why_no_gpu(self, instance: Instance, listing: _GpuListing) -> str:
        has_own = instance.instance_id in listing.own
        hosts = listing.hosts_without_id
        names = self._hosts.get(instance.instance_id, set())
        matched = sorted(names & set(hosts))
        if matched:
            return (
                f"GPU metrics arrive from host {matched[0]} without the InstanceId dimension: "
                f"add append_dimensions InstanceId to the CloudWatch agent ({AGENT_CONFIG})"
            )
        if has_own:
            return "the CloudWatch agent sent no GPU data in the window (is it running?)"
        if hosts:
            return (
                f"no GPU metrics carry this InstanceId, and {sum(hosts.values())} {GPU_NAMESPACE} "
                "GPU series lack the InstanceId dimension: add append_dimensions InstanceId "
                f"to the CloudWatch agent ({AGENT_CONFIG})"
            )
        return (
            f"no GPU metrics: the CloudWatch agent (nvidia_gpu section, {AGENT_CONFIG}) is "
            "not publishing from this instance"
        )

    def confirm_protection(self, instances: Sequence[Instance]) -> list[Instance]:
        """Fill in termination and stop protection: two attribute reads per instance."""
        confirmed = []
        for instance in instances:
            protected = False
            for attribute, key in (
                ("disableApiTermination", "DisableApiTermination"),
                ("disableApiStop", "DisableApiStop"),
            ):
                reply = self._call(
                    "reading instance protection",
                    self.ec2.describe_instance_attribute,
                    InstanceId=instance.instance_id,
                    Attribute=attribute,
                )
                protected = protected or bool(reply.get(key, {}).get("Value"))
            confirmed.append(replace(instance, protected=protected))
        return confirmed

    def apply(
        self, action: Action, instances: Sequence[Instance], now: datetime
    ) -> list[ActionOutcome]:
        """Carry out ``action`` in batches; a failed batch is retried one by one so that one
        bad instance (say, a one-time spot instance that cannot stop) does not block the rest."""
        outcomes: list[ActionOutcome] = []
        for batch in _chunks(instances, ACTION_BATCH):
            outcomes.extend(self._apply_batch(action, batch, now))
        return outcomes

    def _apply_batch(
        self, action: Action, batch: Sequence[Instance], now: datetime
    ) -> list[ActionOutcome]:
        ids = [i.instance_id for i in batch]
        try:
            if action is Action.STOP:
                self.ec2.stop_instances(InstanceIds=ids)
            elif action is Action.TERMINATE:
                self.ec2.terminate_instances(InstanceIds=ids)
            elif action is Action.MARK:
                tag = {"Key": MARK_TAG, "Value": format_timestamp(now)}
                self.ec2.create_tags(Resources=ids, Tags=[tag])
            elif action is Action.UNMARK:
                self.ec2.delete_tags(Resources=ids, Tags=[{"Key": MARK_TAG}])
        except aws_clouds.errors() as exc:
            if len(batch) > 1:
                return [o for i in batch for o in self._apply_batch(action, [i], now)]
            message = aws_clouds.translate(exc, f"{action} {ids[0]}").message
            return [ActionOutcome(batch[0], action, ok=False, message=message)]
        return [ActionOutcome(i, action, ok=True) for i in batch]


def _gpu_name(dims: Sequence[Mapping[str, str]]) -> str:
    """Which GPU a per-GPU series is about: its ``index`` dimension (the agent's), else all
    its dimensions but the instance's.

    >>> _gpu_name([{"Name": "InstanceId", "Value": "i-1"}, {"Name": "index", "Value": "3"}])
    '3'
    """
    by_name = {d["Name"]: d["Value"] for d in dims}
    if "index" in by_name:
        return by_name["index"]
    return ",".join(f"{k}={v}" for k, v in sorted(by_name.items()) if k != "InstanceId")


def _samples(points: Sequence[tuple[datetime, float]] | None) -> tuple[Sample, ...]:
    return tuple(Sample(at, float(v)) for at, v in sorted(points or []))


def _network(
    inbound: Sequence[tuple[datetime, float]], outbound: Sequence[tuple[datetime, float]]
) -> tuple[Sample, ...]:
    """In + out bytes per period as Mbit/s, for periods where both directions reported."""
    out_by_time = dict(outbound)
    seconds = PERIOD_SECONDS
    return tuple(
        Sample(at, (value + out_by_time[at]) * 8 / seconds / 1_000_000)
        for at, value in sorted(inbound)
        if at in out_by_time
    )
