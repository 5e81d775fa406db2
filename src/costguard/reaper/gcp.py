"""GCP: Compute Engine instances and Cloud Monitoring time series for the reaper.

Per project and run: one ``instances.aggregatedList`` (or one ``instances.list`` per
``--zone``), and four ``projects.timeSeries.list`` queries (GPU, CPU, bytes received,
bytes sent), each aligned (and CPU and network reduced to one series per instance) by Cloud
Monitoring itself, so the number of calls does not grow with the fleet (only pages do).

GPU utilisation comes from the Ops Agent (``agent.googleapis.com/gpu/utilization``), one
series per GPU (label ``gpu_number``), not reduced across GPUs: each is a witness of its own
for the policy, so a GPU that went silent is not hidden by the others. A GPU is what the
API lists in ``guestAccelerators``; the accelerator-optimised families (A2, A3, A4, G2)
always have one.

``google-cloud-monitoring`` ships only a gRPC transport, so the time series are read over
its documented REST API (:class:`costguard.clouds.gcp.RestSession`: same credentials, same
``Settings.gcp_endpoint`` override as the compute client).

Label keys cannot hold ``:`` on GCP, so the policy's ``costguard:keep`` is the label
``costguard-keep`` here (likewise ``costguard-expires-at`` and ``costguard-idle-since``,
whose values are Unix seconds).
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from costguard.clouds import READ_TIMEOUT_S, pages, require
from costguard.clouds import gcp as gcp_clouds
from costguard.errors import InputError, check_names, did_you_mean
from costguard.reaper.fleet import ActionOutcome, FleetRequest, PriceBook, Sampling
from costguard.reaper.policy import GPU_MAX_LAG_SECONDS as _AGENT_MAX_LAG
from costguard.reaper.policy import Action, Instance, InstanceSamples, Sample
from costguard.settings import Settings
from costguard.tags import MARK_TAG, from_gcp_label, gcp_label

#: The Ops Agent and Compute Engine metrics are sampled every 60 s. Cloud Monitoring
#: stamps an aligned point with the *end* of its alignment period; the adapter re-stamps it
#: with the start, as the policy expects.
PERIOD_SECONDS = 60
#: How long before now the newest CPU/network period may end: Cloud Monitoring shows
#: compute metrics up to 240 s after sampling.
MAX_LAG_SECONDS = 300
#: The same for the Ops Agent's GPU series, written every minute (see
#: :data:`costguard.reaper.policy.GPU_MAX_LAG_SECONDS`): one silent for longer has stopped.
GPU_MAX_LAG_SECONDS = _AGENT_MAX_LAG
SAMPLING = Sampling(PERIOD_SECONDS, MAX_LAG_SECONDS, GPU_MAX_LAG_SECONDS)
#: The most seconds :meth:`GcpFleet.apply` waits for all its operations together, unless
#: a fleet is given its own ``operation_timeout_s``.
OPERATION_TIMEOUT_S = READ_TIMEOUT_S * 5
GPU_METRIC = "agent.googleapis.com/gpu/utilization"
#: The label of ``GPU_METRIC`` that names the GPU (its index from 0): the Ops Agent's NVML
#: metrics (GoogleCloudPlatform/ops-agent, docs/gcp.md).
GPU_LABEL = "gpu_number"
CPU_METRIC = "compute.googleapis.com/instance/cpu/utilization"
RECEIVED_METRIC = "compute.googleapis.com/instance/network/received_bytes_count"
SENT_METRIC = "compute.googleapis.com/instance/network/sent_bytes_count"
LIVE_STATES = ("PROVISIONING", "STAGING", "RUNNING")
_REGION = re.compile(r"[a-z]+-[a-z]+[0-9]+")
_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
MARK_LABEL = gcp_label(MARK_TAG)


def check_locations(regions: Sequence[str], zones: Sequence[str], known: Sequence[str]) -> None:
    """Validate region and zone names offline against ``known`` regions (the price tables).

    >>> known = ["europe-west4", "us-central1"]
    >>> check_locations(["us-central1"], ["europe-west4-b"], known)
    >>> check_locations(["us-central1-a"], [], known)
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: unknown GCP region 'us-central1-a'
    >>> check_locations(["us-centrl1"], [], known)
    Traceback (most recent call last):
    ...
    costguard.errors.UnknownNameError: unknown GCP region 'us-centrl1'
    """
    hint = "a region looks like us-central1; zones go in --zone"
    check_names("GCP region", regions, known, pattern=_REGION, hint=hint)
    for zone in zones:
        if not _ZONE.fullmatch(zone):
            msg = f"unknown GCP zone {zone!r}"
            raise InputError(msg, hint="a zone looks like us-central1-a")
        region = zone.rsplit("-", 1)[0]
        if region not in known:
            msg = f"unknown GCP zone {zone!r}: region {region!r} is not in the price tables"
            hint = did_you_mean(region, known) or f"known GCP regions: {', '.join(sorted(known))}"
            raise InputError(msg, hint=hint)


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class _Handle:
    """What the actions need that the policy does not: where the instance lives."""

    zone: str
    name: str
    labels: Mapping[str, str]
    fingerprint: str


class GcpFleet:
    """One GCP project. Pass ``credentials`` (or ready clients) to bypass Application
    Default Credentials; ``settings.gcp_endpoint`` redirects every call. Example::

        fleet = GcpFleet("my-lab", PriceBook(load_catalog()), Settings.load(),
                         regions=["us-central1"])
    """

    provider = "gcp"
    sampling = SAMPLING

    @classmethod
    def for_options(cls, request: FleetRequest) -> list[GcpFleet]:
        """The one fleet of ``--project``, its regions and zones checked offline first
        (``default_regions`` is for AWS: a project lists every zone by itself)."""
        options, prices = request.options, request.prices
        regions, zones = options["regions"], options["zones"]
        check_locations(regions, zones, prices.regions(cls.provider))
        return [cls(options["project"], prices, request.settings, regions=regions, zones=zones)]

    def __init__(
        self,
        project: str,
        prices: PriceBook,
        settings: Settings,
        *,
        regions: Sequence[str] = (),
        zones: Sequence[str] = (),
        credentials: Any = None,
        instances_client: Any = None,
        operations_client: Any = None,
        monitoring: Any = None,
        poll_interval_s: float = 1.0,
        operation_timeout_s: float = OPERATION_TIMEOUT_S,
    ) -> None:
        self.project = project
        self.prices = prices
        self.regions = tuple(regions)
        self.zones = tuple(zones)
        self.poll_interval_s = poll_interval_s
        #: How long :meth:`apply` waits for its operations, all together.
        self.operation_timeout_s = operation_timeout_s
        if credentials is None and (
            instances_client is None or operations_client is None or monitoring is None
        ):
            credentials = gcp_clouds.default_credentials()
        self.instances_client = (
            instances_client
            if instances_client is not None
            else gcp_clouds.client(
                "google.cloud.compute_v1", "InstancesClient", settings, credentials
            )
        )
        # Operations are polled with a client of our own, on the same endpoint: the one
        # inside InstancesClient's extended operations ignores the endpoint override and
        # would poll compute.googleapis.com (unreachable from a private endpoint).
        self.operations_client = (
            operations_client
            if operations_client is not None
            else gcp_clouds.client(
                "google.cloud.compute_v1", "ZoneOperationsClient", settings, credentials
            )
        )
        self.monitoring = (
            monitoring
            if monitoring is not None
            else gcp_clouds.RestSession("monitoring", settings, credentials)
        )
        self._handles: dict[str, _Handle] = {}

    def _wanted(self, zone: str) -> bool:
        if self.zones:
            return zone in self.zones
        return not self.regions or zone.rsplit("-", 1)[0] in self.regions

    def instances(self) -> list[Instance]:
        """Live instances in the project (one aggregated listing), or in the given zones."""
        found = []
        try:
            if self.zones:
                for zone in self.zones:
                    pager = self.instances_client.list(project=self.project, zone=zone)
                    found += [(zone, item) for item in pager]
            else:
                pager = self.instances_client.aggregated_list(project=self.project)
                for scope, scoped in pager:
                    zone = gcp_clouds.last_segment(scope)
                    if self._wanted(zone):
                        found += [(zone, item) for item in scoped.instances]
        except gcp_clouds.errors() as exc:
            raise gcp_clouds.translate(exc, f"listing instances in {self.project}") from None
        return [self._instance(zone, item) for zone, item in found if item.status in LIVE_STATES]

    def _instance(self, zone: str, item: Any) -> Instance:
        machine_type = gcp_clouds.last_segment(item.machine_type)
        count = sum(a.accelerator_count for a in item.guest_accelerators)
        accelerator = None
        if item.guest_accelerators:
            name = gcp_clouds.last_segment(item.guest_accelerators[0].accelerator_type)
            accelerator = gcp_clouds.ACCELERATORS.get(name, name)
        elif machine_type.split("-")[0] in gcp_clouds.GPU_FAMILIES:
            known = self.prices.gpus(self.provider, machine_type)
            accelerator, count = known if known and known[1] else (None, 1)
        region = zone.rsplit("-", 1)[0]
        spot = item.scheduling.provisioning_model == "SPOT" or bool(item.scheduling.preemptible)
        labels = dict(item.labels)
        started = item.last_start_timestamp or item.creation_timestamp
        instance_id = str(item.id)
        self._handles[instance_id] = _Handle(zone, item.name, labels, item.label_fingerprint)
        return Instance(
            provider=self.provider,
            region=region,
            instance_id=instance_id,
            instance_type=machine_type,
            running=item.status == "RUNNING",
            gpu_count=count,
            launched_at=gcp_clouds.timestamp(started) if started else None,
            # Deletion protection does not block a stop, but it says "do not touch".
            protected=bool(item.deletion_protection),
            tags={from_gcp_label(k): v for k, v in labels.items()},
            accelerator=accelerator,
            usd_per_hour=self.prices.usd_per_hour(
                self.provider,
                region,
                machine_type,
                spot=spot,
                accelerator=accelerator if item.guest_accelerators else None,
                accelerator_count=count if item.guest_accelerators else None,
            ),
            spot=spot,
            name=item.name,
            zone=zone,
            state=item.status.lower(),
        )

    def _series(
        self, metric: str, aligner: str, reducer: str, start: datetime, end: datetime
    ) -> dict[str, dict[str, list[tuple[datetime, float]]]]:
        """One metric for every instance in the project: points by instance id, then by
        GPU (the ``gpu_number`` label; ``""`` for a series reduced across them)."""
        params: dict[str, str] = {
            "filter": f'metric.type = "{metric}" AND resource.type = "gce_instance"',
            # From one period earlier, so the period holding ``start`` is there however the
            # service aligns its periods.
            "interval.startTime": _rfc3339(start - timedelta(seconds=PERIOD_SECONDS)),
            "interval.endTime": _rfc3339(end),
            "aggregation.alignmentPeriod": f"{PERIOD_SECONDS}s",
            "aggregation.perSeriesAligner": aligner,
            "aggregation.crossSeriesReducer": reducer,
            "view": "FULL",
        }
        if reducer != "REDUCE_NONE":
            params["aggregation.groupByFields"] = "resource.label.instance_id"
        period = timedelta(seconds=PERIOD_SECONDS)

        def fetch(token: str | None) -> tuple[list[dict[str, Any]], str | None]:
            query = {**params, "pageToken": token} if token else params
            body = self.monitoring.request(
                "GET", f"v3/projects/{self.project}/timeSeries", f"reading {metric}", params=query
            )
            return body.get("timeSeries", []), body.get("nextPageToken")

        points: dict[str, dict[str, list[tuple[datetime, float]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for series in pages(fetch):
            instance_id = series.get("resource", {}).get("labels", {}).get("instance_id")
            gpu = str(series.get("metric", {}).get("labels", {}).get(GPU_LABEL, ""))
            for point in series.get("points", []):
                value = point.get("value", {})
                number = value.get("doubleValue", value.get("int64Value"))
                if instance_id and number is not None:
                    # An aligned point stands for the period that ends at its endTime.
                    when = gcp_clouds.timestamp(point["interval"]["endTime"]) - period
                    points[instance_id][gpu].append((when, float(number)))
        return points

    def samples(
        self, instances: Sequence[Instance], start: datetime, end: datetime
    ) -> list[InstanceSamples]:
        """Four project-wide queries, whatever the number of instances."""
        if not instances:
            return []
        # Each GPU's own series (no reducer across GPUs): the busiest GPU per period
        # would hide a GPU that went silent (issue 28; docs/reaper.md).
        gpus = self._series(GPU_METRIC, "ALIGN_MAX", "REDUCE_NONE", start, end)
        cpu = _reduced(self._series(CPU_METRIC, "ALIGN_MAX", "REDUCE_MAX", start, end))
        received = _reduced(self._series(RECEIVED_METRIC, "ALIGN_RATE", "REDUCE_SUM", start, end))
        sent = _reduced(self._series(SENT_METRIC, "ALIGN_RATE", "REDUCE_SUM", start, end))
        result = []
        for instance in instances:
            iid = instance.instance_id
            sent_at = dict(sent.get(iid, []))
            network = tuple(
                Sample(at, (rate + sent_at[at]) * 8 / 1_000_000)
                for at, rate in sorted(received.get(iid, []))
                if at in sent_at
            )
            result.append(
                InstanceSamples(
                    instance,
                    per_gpu=tuple(
                        (number, tuple(Sample(at, v) for at, v in sorted(points)))
                        for number, points in sorted(gpus.get(iid, {}).items())
                    ),
                    # Compute Engine reports CPU utilisation as a fraction of 1.
                    cpu=tuple(Sample(at, v * 100) for at, v in sorted(cpu.get(iid, []))),
                    network=network,
                    gpu_missing=None
                    if iid in gpus
                    else f"no {GPU_METRIC} series: the Ops Agent (with its NVIDIA GPU "
                    "metrics) is not running on this VM",
                )
            )
        return result

    def confirm_protection(self, instances: Sequence[Instance]) -> list[Instance]:
        """Deletion protection came with the listing: nothing to ask."""
        return list(instances)

    def _wait(self, operation: Any, zone: str, deadline: float) -> Any:
        """Poll a zone operation until it is ``DONE`` or ``deadline`` (monotonic) passes
        (then :class:`TimeoutError`), with ``zoneOperations.get`` on our endpoint."""
        delay = self.poll_interval_s
        while str(getattr(operation.status, "name", operation.status)) != "DONE":
            if time.monotonic() + delay > deadline:
                msg = f"operation {operation.name} not done after {self.operation_timeout_s:g} s"
                raise TimeoutError(msg)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
            operation = self.operations_client.get(
                project=self.project, zone=zone, operation=operation.name
            )
        return operation

    def apply(
        self, action: Action, instances: Sequence[Instance], now: datetime
    ) -> list[ActionOutcome]:
        """Start every operation first, then wait for each (all within
        ``operation_timeout_s``), so that stops run in parallel."""
        started: list[tuple[Instance, str, Any]] = []
        outcomes: list[ActionOutcome] = []
        failures: tuple[type[BaseException], ...] = (*gcp_clouds.errors(), TimeoutError)
        for instance in instances:
            handle = self._handles[instance.instance_id]
            where = {"project": self.project, "zone": handle.zone, "instance": handle.name}
            try:
                if action is Action.STOP:
                    # Required for a VM with Local SSDs (a2-ultragpu, a3, a4 have them; the
                    # API answers 400 without it): kept, their data would bill on.
                    compute = require("google.cloud.compute_v1", gcp_clouds.EXTRA)
                    request = compute.StopInstanceRequest(**where, discard_local_ssd=True)
                    operation = self.instances_client.stop_unary(request=request)
                elif action is Action.TERMINATE:
                    operation = self.instances_client.delete_unary(**where)
                else:
                    labels = {k: v for k, v in handle.labels.items() if k != MARK_LABEL}
                    if action is Action.MARK:
                        labels[MARK_LABEL] = str(int(now.timestamp()))
                    compute = require("google.cloud.compute_v1", gcp_clouds.EXTRA)
                    body = compute.InstancesSetLabelsRequest(
                        labels=labels, label_fingerprint=handle.fingerprint
                    )
                    operation = self.instances_client.set_labels_unary(
                        **where, instances_set_labels_request_resource=body
                    )
                started.append((instance, handle.zone, operation))
            except gcp_clouds.errors() as exc:
                message = gcp_clouds.translate(exc, f"{action} {handle.name}").message
                outcomes.append(ActionOutcome(instance, action, ok=False, message=message))
        deadline = time.monotonic() + self.operation_timeout_s
        for instance, zone, operation in started:
            try:
                done = self._wait(operation, zone, deadline)
            except failures as exc:
                outcomes.append(ActionOutcome(instance, action, ok=False, message=str(exc)))
                continue
            errors = list(done.error.errors)
            if errors:
                detail = "; ".join(f"{e.code}: {e.message}" for e in errors)
                outcomes.append(ActionOutcome(instance, action, ok=False, message=detail))
            else:
                outcomes.append(ActionOutcome(instance, action, ok=True))
        return outcomes


def _reduced(
    points: Mapping[str, Mapping[str, list[tuple[datetime, float]]]],
) -> dict[str, list[tuple[datetime, float]]]:
    """The points of a query reduced across series: one series per instance."""
    return {
        iid: [p for series in by_gpu.values() for p in series] for iid, by_gpu in points.items()
    }
