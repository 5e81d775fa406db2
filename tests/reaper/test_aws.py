"""`costguard reap` end to end against a moto server: a seeded fleet, real HTTP, counted calls.

Moto notes (checked with real calls, see also shared TESTING.md):
* ``LaunchTime`` is moto's clock at ``RunInstances``; the tests move that clock back for the
  instances that must look old (the server runs in this process).
* ``DisableApiTermination`` passed to ``RunInstances`` is ignored; ``ModifyInstanceAttribute``
  works.
* ``GetMetricData`` buckets from ``StartTime`` and matches dimensions exactly (a query with
  only ``InstanceId`` does not see a series that also has ``index``), like CloudWatch.
* ``ListMetrics`` repeats a series once per datapoint; the adapter de-duplicates.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from costguard.clouds import aws as aws_clouds
from costguard.errors import CostguardError
from costguard.money import format_usd
from costguard.pricing.tables import load_catalog
from costguard.reaper import aws
from costguard.reaper.fleet import PriceBook
from costguard.reaper.policy import (
    Action,
    Instance,
    Reason,
    format_timestamp,
    judge_idle,
)
from costguard.tags import MARK_TAG, OWNER_TAG
from tests.helpers.output import WIDTHS, assert_fits
from tests.servers.aws import Metrics, every_five_minutes, launch_instance

NOW = datetime.now(UTC)
OLD = NOW - timedelta(hours=3)


@pytest.fixture(autouse=True)
def _now(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOW is when each test starts: the CLI judges with the real clock."""
    monkeypatch.setattr(f"{__name__}.NOW", datetime.now(UTC))


class Calls(Counter[str]):
    """AWS operations made through costguard's client factory, counted by name."""


@pytest.fixture
def calls(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Count every API call the reaper makes, with a botocore ``before-call`` hook."""
    counted = Calls()
    original = aws_clouds.client
    # One client per service for the whole test: each new boto3 session re-reads the EC2
    # model (~0.6 s), which is most of a run's time against a local server.
    made: dict[tuple[str, str | None], Any] = {}

    def record(model: Any, **_: Any) -> None:
        counted[model.name] += 1

    def counting_client(service: str, region: str | None = None, **kwargs: Any) -> Any:
        if (service, region) not in made:
            made[(service, region)] = original(service, region, attempts=1)
            made[(service, region)].meta.events.register("before-call", record)
        return made[(service, region)]

    monkeypatch.setattr(aws_clouds, "client", counting_client)
    return counted


@pytest.fixture
def reap(run_cli: Callable[..., Any]) -> Callable[..., Any]:

    def invoke(*args: str) -> Any:
        return run_cli("reap", *args)

    return invoke


@pytest.fixture
def ec2(aws_env: str) -> Any:
    return original_client("ec2")


@pytest.fixture
def cloudwatch(aws_env: str) -> Any:
    return original_client("cloudwatch")


def original_client(service: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        service, region_name="us-east-1", config=Config(retries={"max_attempts": 1})
    )


def launch(ec2: Any, name: str, instance_type: str = "g5.xlarge", *, at: datetime = OLD,
           tags: dict[str, str] | None = None) -> str:  # fmt: skip
    return launch_instance(ec2, name, instance_type, at=at, tags=tags)


def points(values: list[float] | float) -> list[tuple[datetime, float]]:
    return every_five_minutes(NOW, values)


@pytest.fixture
def fleet(ec2: Any, cloudwatch: Any) -> dict[str, str]:
    """The issue's fleet: name -> instance id. Only `idle` and `idle-per-gpu` are idle."""
    ids = {}
    metrics = Metrics(NOW)
    ids["idle"] = launch(ec2, "idle")
    metrics.seed(ids["idle"])
    # An agent with append_dimensions but no aggregation_dimensions: per-GPU series only.
    ids["idle-per-gpu"] = launch(ec2, "idle-per-gpu", "g4dn.12xlarge")
    metrics.seed(ids["idle-per-gpu"], gpu=None)
    for index in ("0", "1", "2", "3"):  # a g4dn.12xlarge has four T4s
        dims = {"InstanceId": ids["idle-per-gpu"], "index": index, "name": "Tesla T4"}
        metrics.put("CWAgent", "nvidia_smi_utilization_gpu", dims, points(0.0))
    ids["busy"] = launch(ec2, "busy")
    metrics.seed(ids["busy"], gpu=93.0)
    ids["spiky"] = launch(ec2, "spiky")
    metrics.seed(ids["spiky"], gpu=[1.0] * 6 + [80.0] + [1.0] * 6)
    ids["network-busy"] = launch(ec2, "network-busy")
    metrics.seed(ids["network-busy"], net_bytes=50_000_000.0)
    ids["keep"] = launch(ec2, "keep", tags={"costguard:keep": "true"})
    metrics.seed(ids["keep"])
    ids["protected"] = launch(ec2, "protected")
    ec2.modify_instance_attribute(
        InstanceId=ids["protected"], DisableApiTermination={"Value": True}
    )
    metrics.seed(ids["protected"])
    ids["young"] = launch(ec2, "young", at=NOW - timedelta(minutes=10))
    metrics.seed(ids["young"])
    tomorrow = format_timestamp(NOW + timedelta(days=1))
    ids["expires-later"] = launch(ec2, "expires-later", tags={"costguard:expires-at": tomorrow})
    metrics.seed(ids["expires-later"])
    ids["no-metrics"] = launch(ec2, "no-metrics")
    ids["no-instance-id"] = launch(ec2, "no-instance-id")
    metrics.seed(ids["no-instance-id"], gpu=None)
    host = ec2.describe_instances(InstanceIds=[ids["no-instance-id"]])["Reservations"][0][
        "Instances"
    ][0]["PrivateDnsName"]
    metrics.put("CWAgent", "nvidia_smi_utilization_gpu",
                {"host": host, "index": "0", "name": "NVIDIA A10G"}, points(0.0))  # fmt: skip
    ids["cpu-only"] = launch(ec2, "cpu-only", "m5.large")
    metrics.seed(ids["cpu-only"])
    # The CloudWatch agent stopped publishing 10 minutes ago; CPU and network go on.
    ids["gpu-stale"] = launch(ec2, "gpu-stale")
    metrics.seed(ids["gpu-stale"], gpu=None)
    stale = [(t, v) for t, v in points(1.0) if t < NOW - timedelta(minutes=10)]
    for extra in ({}, {"index": "0", "name": "NVIDIA A10G"}):
        dims = {"InstanceId": ids["gpu-stale"], **extra}
        metrics.put("CWAgent", "nvidia_smi_utilization_gpu", dims, stale)
    metrics.send(cloudwatch)
    return ids


EXPECTED_CODES = {
    "idle": ("stop", "idle"),
    "idle-per-gpu": ("stop", "idle"),
    "busy": ("keep", "busy"),
    "spiky": ("keep", "busy"),
    "network-busy": ("keep", "busy"),
    "keep": ("keep", "protect-tag"),
    "protected": ("keep", "termination-protected"),
    "young": ("keep", "young"),
    "expires-later": ("keep", "expires-later"),
    "no-metrics": ("keep", "no-gpu-metrics"),
    "no-instance-id": ("keep", "no-gpu-metrics"),
    "cpu-only": ("keep", "no-gpu"),
    "gpu-stale": ("keep", "too-few-samples"),
}


def states(ec2: Any) -> dict[str, str]:
    found = ec2.describe_instances()["Reservations"]
    return {
        tag["Value"]: item["State"]["Name"]
        for reservation in found
        for item in reservation["Instances"]
        for tag in item.get("Tags", [])
        if tag["Key"] == "Name"
    }


def by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in document["instances"]}


def reaped(reap: Callable[..., Any]) -> dict[str, dict[str, Any]]:
    """``reap --execute`` of every instance idle for 30 minutes: its rows by name."""
    result = reap("--format", "json", "--idle-minutes", "30", "--execute")
    assert result.exit_code == 0, result.stderr
    return by_name(json.loads(result.stdout))


def test_dry_runs_and_refusals_judge_every_instance_and_change_nothing(
    fleet: dict[str, str], calls: Calls, reap: Callable[..., Any], ec2: Any
) -> None:
    result = reap("--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    rows = by_name(doc)
    assert {name: (r["action"], r["code"]) for name, r in rows.items()} == EXPECTED_CODES
    assert "80%" in rows["spiky"]["reason"]
    assert "gpu" not in rows["network-busy"]["reason"].split(":")[1][:5]
    assert "network" in rows["network-busy"]["reason"]
    assert "without the InstanceId dimension" in rows["no-instance-id"]["reason"]
    # Another host publishes without InstanceId, so this one cannot be told apart from it.
    assert "no GPU metrics carry this InstanceId" in rows["no-metrics"]["reason"]
    assert rows["idle"]["usd_per_hour"] == "1.006"
    assert rows["idle-per-gpu"]["accelerator"] == "T4"
    assert "newest gpu sample ends" in rows["gpu-stale"]["reason"]
    assert Decimal(doc["summary"]["usd_per_hour_selected"]) == Decimal("4.918")
    assert doc["executed"] is False
    assert set(states(ec2).values()) == {"running"}
    # One listing; one ListMetrics of the GPU series; 4 metric queries for each of the 9
    # instances left open by the static rules and one for each of their 10 per-GPU series
    # -> one GetMetricData; protection read only for the 3 idle ones.
    assert calls["DescribeInstances"] == 1
    assert calls["GetMetricData"] == math.ceil((9 * 4 + 10) / 500)
    assert calls["ListMetrics"] == 1
    assert calls["GetMetricStatistics"] == 0
    assert calls["DescribeInstanceAttribute"] == 2 * 3
    assert not {"StopInstances", "TerminateInstances", "CreateTags", "DeleteTags"} & set(calls)

    table = reap()
    assert table.exit_code == 0, table.stderr
    for name in EXPECTED_CODES:
        assert name in table.stdout
    assert "would stop" in table.stdout
    assert "Dry run: nothing was changed" in table.stdout
    assert "$1.006" in table.stdout

    rows = by_name(reap("--gpu-missing-ok", "--format", "json").json())
    assert rows["no-instance-id"]["action"] == "stop"
    assert "judged by CPU and network" in rows["no-instance-id"]["reason"]
    assert rows["no-metrics"]["code"] == "no-metrics"  # no CPU samples either: kept

    over = reap("--execute", "--max-actions", "1")
    assert over.exit_code == 1
    assert "max-actions limit of 1" in over.stderr
    assert "Hint:" in over.stderr
    assert "refused" in over.stdout
    percent = reap("--execute", "--max-percent", "10", "--format", "json")
    assert percent.exit_code == 1
    assert percent.json()["refused"]["limit_type"] == "max-percent"
    assert set(states(ec2).values()) == {"running"}
    assert not {"StopInstances", "TerminateInstances", "CreateTags", "DeleteTags"} & set(calls)


def test_execute_stops_exactly_the_idle_ones_and_a_rerun_changes_nothing(
    fleet: dict[str, str], calls: Calls, reap: Callable[..., Any], ec2: Any
) -> None:
    result = reap("--execute", "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["summary"]["acted"] == 2
    assert Decimal(doc["summary"]["usd_per_hour_saved"]) == Decimal("4.918")
    after = states(ec2)
    stopped = {name for name, state in after.items() if state != "running"}
    assert stopped == {"idle", "idle-per-gpu"}
    assert {after[n] for n in stopped} <= {"stopping", "stopped"}
    assert calls["StopInstances"] == 1  # one batch
    calls.clear()
    again = reap("--execute", "--format", "json")
    assert again.exit_code == 0, again.stderr
    assert again.json()["summary"]["acted"] == 0
    assert states(ec2) == after
    assert not {"StopInstances", "TerminateInstances", "CreateTags", "DeleteTags"} & set(calls)


def test_terminate_never_touches_protected_or_tagged(
    fleet: dict[str, str], reap: Callable[..., Any], ec2: Any
) -> None:
    result = reap("--execute", "--action", "terminate", "--format", "json")
    assert result.exit_code == 0, result.stderr
    after = states(ec2)
    assert {n for n, s in after.items() if s != "running"} == {"idle", "idle-per-gpu"}
    assert after["idle"] in ("shutting-down", "terminated")


def test_owner_scope_never_stops_another_owners_instance(
    fleet: dict[str, str], reap: Callable[..., Any], ec2: Any
) -> None:
    """Issue 43 item 11: the reaper stopped another owner's idle instance."""
    ec2.create_tags(Resources=[fleet["idle"]], Tags=[{"Key": OWNER_TAG, "Value": "bob"}])
    ec2.create_tags(Resources=[fleet["idle-per-gpu"]],
                    Tags=[{"Key": OWNER_TAG, "Value": "alice"}])  # fmt: skip
    result = reap("--owner", "alice", "--execute", "--format", "json")
    assert result.exit_code == 0, result.stderr
    rows = by_name(result.json())
    assert (rows["idle"]["action"], rows["idle"]["code"]) == ("keep", "other-owner")
    assert "costguard:owner: bob" in rows["idle"]["reason"]
    assert rows["idle-per-gpu"]["action"] == "stop"
    assert {n for n, s in states(ec2).items() if s != "running"} == {"idle-per-gpu"}


def test_two_phase_marks_first_and_acts_a_window_later(
    fleet: dict[str, str], calls: Calls, reap: Callable[..., Any], ec2: Any
) -> None:
    first = reap("--mark", "--execute", "--format", "json")
    assert first.exit_code == 0, first.stderr
    marked = {r["name"] for r in first.json()["instances"] if r["action"] == "mark"}
    assert marked == {"idle", "idle-per-gpu"}
    assert set(states(ec2).values()) == {"running"}
    calls.clear()
    soon = reap("--mark", "--execute", "--format", "json")
    assert {r["code"] for r in soon.json()["instances"] if r["name"] in marked} == {"marked"}
    assert not {"StopInstances", "CreateTags", "DeleteTags"} & set(calls)
    # Backdate one mark by two hours (as if marked on an earlier cron run), and mark a
    # busy instance by hand: the next run stops the first and unmarks the second.
    two_hours_ago = format_timestamp(NOW - timedelta(hours=2))
    ec2.create_tags(Resources=[fleet["idle"], fleet["busy"]],
                    Tags=[{"Key": MARK_TAG, "Value": two_hours_ago}])  # fmt: skip
    later = reap("--mark", "--execute", "--format", "json")
    rows = by_name(later.json())
    assert (rows["idle"]["action"], rows["idle"]["outcome"]) == ("stop", "done")
    assert rows["busy"]["action"] == "unmark"
    assert rows["idle-per-gpu"]["code"] == "marked"
    tags = ec2.describe_tags(Filters=[{"Name": "key", "Values": [MARK_TAG]}])["Tags"]
    assert {t["ResourceId"] for t in tags} == {fleet["idle"], fleet["idle-per-gpu"]}
    assert {n for n, s in states(ec2).items() if s != "running"} == {"idle"}


class CloudWatchLike:
    """``GetMetricData`` as CloudWatch answers it, unlike moto: ``StartTime`` is rounded
    down to the minute, and each period's datapoint is stamped with the period's start.
    ``ListMetrics`` lists the GPU series of instance ``i-1`` as the agent publishes them
    (per instance and for GPU 0); every query of a metric name gets that name's data."""

    def __init__(self, data: dict[str, list[tuple[datetime, float]]], *, stuck: bool = False):
        self.data = data  # metric name -> (time, value)
        self.stuck = stuck  # hand out the same NextToken forever
        self.calls: list[dict[str, Any]] = []

    def get_metric_data(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        start = kwargs["StartTime"].replace(second=0, microsecond=0)
        results = []
        for query in kwargs["MetricDataQueries"]:
            stat = query["MetricStat"]
            period = timedelta(seconds=stat["Period"])
            points = self.data.get(stat["Metric"]["MetricName"], [])
            stamps, values = [], []
            at = start
            while at < kwargs["EndTime"]:
                inside = [v for t, v in points if at <= t < at + period]
                if inside:
                    stamps.append(at)
                    values.append(max(inside) if stat["Stat"] == "Maximum" else sum(inside))
                at += period
            results.append({"Id": query["Id"], "Timestamps": stamps, "Values": values})
        return {"MetricDataResults": results, **({"NextToken": "same"} if self.stuck else {})}

    def get_paginator(self, operation: str) -> Any:
        assert operation == "list_metrics"
        own = [{"Name": "InstanceId", "Value": "i-1"}]
        listed = [{"Dimensions": own}, {"Dimensions": [*own, {"Name": "index", "Value": "0"}]}]
        pages = [{"Metrics": listed if aws.GPU_METRIC in self.data else []}]
        return type("Paginator", (), {"paginate": lambda _, **__: iter(pages)})()


CLOCK = datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)


def every_minute(value: float, **bursts: float) -> list[tuple[datetime, float]]:
    """A point a minute for the last 70 minutes; ``bursts`` maps ``m<N>`` (N minutes ago)."""
    values = {f"m{m}": value for m in range(1, 71)} | bursts
    return [(CLOCK - timedelta(minutes=int(k[1:])), v) for k, v in values.items()]


def judge_with(cloudwatch: CloudWatchLike) -> Any:
    fleet = aws.AwsFleet("us-east-1", PriceBook(load_catalog()), ec2=object(),
                         cloudwatch=cloudwatch)  # fmt: skip
    box = Instance("aws", "us-east-1", "i-1", "g5.xlarge", running=True, gpu_count=1,
                   launched_at=CLOCK - timedelta(hours=5), protected=False)  # fmt: skip
    policy = aws.SAMPLING.policy()
    (samples,) = fleet.samples([box], CLOCK - policy.window, CLOCK)
    return judge_idle(samples, policy, CLOCK)


def test_a_burst_in_the_period_that_holds_the_window_start_keeps_the_instance() -> None:
    # The window starts 11:00:30; CloudWatch's period [11:00, 11:05) holds the burst at
    # 11:02 and is stamped 11:00, before the window starts.
    quiet = {
        "CPUUtilization": every_minute(1.0),
        "NetworkIn": every_minute(10.0),
        "NetworkOut": every_minute(10.0),
    }
    burst = CloudWatchLike({"nvidia_smi_utilization_gpu": every_minute(1.0, m58=97.0), **quiet})
    verdict = judge_with(burst)
    assert (verdict.action, verdict.code) == (Action.KEEP, Reason.BUSY)
    assert "gpu 97% at 2026-12-01T11:00:00Z" in verdict.reason
    assert burst.calls[0]["StartTime"] == CLOCK - timedelta(minutes=65)
    calm = CloudWatchLike({"nvidia_smi_utilization_gpu": every_minute(1.0), **quiet})
    assert judge_with(calm).action is Action.STOP


def test_a_repeated_next_token_ends_the_run_instead_of_looping() -> None:
    stuck = CloudWatchLike({}, stuck=True)
    with pytest.raises(CostguardError, match="page token 'same' twice"):
        judge_with(stuck)
    assert len(stuck.calls) == 2


STAMP = re.compile(r"\(?\d{4}-\d\d-\d\dT")


@pytest.mark.parametrize("width", WIDTHS)
def test_the_report_fits_the_terminal(
    fleet: dict[str, str], reap: Callable[..., Any], terminal: Callable[[int], None], width: int
) -> None:
    """At 80/100/120 columns: ids, names, types, zones and prices whole; reasons at words."""
    doc = reap("--format", "json").json()
    cells = [r["instance_id"] for r in doc["instances"]]
    cells += [r["zone"] or r["region"] for r in doc["instances"]]
    cells += [
        format_usd(Decimal(r["usd_per_hour"]), rate=True)
        for r in doc["instances"]
        if r["usd_per_hour"]
    ]
    terminal(width)
    result = reap()
    assert result.exit_code == 0, result.stderr
    assert_fits(result.stdout, width, cells)
    # Every word of every reason, none split over two lines (the times move between runs).
    words = {w for r in doc["instances"] for w in r["reason"].split() if not STAMP.match(w)}
    shown = {w for line in result.stdout.splitlines() for w in line.split()}
    assert words <= shown, words - shown


def test_a_scan_over_many_regions_shows_progress_on_a_terminal_only(
    fleet: dict[str, str], reap: Callable[..., Any], terminal: Callable[[int], None]
) -> None:
    regions = ("--region", "us-east-1", "--region", "us-west-2", "--region", "eu-west-1")
    piped = reap(*regions, "--format", "json")
    assert piped.exit_code == 0, piped.stderr
    assert "Scanning" not in piped.stderr  # cron and pipes get no progress bar
    terminal(100)
    shown = reap(*regions, "--format", "json")
    assert shown.exit_code == 0, shown.stderr
    assert "Scanning aws" in shown.stderr
    assert "3/3" in shown.stderr
    # The same report either way: the bar is on stderr, the JSON on stdout.
    assert [(r["instance_id"], r["action"]) for r in shown.json()["instances"]] == [
        (r["instance_id"], r["action"]) for r in piped.json()["instances"]
    ]


def test_gpu_facts_of_types_the_tables_lack_are_read_from_every_page(
    ec2_faults: Any,
) -> None:
    """DescribeInstanceTypes answers a NextToken (EC2 through the fault layer, one type a
    page): every page is read, so no GPU instance of a new family passes for a CPU one."""
    ec2_faults.page_size = 1
    ec2 = aws_clouds.client("ec2", "us-east-1", attempts=1)
    new_types = ("g7.4xlarge", "g7.2xlarge", "g4dn.metal")
    # Tables of the day before these families were priced (the bundled ones now list g7).
    catalog = load_catalog()
    older = [row for row in catalog.instances if row.instance_type not in new_types]
    book = PriceBook(dataclasses.replace(catalog, instances=tuple(older)))
    assert all(book.gpus("aws", t) is None for t in new_types)  # not in the tables
    for n, instance_type in enumerate(new_types):
        launch_instance(ec2, f"box-{n}", instance_type, at=datetime.now(UTC))
    found = aws.AwsFleet("us-east-1", book, ec2=ec2).instances()
    assert ec2_faults.actions.count("DescribeInstanceTypes") == 3
    assert sorted((i.instance_type, i.gpu_count > 0) for i in found) == sorted(
        (t, True) for t in new_types
    )


def test_forged_disagreeing_or_silent_gpu_series_and_a_second_keep_tag_keep_the_instance(
    ec2: Any, cloudwatch: Any, reap: Callable[..., Any]
) -> None:
    # Issue 28: anyone with cloudwatch:PutMetricData can publish a per-instance series for
    # any instance id; the reaper preferred it over the per-GPU series, took the maximum
    # over GPUs per timestamp (a silent GPU vanished), and read the first keep tag only.
    ids, metrics = {}, Metrics(NOW)
    gpu = "nvidia_smi_utilization_gpu"
    ids["idle"] = launch(ec2, "idle")
    metrics.seed(ids["idle"])
    # A p4d at 97% on each of its 8 GPUs (an agent without aggregation_dimensions), and
    # zeros forged for its per-instance series.
    ids["forged-busy"] = launch(ec2, "forged-busy", "p4d.24xlarge")
    metrics.seed(ids["forged-busy"], gpu=None)
    metrics.put("CWAgent", gpu, {"InstanceId": ids["forged-busy"]}, points(0.0))
    for index in range(8):
        dims = {"InstanceId": ids["forged-busy"], "index": str(index), "name": "NVIDIA A100"}
        metrics.put("CWAgent", gpu, dims, points(97.0))
    # A p4d with no GPU agent at all: only the forged zeros.
    ids["forged-no-agent"] = launch(ec2, "forged-no-agent", "p4d.24xlarge")
    metrics.seed(ids["forged-no-agent"], gpu=None)
    metrics.put("CWAgent", gpu, {"InstanceId": ids["forged-no-agent"]}, points(0.0))
    # GPU 3 of 4 was busy until its series stopped 40 minutes ago; the others are idle.
    ids["silent-gpu"] = launch(ec2, "silent-gpu", "g4dn.12xlarge")
    metrics.seed(ids["silent-gpu"], gpu=None)
    for index in range(4):
        dims = {"InstanceId": ids["silent-gpu"], "index": str(index), "name": "Tesla T4"}
        series = points(0.0) if index < 3 else points(98.0)
        silent = NOW - timedelta(minutes=40) if index == 3 else NOW
        metrics.put("CWAgent", gpu, dims, [(t, v) for t, v in series if t < silent])
    # Two keep tags that differ in case, the one saying "keep" listed second.
    ids["keep-twice"] = launch(
        ec2, "keep-twice", tags={"costguard:keep": "false", "COSTGUARD:KEEP": "true"}
    )
    metrics.seed(ids["keep-twice"])
    metrics.send(cloudwatch)

    rows = reaped(reap)
    codes = {name: (rows[name]["action"], rows[name]["code"]) for name in ids}
    assert codes == {
        "idle": ("stop", "idle"),
        "forged-busy": ("keep", "busy"),
        "forged-no-agent": ("keep", "metrics-doubt"),
        "silent-gpu": ("keep", "metrics-doubt"),
        "keep-twice": ("keep", "protect-tag"),
    }
    assert re.search(r"busy: gpu 97% at .* \(GPU \d;", rows["forged-busy"]["reason"])
    assert "3 of 4 GPUs" in rows["silent-gpu"]["reason"]
    assert {n for n, s in states(ec2).items() if s != "running"} == {"idle"}


def test_a_gang_is_idle_only_when_every_node_is(
    ec2: Any, cloudwatch: Any, reap: Callable[..., Any]
) -> None:
    """`launch --nodes`: the nodes of one attempt carry its job and attempt tags. One busy
    node keeps its idle sibling (a node stopped alone would only stall the others); a gang
    whose nodes are all idle is stopped whole; another attempt's node is no sibling."""
    metrics = Metrics(NOW)
    ids = {}
    for name, job, attempt, gpu in (
        ("busy-0", "cg-a", "1", 95.0), ("idle-1", "cg-a", "1", 1.0),
        ("quiet-0", "cg-b", "2", 1.0), ("quiet-1", "cg-b", "2", 1.0),
        ("old-attempt", "cg-a", "0", 1.0),
    ):  # fmt: skip
        tags = {"costguard:job": job, "costguard:attempt": attempt}
        ids[name] = launch(ec2, name, tags=tags)
        metrics.seed(ids[name], gpu=gpu)
    metrics.send(cloudwatch)
    rows = reaped(reap)
    codes = {name: (rows[name]["action"], rows[name]["code"]) for name in ids}
    assert codes == {
        "busy-0": ("keep", "busy"),
        "idle-1": ("keep", "gang-not-idle"),
        "quiet-0": ("stop", "idle"),
        "quiet-1": ("stop", "idle"),
        "old-attempt": ("stop", "idle"),
    }
    assert ids["busy-0"] in rows["idle-1"]["reason"]
    assert {n for n, s in states(ec2).items() if s != "running"} == {
        "quiet-0", "quiet-1", "old-attempt"
    }  # fmt: skip
