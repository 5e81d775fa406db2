"""Azure: virtual machines and Azure Monitor metrics for the reaper.

Per subscription and run: two ``virtualMachines.listAll`` calls, the model view (tags, size,
priority, creation time) and ``statusOnly=true`` (power states), joined by resource id. The
status-only listing is not trusted for anything but the instance view: neither the REST
spec nor the SDK says which model fields it fills in, and a user reports ``tags`` coming
back null there, which would hide ``costguard:keep``. A VM missing from either listing (a
race with a create or delete) is not judged: protection is never read from missing data.

Per region, one subscription-scope metrics query split by ``Microsoft.ResourceId eq '*'``
(platform CPU + network): such a query returns at most ``top`` series for *every* VM of the
subscription in that region, in no promised order, so ``top`` is the number of VMs the
listing found there (plus a margin), not the number of candidates. The in-guest GPU metric
is read per GPU VM at the VM's own scope: no definition says a subscription-scope query
accepts a custom namespace (``Telegraf/nvidia_smi``), and custom metrics are documented per
resource, so the GPU signal does not depend on it.

The two-phase mark is written with the Tags API (``Microsoft.Resources/tags``, operations
``Merge`` and ``Delete``), which touches only the ``costguard:idle-since`` tag: a full VM
update would write back every tag as the listing saw it, dropping a ``costguard:keep``
added in the meantime.

Stop means **deallocate**: a VM that is only powered off keeps billing for its compute.

Azure has no first-party GPU metric for VMs. The in-guest one read here is what Telegraf's
``nvidia_smi`` input publishes through its ``azure_monitor`` output (namespace
``Telegraf/nvidia_smi``, metric ``utilization_gpu``); see infra/README.md. Telegraf writes
every tag as a dimension, so each GPU is its own series under its ``index``; the query splits
by it (``$filter=index eq '*'``, the Metrics API's dimension split), and each GPU's series
goes to the policy as a witness of its own (``InstanceSamples.per_gpu``), as on AWS and GCP:
without the split the service aggregates across GPUs, and the ``Maximum`` of the others
hid a GPU that went silent (issue 28; docs/reaper.md). GPU VMs are the N-series sizes
(``Standard_N...``), priced from the tables when they list the size.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from costguard.clouds import READ_TIMEOUT_S, require
from costguard.clouds import azure as azure_clouds
from costguard.errors import check_names
from costguard.reaper.fleet import ActionOutcome, FleetRequest, PriceBook, Sampling
from costguard.reaper.policy import GPU_MAX_LAG_SECONDS as _AGENT_MAX_LAG
from costguard.reaper.policy import Action, Instance, InstanceSamples, Sample, format_timestamp
from costguard.settings import Settings
from costguard.tags import MARK_TAG

#: Azure Monitor platform metrics for VMs have a one-minute grain; a datapoint is stamped
#: with the *start* of its minute.
PERIOD_SECONDS = 60
#: How long before now the newest CPU/network minute may end: platform metrics arrive
#: within about three minutes.
MAX_LAG_SECONDS = 240
#: The same for the GPU series Telegraf publishes every minute (see
#: :data:`costguard.reaper.policy.GPU_MAX_LAG_SECONDS`): one silent for longer has stopped.
GPU_MAX_LAG_SECONDS = _AGENT_MAX_LAG
SAMPLING = Sampling(PERIOD_SECONDS, MAX_LAG_SECONDS, GPU_MAX_LAG_SECONDS)
#: Series the metrics queries may return beyond the VMs listed: VMs created since.
TOP_MARGIN = 10
#: The Tags API version used for the ``--mark`` tag (``Merge``/``Delete`` at a scope).
TAGS_API_VERSION = "2021-04-01"
VM_NAMESPACE = "Microsoft.Compute/virtualMachines"
CPU_METRIC = "Percentage CPU"
NETWORK_IN_METRIC = "Network In Total"
NETWORK_OUT_METRIC = "Network Out Total"
GPU_NAMESPACE = "Telegraf/nvidia_smi"
GPU_METRIC = "utilization_gpu"
#: The dimension that names a GPU: Telegraf's nvidia_smi tag ``index`` (the service spells
#: dimension names in lower case in its replies).
GPU_DIMENSION = "index"
#: Power states that bill for compute and can be judged by their metrics.
LIVE_POWER_STATES = ("running", "starting")
_LOCATION = re.compile(r"[a-z][a-z0-9]+")
_GROUP = re.compile(r"/resourceGroups/([^/]+)/", re.IGNORECASE)


def check_regions(regions: Sequence[str], known: Sequence[str]) -> None:
    """Validate Azure location names offline against ``known`` ones (the price tables).

    >>> check_regions(["eastus"], ["eastus", "westeurope"])
    >>> check_regions(["East US"], ["eastus", "westeurope"])
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: unknown Azure region 'East US'
    >>> check_regions(["westeuroppe"], ["eastus", "westeurope"])
    Traceback (most recent call last):
    ...
    costguard.errors.UnknownNameError: unknown Azure region 'westeuroppe'
    """
    hint = "use the location name, e.g. eastus or westeurope"
    check_names("Azure region", regions, known, pattern=_LOCATION, hint=hint)


def resource_group(resource_id: str) -> str:
    """The resource group in an Azure resource ID.

    >>> resource_group("/subscriptions/s/resourceGroups/ml/providers/Microsoft.Compute/x/a")
    'ml'
    """
    found = _GROUP.search(resource_id)
    return found.group(1) if found else ""


def _timespan(start: datetime, end: datetime) -> str:
    return f"{format_timestamp(start)}/{format_timestamp(end)}"


class AzureFleet:
    """One Azure subscription (optionally one resource group). Clients may be injected, or
    built by :func:`costguard.clouds.azure.client` with ``credential`` and ``client_options``
    (azure-core pipeline options such as a custom ``authentication_policy``). Example::

        fleet = AzureFleet(subscription_id, PriceBook(load_catalog()), Settings.load(),
                           resource_group="ml")
    """

    provider = "azure"
    sampling = SAMPLING

    @classmethod
    def for_options(cls, request: FleetRequest) -> list[AzureFleet]:
        """The one fleet of ``--subscription``, its regions checked offline first
        (``default_regions`` is for AWS: a subscription lists every region by itself)."""
        options, prices = request.options, request.prices
        check_regions(options["regions"], prices.regions(cls.provider))
        group = options["resource_group"]
        return [
            cls(options["subscription"], prices, request.settings, regions=options["regions"],
                resource_group=group)
        ]  # fmt: skip

    def __init__(
        self,
        subscription_id: str,
        prices: PriceBook,
        settings: Settings,
        *,
        regions: Sequence[str] = (),
        resource_group: str | None = None,
        credential: Any = None,
        client_options: Mapping[str, Any] | None = None,
        compute: Any = None,
        monitor: Any = None,
    ) -> None:
        self.subscription_id = subscription_id
        self.prices = prices
        self.regions = tuple(r.lower() for r in regions)
        self.resource_group = resource_group
        options = dict(client_options or {})
        if credential is None and (compute is None or monitor is None):
            credential = azure_clouds.default_credential()
        self.compute = (
            compute
            if compute is not None
            else azure_clouds.client(
                "azure.mgmt.compute",
                "ComputeManagementClient",
                subscription_id,
                settings,
                credential,
                **options,
            )
        )
        self.monitor = (
            monitor
            if monitor is not None
            else azure_clouds.client(
                "azure.mgmt.monitor",
                "MonitorManagementClient",
                subscription_id,
                settings,
                credential,
                **options,
            )
        )
        self._vms: dict[str, Any] = {}
        #: Every VM the listing saw per region, whatever its group or state: the metrics
        #: queries return series for all of them.
        self._listed: Counter[str] = Counter()

    def instances(self) -> list[Instance]:
        """VMs in scope that are running or starting: the model listing joined with the
        status-only listing (see the module docstring for why both)."""
        try:
            models = list(self.compute.virtual_machines.list_all())
            statuses = {
                vm.id.lower(): vm
                for vm in self.compute.virtual_machines.list_all(status_only="true")
            }
        except azure_clouds.errors() as exc:
            raise azure_clouds.translate(exc, "listing virtual machines") from None
        found = []
        self._listed = Counter(vm.location.lower() for vm in models)
        for vm in models:
            if self.resource_group and resource_group(vm.id).lower() != self.resource_group.lower():
                continue
            if self.regions and vm.location.lower() not in self.regions:
                continue
            key = vm.id.lower()
            status = statuses.get(key)
            if status is None:
                continue  # created or deleted between the two listings: not judged this run
            self._vms[key] = vm
            power = _power_state(status)
            if power in LIVE_POWER_STATES:
                found.append(self._instance(vm, power, status))
            elif power == "stopped":
                # Powered off from inside but still allocated: it bills. Shown, not judged.
                found.append(
                    self._instance(
                        vm, "stopped (still allocated and billed: deallocate it)", status
                    )
                )
        return found

    def _instance(self, vm: Any, power: str, status: Any) -> Instance:
        size = vm.hardware_profile.vm_size if vm.hardware_profile else ""
        known = self.prices.gpus(self.provider, size)
        if known is None and size.lower().startswith("standard_n"):
            known = (None, 1)  # N-series: GPU sizes by Azure's naming, count unknown
        accelerator, count = known or (None, 0)
        spot = (vm.priority or "").lower() == "spot"
        tags = dict(vm.tags or {})
        return Instance(
            provider=self.provider,
            region=vm.location.lower(),
            instance_id=vm.id.lower(),
            instance_type=size,
            running=power == "running",
            gpu_count=count,
            launched_at=_started(vm, status),
            # Azure has no per-VM termination protection; resource locks make the call fail.
            protected=False,
            tags=tags,
            accelerator=accelerator,
            usd_per_hour=self.prices.usd_per_hour(
                self.provider, vm.location.lower(), size, spot=spot
            ),
            spot=spot,
            name=vm.name,
            zone=resource_group(vm.id),
            state=power,
        )

    def _metrics(
        self,
        region: str,
        namespace: str,
        names: Sequence[str],
        aggregation: str,
        start: datetime,
        end: datetime,
        count: int,
    ) -> dict[tuple[str, str], list[tuple[datetime, Any]]]:
        """One subscription-scope query, one series per VM: points by (VM id, metric).

        Asks from one minute before ``start``: a datapoint is stamped with the start of its
        minute, so the one whose minute holds ``start`` is stamped before it.
        """
        reply = self.monitor.metrics.list_at_subscription_scope(
            region=region,
            timespan=_timespan(start - timedelta(seconds=PERIOD_SECONDS), end),
            interval=f"PT{PERIOD_SECONDS // 60}M",
            metricnames=",".join(names),
            aggregation=aggregation,
            filter="Microsoft.ResourceId eq '*'",
            metricnamespace=namespace,
            # ``top`` caps the series returned (default 10, in no promised order), counted
            # over every VM in the region, not just ours: fewer could drop the idle ones.
            top=max(10, count + TOP_MARGIN),
            auto_adjust_timegrain=False,
        )
        points: dict[tuple[str, str], list[tuple[datetime, Any]]] = defaultdict(list)
        for metric in reply.value or []:
            for series in metric.timeseries or []:
                owner = next(
                    (
                        m.value
                        for m in series.metadatavalues or []
                        if m.name and (m.name.value or "").lower() == "microsoft.resourceid"
                    ),
                    None,
                )
                if owner is None:
                    continue
                for value in series.data or []:
                    points[(owner.lower(), metric.name.value)].append((value.time_stamp, value))
        return points

    def samples(
        self, instances: Sequence[Instance], start: datetime, end: datetime
    ) -> list[InstanceSamples]:
        """One platform query (CPU and network) per region, and the in-guest GPU metric per
        GPU VM at its own scope."""
        by_region: dict[str, list[Instance]] = defaultdict(list)
        for instance in instances:
            by_region[instance.region].append(instance)
        result = []
        for region, members in by_region.items():
            vms_in_region = max(len(members), self._listed.get(region, 0))
            try:
                platform = self._metrics(
                    region,
                    VM_NAMESPACE,
                    (CPU_METRIC, NETWORK_IN_METRIC, NETWORK_OUT_METRIC),
                    "Maximum,Total",
                    start,
                    end,
                    vms_in_region,
                )
            except azure_clouds.errors() as exc:
                raise azure_clouds.translate(exc, f"reading VM metrics in {region}") from None
            for instance in members:
                gpu, gpu_error = self._gpu(instance, start, end)
                result.append(self._instance_samples(instance, platform, gpu, gpu_error))
        return result

    def _gpu(
        self, instance: Instance, start: datetime, end: datetime
    ) -> tuple[dict[str, list[tuple[datetime, Any]]], str | None]:
        """The Telegraf GPU series of one VM by GPU ``index`` (``""``: a series that names
        no GPU), read at the VM's scope (``Metrics_List``) and split by the GPU dimension.

        Not at subscription scope: no definition says a multi-resource query accepts a
        custom namespace, so the GPU signal must not depend on it (issue 19). A VM without
        GPUs is not asked (its verdict does not need the series)."""
        if not instance.gpu_count:
            return {}, None
        core = require("azure.core.exceptions", azure_clouds.EXTRA)
        vm = self._vms[instance.instance_id]
        try:
            reply = self.monitor.metrics.list(
                vm.id.lstrip("/"),
                timespan=_timespan(start - timedelta(seconds=PERIOD_SECONDS), end),
                interval=f"PT{PERIOD_SECONDS // 60}M",
                metricnames=GPU_METRIC,
                aggregation="Maximum",
                metricnamespace=GPU_NAMESPACE,
                filter=f"{GPU_DIMENSION} eq '*'",
                # ``top`` caps the series (default 10): one per GPU, and a margin.
                top=max(10, instance.gpu_count + TOP_MARGIN),
                auto_adjust_timegrain=False,
            )
        except core.HttpResponseError as exc:
            # A namespace this VM never published to, or series without the GPU dimension,
            # is refused (400/404): no per-GPU data from an agent.
            if exc.status_code in (400, 404):
                return {}, (
                    f"the {GPU_NAMESPACE} metric namespace does not exist on this VM, or its "
                    f"series lack the {GPU_DIMENSION} dimension (one series per GPU)"
                )
            raise azure_clouds.translate(exc, f"reading GPU metrics of {vm.name}") from None
        except azure_clouds.errors() as exc:
            raise azure_clouds.translate(exc, f"reading GPU metrics of {vm.name}") from None
        by_gpu: dict[str, list[tuple[datetime, Any]]] = defaultdict(list)
        for metric in reply.value or []:
            for series in metric.timeseries or []:
                gpu = next(
                    (
                        str(m.value)
                        for m in series.metadatavalues or []
                        if m.name and (m.name.value or "").lower() == GPU_DIMENSION
                    ),
                    "",
                )
                by_gpu[gpu] += [(value.time_stamp, value) for value in series.data or []]
        return by_gpu, None

    def _instance_samples(
        self,
        instance: Instance,
        platform: Mapping[tuple[str, str], list[tuple[datetime, Any]]],
        gpu: Mapping[str, Sequence[tuple[datetime, Any]]],
        gpu_error: str | None,
    ) -> InstanceSamples:
        key = instance.instance_id

        def series(points: Sequence[tuple[datetime, Any]], field: str) -> dict[datetime, float]:
            return {
                at: float(getattr(v, field)) for at, v in points if getattr(v, field) is not None
            }

        cpu = series(platform.get((key, CPU_METRIC), []), "maximum")
        received = series(platform.get((key, NETWORK_IN_METRIC), []), "total")
        sent = series(platform.get((key, NETWORK_OUT_METRIC), []), "total")
        # Each GPU a witness of its own; a series that names no GPU stands as the
        # instance-level one (alone, the policy does not believe it: metrics-doubt).
        per_gpu = {name: series(points, "maximum") for name, points in gpu.items() if name}
        unnamed = series(gpu.get("", []), "maximum")
        missing = None
        if not unnamed and not any(per_gpu.values()):
            missing = (
                f"no in-guest GPU metric ({GPU_NAMESPACE} {GPU_METRIC}"
                + (f"; {gpu_error}" if gpu_error else "")
                + "): run Telegraf's nvidia_smi input with the azure_monitor output "
                "(infra/README.md)"
            )
        return InstanceSamples(
            instance,
            gpu=tuple(Sample(at, v) for at, v in sorted(unnamed.items())),
            per_gpu=tuple(
                (name, tuple(Sample(at, v) for at, v in sorted(values.items())))
                for name, values in sorted(per_gpu.items())
            ),
            cpu=tuple(Sample(at, v) for at, v in sorted(cpu.items())),
            # Totals are bytes per one-minute grain.
            network=tuple(
                Sample(at, (value + sent[at]) * 8 / PERIOD_SECONDS / 1_000_000)
                for at, value in sorted(received.items())
                if at in sent
            ),
            gpu_missing=missing,
        )

    def confirm_protection(self, instances: Sequence[Instance]) -> list[Instance]:
        """Nothing to ask: Azure VMs carry no termination protection flag."""
        return list(instances)

    def apply(
        self, action: Action, instances: Sequence[Instance], now: datetime
    ) -> list[ActionOutcome]:
        """Start every long-running operation, then wait for each (stop = deallocate).

        Marks are merged into, and removed from, the VM's tags with the Tags API; every
        other tag stays as it is now, not as the listing saw it.
        """
        pollers: list[tuple[Instance, Any]] = []
        outcomes: list[ActionOutcome] = []
        operations = self.compute.virtual_machines
        for instance in instances:
            vm = self._vms[instance.instance_id]
            group = resource_group(vm.id)
            try:
                if action is Action.STOP:
                    pollers.append((instance, operations.begin_deallocate(group, vm.name)))
                elif action is Action.TERMINATE:
                    pollers.append((instance, operations.begin_delete(group, vm.name)))
                elif action is Action.MARK:
                    mark = {MARK_TAG: format_timestamp(now.astimezone(UTC))}
                    self._write_tags(vm.id, "Merge", mark)
                    outcomes.append(ActionOutcome(instance, action, ok=True))
                else:
                    seen = {k: v for k, v in instance.tags.items() if k.lower() == MARK_TAG}
                    if seen:
                        self._write_tags(vm.id, "Delete", seen)
                    outcomes.append(ActionOutcome(instance, action, ok=True))
            except azure_clouds.errors() as exc:
                message = azure_clouds.translate(exc, f"{action} {vm.name}").message
                outcomes.append(ActionOutcome(instance, action, ok=False, message=message))
        for instance, poller in pollers:
            try:
                poller.result(timeout=READ_TIMEOUT_S * 10)
                outcomes.append(ActionOutcome(instance, action, ok=True))
            except azure_clouds.errors() as exc:
                message = azure_clouds.translate(exc, f"{action} {instance.name}").message
                outcomes.append(ActionOutcome(instance, action, ok=False, message=message))
        return outcomes

    def _write_tags(self, resource_id: str, operation: str, tags: Mapping[str, str]) -> None:
        """``PATCH {resource}/providers/Microsoft.Resources/tags/default``: Merge or Delete
        only the given tags, through the compute client's pipeline (same credential,
        endpoint, retries and timeouts)."""
        rest = require("azure.core.rest", azure_clouds.EXTRA)
        request = rest.HttpRequest(
            "PATCH",
            f"{resource_id}/providers/Microsoft.Resources/tags/default",
            params={"api-version": TAGS_API_VERSION},
            json={"operation": operation, "properties": {"tags": dict(tags)}},
        )
        response = self.compute.send_request(request)
        if response.status_code not in (200, 202):
            core = require("azure.core.exceptions", azure_clouds.EXTRA)
            arm = require("azure.mgmt.core.exceptions", azure_clouds.EXTRA)
            raise core.HttpResponseError(response=response, error_format=arm.ARMErrorFormat)


def _started(vm: Any, status: Any) -> datetime | None:
    """When the VM last started: the newest power or provisioning state change (from the
    status listing), never earlier than its creation (``time_created``, from the model
    listing: alone it would make a VM created long ago and started a minute ago look old)."""
    view = getattr(status, "instance_view", None)
    moments = [vm.time_created] + [
        status.time
        for status in (view.statuses if view and view.statuses else [])
        if (status.code or "").lower().startswith(("powerstate/", "provisioningstate/"))
    ]
    known = [m if m.tzinfo else m.replace(tzinfo=UTC) for m in moments if m is not None]
    return max(known, default=None)


def _power_state(vm: Any) -> str:
    view = getattr(vm, "instance_view", None)
    for status in view.statuses if view and view.statuses else []:
        code = (status.code or "").lower()
        if code.startswith("powerstate/"):
            return code.split("/", 1)[1]
    return "unknown"
