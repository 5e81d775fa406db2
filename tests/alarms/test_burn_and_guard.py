"""`costguard burn` on a seeded moto fleet, and the launch guard."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3
import pytest

from costguard.alarms.aws import AwsAlarms
from costguard.alarms.burn import PricedInstance, burn_report, month_bounds, price_running
from costguard.alarms.guard import NoAlarmError, require_alarm
from costguard.checkpoint.pace import Pace, write_pace
from costguard.checkpoint.store import Store
from costguard.money import format_usd
from costguard.pricing.catalog import Catalog, Market
from costguard.reaper.fleet import PriceBook
from costguard.reaper.policy import Instance
from costguard.spot.job import Job, save_job
from costguard.spot.launcher.base import Handle
from costguard.spot.recovery import Attempt
from tests.helpers.output import WIDTHS, assert_fits
from tests.servers.http import JsonServer
from tests.spot.test_offers_and_job import spec
from tests.spot.test_simulator import ON_DEMAND


def launch(region: str, instance_type: str, count: int = 1, *, spot: bool = False) -> list[str]:
    ec2 = boto3.client("ec2", region_name=region)
    image = "ami-12345678"  # moto accepts any image id; looking one up costs seconds
    extra: dict[str, Any] = {}
    if spot:
        extra["InstanceMarketOptions"] = {"MarketType": "spot"}
    made = ec2.run_instances(
        ImageId=image, InstanceType=instance_type, MinCount=count, MaxCount=count, **extra
    )
    return [i["InstanceId"] for i in made["Instances"]]


@pytest.fixture
def fleet(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    stopped = launch("us-east-1", "g5.xlarge")
    boto3.client("ec2", region_name="us-east-1").stop_instances(InstanceIds=stopped)
    return {
        "on_demand": launch("us-east-1", "g5.xlarge", 2),
        "spot": launch("us-west-2", "g5.xlarge", spot=True),
        "unknown": launch("us-west-2", "m1.small"),
        "stopped": stopped,
    }


@pytest.fixture
def webhook() -> Iterator[JsonServer]:
    server = JsonServer(lambda method, path, query, body: (200, {"ok": True}))
    yield server
    server.stop()


def table_price(catalog: Catalog, region: str, instance_type: str, market: Market) -> Decimal:
    (row,) = [
        i
        for i in catalog.instances
        if (i.provider, i.region, i.instance_type) == ("aws", region, instance_type)
    ]
    price = row.usd_per_hour(market)
    assert price is not None
    return price


def test_burn_prices_the_running_fleet(run_cli: Callable[..., Any], fleet, catalog) -> None:
    result = run_cli("burn", "--region", "us-east-1", "--region", "us-west-2", "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    seen = {i["instance_id"]: i for i in doc["instances"]}
    assert set(seen) == set(fleet["on_demand"] + fleet["spot"] + fleet["unknown"])
    (spot_id,) = fleet["spot"]
    assert seen[spot_id]["market"] == "spot"
    (unknown,) = fleet["unknown"]
    assert seen[unknown]["usd_per_hour"] is None
    assert "not in the price tables" in seen[unknown]["note"]
    expected = 2 * table_price(catalog, "us-east-1", "g5.xlarge", Market.ON_DEMAND) + table_price(
        catalog, "us-west-2", "g5.xlarge", Market.SPOT
    )
    assert Decimal(doc["usd_per_hour"]) == expected
    # moto launches "now": the projection is the burn rate over what is left of the month.
    _, end = month_bounds(datetime.now(UTC))
    hours_left = Decimal((end - datetime.now(UTC)).total_seconds()) / 3600
    assert abs(Decimal(doc["projected_month_usd"]) - expected * hours_left) < expected
    assert doc["over_budget"] is False
    assert doc["budget_usd"] is None


def test_burn_over_budget_exits_1_and_alerts(
    run_cli: Callable[..., Any], fleet, webhook: JsonServer
) -> None:
    assert run_cli("alarm", "--budget", "300", "--no-notify").exit_code == 0
    sqs = boto3.client("sqs", region_name="us-east-1")
    queue = sqs.create_queue(QueueName="alerts")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    topic = "arn:aws:sns:us-east-1:123456789012:costguard-budget-alerts"
    boto3.client("sns", region_name="us-east-1").subscribe(
        TopicArn=topic, Protocol="sqs", Endpoint=queue_arn
    )

    result = run_cli(
        "burn", "--region", "us-east-1", "--region", "us-west-2", "--webhook", f"{webhook.url}/hook"
    )
    assert result.exit_code == 1
    assert "over the budget of $300.00" in result.stderr  # the costguard-monthly amount
    assert "Projected this month" in result.stdout
    (posted,) = webhook.requests
    assert (posted.method, posted.path) == ("POST", "/hook")
    assert posted.body["over_budget"] is True
    assert Decimal(posted.body["budget_usd"]) == 300
    messages = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)["Messages"]
    assert "projected spend this month" in json.loads(messages[0]["Body"])["Message"]


@pytest.mark.parametrize("width", WIDTHS)
def test_burn_table_fits_the_terminal(
    run_cli: Callable[..., Any], fleet, terminal: Callable[[int], None], width: int
) -> None:
    args = ("burn", "--region", "us-east-1", "--region", "us-west-2", "--no-notify")
    doc = run_cli(*args, "--format", "json").json()
    cells = [i["instance_id"] for i in doc["instances"]] + ["us-west-2", "g5.xlarge"]
    cells += [
        format_usd(Decimal(i["usd_per_hour"]), rate=True)
        for i in doc["instances"]
        if i["usd_per_hour"]
    ]
    terminal(width)
    result = run_cli(*args)
    assert result.exit_code == 0, result.stderr
    assert_fits(result.stdout, width, cells)


def test_burn_names_a_forged_job_and_still_alerts(
    run_cli: Callable[..., Any], fleet, webhook: JsonServer, tmp_path: Path
) -> None:
    """Issue 43 item 3: a job.json with a NaN price ended burn with "unexpected
    InvalidOperation" before the over-budget webhook was called."""
    good = running_job_store(tmp_path / "good", fleet["on_demand"][0])
    forged = Store.open(tmp_path / "forged")
    doc = json.loads(Store.open(good).get("job/job.json"))
    doc["attempts"][0]["offer"]["usd_per_hour"] = float("nan")
    forged.put("job/job.json", json.dumps(doc).encode())
    result = run_cli("burn", "--budget", "1", "--region", "us-east-1", "--webhook", webhook.url,
                     "--job", forged.url, "--job", good)  # fmt: skip
    assert result.exit_code == 1, result.stderr  # over budget, not a crash
    assert "unexpected" not in result.stderr
    (posted,) = webhook.requests
    bad, fine = posted.body["jobs"]
    assert "is not a costguard record" in bad["error"]
    assert bad["remaining_usd"] is None
    assert fine["job_id"] == "cg-test-1"
    assert Decimal(fine["spent_usd"]) > 0
    assert "is not a costguard record" in result.stdout


def test_burn_no_notify(run_cli: Callable[..., Any], fleet, webhook: JsonServer) -> None:
    result = run_cli(
        "burn", "--budget", "1", "--region", "us-east-1", "--no-notify", "--webhook", webhook.url
    )
    assert result.exit_code == 1
    assert webhook.requests == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--budget", "0"), "--budget"),
        (("--budget", "nan"), "--budget"),
        (("--region", "mars-1"), "region"),
        (("--webhook", "file:///etc/passwd"), "--webhook"),
        (("--provider", "oracle"), "--provider"),
    ],
)
def test_burn_bad_input(run_cli: Callable[..., Any], aws_env: str, args, needle) -> None:
    result = run_cli("burn", *args)
    assert result.exit_code == 2
    assert needle in result.stderr
    assert "Hint:" in result.stderr


def test_burn_report_arithmetic() -> None:
    now = datetime(2026, 2, 10, 12, tzinfo=UTC)
    # Launched before the month: counted from February 1.
    early = Instance(
        "aws", "us-east-1", "i-a", "g5.xlarge", True, 1, datetime(2026, 1, 20, tzinfo=UTC)
    )
    late = Instance(
        "aws", "us-east-1", "i-b", "g5.xlarge", True, 1, now - timedelta(hours=2), spot=True
    )
    report = burn_report(
        [
            PricedInstance(early, Decimal(1)),
            PricedInstance(late, Decimal(2)),
            PricedInstance(late, None),
        ],
        now,
        Decimal(1000),
    )
    assert report.month_start == datetime(2026, 2, 1, tzinfo=UTC)
    assert report.month_end == datetime(2026, 3, 1, tzinfo=UTC)
    assert report.usd_per_hour == 3
    assert report.spent_usd == Decimal(9 * 24 + 12) * 1 + Decimal(2) * 2
    hours_left = Decimal(18 * 24 + 12)
    assert report.projected_usd == report.spent_usd + 3 * hours_left
    assert report.over_budget is True
    assert len(report.unpriced) == 1


def test_pricing_running_instances(catalog: Catalog) -> None:
    book = PriceBook(catalog)
    launched = datetime(2026, 12, 1, tzinfo=UTC)
    spot_unpriced = Instance("aws", "us-east-1", "i-x", "p5.4xlarge", True, 1, launched, spot=True)
    stopped = Instance(
        "aws", "us-east-1", "i-s", "g5.xlarge", False, 1, launched, usd_per_hour=Decimal(1)
    )
    unknown = Instance("aws", "us-east-1", "i-u", "x9.huge", True, 0, launched)
    priced = price_running(
        [spot_unpriced, stopped, unknown],
        lambda vm: book.usd_per_hour(vm.provider, vm.region, vm.instance_type, spot=False),
    )
    assert [p.instance.instance_id for p in priced] == ["i-x", "i-u"]
    expected = table_price(catalog, "us-east-1", "p5.4xlarge", Market.ON_DEMAND)
    assert priced[0].usd_per_hour == expected
    assert "on-demand" in priced[0].note
    assert priced[1].usd_per_hour is None


def test_month_bounds_in_december() -> None:
    start, end = month_bounds(datetime(2026, 12, 31, 23, tzinfo=UTC))
    assert (start.month, end.year, end.month) == (12, 2027, 1)


def test_guard_refuses_without_a_budget_then_allows(
    aws_env: str, monkeypatch: pytest.MonkeyPatch, run_cli: Callable[..., Any]
) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(NoAlarmError) as info:
        require_alarm("aws", AwsAlarms())
    assert "costguard alarm" in (info.value.hint or "")
    assert info.value.exit_code == 1
    assert run_cli("alarm", "--budget", "100", "--no-notify").exit_code == 0
    assert require_alarm("aws", AwsAlarms()) is None


def test_guard_override_warns_without_calling() -> None:
    class Exploding:
        def has_alarm(self) -> bool:
            raise AssertionError("no call may be made with --no-alarm-check")

    warning = require_alarm("gcp", Exploding(), override=True)
    assert warning is not None
    assert "--no-alarm-check" in warning


def running_job_store(tmp_path: Path, instance_id: str) -> str:
    """A job launched 600 s ago whose script recorded 500 of its 2000 steps at 0.5 s each,
    its attempt on ``instance_id`` at $1.006/h, as ``costguard launch`` writes it."""
    store = Store.open(tmp_path / "ckpt")
    now = time.time()
    attempt = Attempt(1, ON_DEMAND, launched_unix=now - 600,
                      handle=Handle("aws", "us-east-1", instance_id))  # fmt: skip
    job_spec = spec(store.url, spot=False, simulation=None, created_unix=now - 605)
    save_job(store, Job(job_spec, attempts=(attempt,)))
    write_pace(store, Pace(400, 200.0, 500, now, now - 590, total_steps=2000))
    return store.url


def test_burn_includes_the_projections_of_running_jobs(
    run_cli: Callable[..., Any], aws_env: str, tmp_path: Path, terminal: Callable[[int], None]
) -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1")
    tagged = [
        ec2.run_instances(
            ImageId="ami-12345678", InstanceType="g5.xlarge", MinCount=1, MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance",
                                "Tags": [{"Key": "costguard:job", "Value": job}]}],
        )["Instances"][0]["InstanceId"]
        for job in ("cg-test-1", "cg-other-9")
    ]  # fmt: skip
    written = time.time()
    url = running_job_store(tmp_path, tagged[0])
    (tmp_path / "empty").mkdir()
    missing = tmp_path / "missing"
    args = ("burn", "--region", "us-east-1", "--job", url, "--job", str(tmp_path / "empty"),
            "--job", str(missing))  # fmt: skip
    result = run_cli(*args, "--format", "json")
    waited = time.time() - written  # the machine's load decides it: the bounds follow it
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert {i["instance_id"]: i["job"] for i in doc["instances"]} == dict(
        zip(tagged, ("cg-test-1", "cg-other-9"), strict=True)
    )
    running, unreadable, absent = doc["jobs"]
    assert (running["job_id"], running["status"]) == ("cg-test-1", "running")
    assert running["instance_id"] == tagged[0]
    projection = running["projection"]
    assert projection["total_steps"] == 2000
    rate = Decimal("1.006") / 3600  # a second at $1.006/h
    spent = Decimal(running["spent_usd"])
    assert rate * 600 <= spent <= rate * (600 + Decimal(waited))  # launched 600 s before
    # The steps since the record at its 0.5 s each; the rest, and a 10 s wind-down, to come.
    done = projection["steps_done"]
    assert 500 <= done <= 500 + waited / 0.5
    assert projection["left_s"] == pytest.approx((2000 - done) * 0.5 + 10, abs=0.2)
    still = Decimal(running["remaining_usd"])
    assert abs(still - rate * Decimal(str(projection["left_s"]))) < Decimal("0.0002")
    assert Decimal(running["projected_total_usd"]) == spent + still
    assert Decimal(doc["jobs_remaining_usd"]) == still
    assert unreadable["job_id"] is None
    assert unreadable["url"] == str(tmp_path / "empty")
    assert "no costguard job" in unreadable["error"]
    assert unreadable["remaining_usd"] is None
    assert absent["error"] is not None
    assert not missing.exists()  # burn reads: a mistyped folder is not made
    terminal(80)
    table = run_cli(*args)
    assert table.exit_code == 0, table.stderr
    # The tables fit; a note's folder path is one word, kept whole (copyable).
    tables = table.stdout[: table.stdout.index("Notes:")]
    assert_fits(tables, 80, ["cg-test-1", "running", "unreadable"])
    text = " ".join(table.stdout.split())
    assert "cg-test-1" in text
    assert "Jobs still to spend: $0." in text  # a few seconds later: the same cents or so
    assert f"{tmp_path / 'empty'}: no costguard job" in text
    # An instance of a job not passed with --job says how to see its projection.
    assert f"{tagged[1]}: costguard job cg-other-9" in text
    assert "--job URL" in text


def test_burn_names_a_job_without_a_projection(
    run_cli: Callable[..., Any], aws_env: str, tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "ckpt")
    attempt = Attempt(1, ON_DEMAND, launched_unix=time.time() - 60)
    save_job(store, Job(spec(store.url, spot=False, simulation=None), attempts=(attempt,)))
    done = Store.open(tmp_path / "done")
    save_job(done, Job(spec(done.url, spot=False, simulation=None), status="succeeded"))
    result = run_cli("burn", "--region", "us-east-1", "--job", store.url, "--job", done.url,
                     "--format", "json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    unprojected, finished = result.json()["jobs"]
    assert unprojected["projection"] is None
    assert unprojected["remaining_usd"] is None
    assert "no pace recorded" in unprojected["note"]
    assert Decimal(finished["remaining_usd"]) == 0
    assert finished["status"] == "succeeded"
