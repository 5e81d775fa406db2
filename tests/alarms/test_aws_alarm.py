"""`costguard alarm` against moto server over HTTP, through AWS_ENDPOINT_URL."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import boto3
import pytest

from costguard.clouds import aws as aws_clouds
from tests.helpers.output import WIDTHS, assert_fits

ACCOUNT = "123456789012"
TOPIC = f"arn:aws:sns:us-east-1:{ACCOUNT}:costguard-budget-alerts"


@pytest.fixture
def calls(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every API call costguard makes, counted with a botocore event hook."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # moto answers unimplemented calls with 500
    made: list[str] = []
    real_client = aws_clouds.client

    def counting_client(service: str, region: str | None = None, **kwargs: Any) -> Any:
        client = real_client(service, region, **kwargs)

        def record(model: Any, **_: Any) -> None:
            made.append(f"{service}.{model.name}")

        client.meta.events.register("before-call.*.*", record, unique_id="count")  # shared client
        return client

    monkeypatch.setattr(aws_clouds, "client", counting_client)
    return made


def writes(calls: list[str]) -> list[str]:
    reads = ("Describe", "List", "Get")
    return [c for c in calls if not c.split(".")[1].startswith(reads)]


def budgets() -> Any:
    return boto3.client("budgets", region_name="us-east-1")


def notifications(name: str = "costguard-monthly") -> set[tuple[str, float]]:
    found = budgets().describe_notifications_for_budget(AccountId=ACCOUNT, BudgetName=name)
    return {(n["NotificationType"], n["Threshold"]) for n in found["Notifications"]}


def test_create_then_rerun_is_a_no_op(run_cli: Callable[..., Any], calls: list[str]) -> None:
    first = run_cli("alarm", "--budget", "200", "--email", "me@uni.edu")
    assert first.exit_code == 0, first.stderr
    assert "budgets.create_budget" in first.stdout

    budget = budgets().describe_budget(AccountId=ACCOUNT, BudgetName="costguard-monthly")
    assert budget["Budget"]["BudgetLimit"] == {"Amount": "200", "Unit": "USD"}
    assert budget["Budget"]["TimeUnit"] == "MONTHLY"
    assert notifications() == {
        ("ACTUAL", 50.0),
        ("ACTUAL", 80.0),
        ("ACTUAL", 100.0),
        ("FORECASTED", 100.0),
    }
    sns = boto3.client("sns", region_name="us-east-1")
    policy = json.loads(sns.get_topic_attributes(TopicArn=TOPIC)["Attributes"]["Policy"])
    (statement,) = policy["Statement"]
    assert statement["Principal"]["Service"] == [
        "budgets.amazonaws.com",
        "cloudwatch.amazonaws.com",
    ]
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT}}
    subs = sns.list_subscriptions_by_topic(TopicArn=TOPIC)["Subscriptions"]
    assert [(s["Protocol"], s["Endpoint"]) for s in subs] == [("email", "me@uni.edu")]
    (alarm,) = boto3.client("cloudwatch", region_name="us-east-1").describe_alarms(
        AlarmNames=["costguard-monthly-estimated-charges"]
    )["MetricAlarms"]
    assert (alarm["Namespace"], alarm["MetricName"]) == ("AWS/Billing", "EstimatedCharges")
    assert alarm["Threshold"] == 200.0
    assert alarm["AlarmActions"] == [TOPIC]
    assert alarm["Dimensions"] == [{"Name": "Currency", "Value": "USD"}]

    calls.clear()
    second = run_cli("alarm", "--budget", "200", "--email", "me@uni.edu")
    assert second.exit_code == 0, second.stderr
    assert second.stdout.startswith("No changes")
    assert writes(calls) == []
    assert calls  # it did look


def test_new_amount_updates_in_place(run_cli: Callable[..., Any], calls: list[str]) -> None:
    assert run_cli("alarm", "--budget", "200", "--email", "me@uni.edu").exit_code == 0
    result = run_cli("alarm", "--budget", "350", "--email", "me@uni.edu", "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    made = [c["call"] for c in doc["calls"]]
    # moto has no update_budget: costguard deletes and recreates, and says so.
    assert made[:2] == ["budgets.delete_budget", "budgets.create_budget"]
    assert doc["changed"] is True
    budget = budgets().describe_budget(AccountId=ACCOUNT, BudgetName="costguard-monthly")
    assert budget["Budget"]["BudgetLimit"]["Amount"] in ("350", "350.0")
    assert len(notifications()) == 4
    (alarm,) = boto3.client("cloudwatch", region_name="us-east-1").describe_alarms(
        AlarmNames=["costguard-monthly-estimated-charges"]
    )["MetricAlarms"]
    assert alarm["Threshold"] == 350.0
    assert len(budgets().describe_budgets(AccountId=ACCOUNT)["Budgets"]) == 1
    calls.clear()
    assert run_cli("alarm", "--budget", "350", "--email", "me@uni.edu").stdout.startswith(
        "No changes"
    )
    assert writes(calls) == []


def test_threshold_change_edits_only_the_alerts(
    run_cli: Callable[..., Any], calls: list[str]
) -> None:
    assert run_cli("alarm", "--budget", "200", "--no-notify").exit_code == 0
    calls.clear()
    result = run_cli(
        "alarm", "--budget", "200", "--no-notify", "--thresholds", "50,90", "--no-forecast"
    )
    assert result.exit_code == 0, result.stderr
    assert notifications() == {("ACTUAL", 50.0), ("ACTUAL", 90.0)}
    assert sorted(writes(calls)) == sorted(
        [
            "budgets.DeleteNotification",
            "budgets.DeleteNotification",
            "budgets.DeleteNotification",
            "budgets.CreateNotification",
        ]
    )


def someone_elses_budget() -> None:
    """A budget of the account that costguard did not make (no costguard- prefix)."""
    budgets().create_budget(
        AccountId=ACCOUNT,
        Budget={
            "BudgetName": "someone-elses",
            "BudgetLimit": {"Amount": "5", "Unit": "USD"},
            "TimeUnit": "MONTHLY",
            "BudgetType": "COST",
        },
    )


def test_status_lists_ours(run_cli: Callable[..., Any], calls: list[str]) -> None:
    assert run_cli("alarm", "--budget", "200", "--email", "me@uni.edu").exit_code == 0
    assert run_cli("alarm", "--budget", "75", "--no-notify", "--name", "thesis").exit_code == 0
    someone_elses_budget()
    doc = run_cli("alarm", "status", "--format", "json").json()
    assert {(b["name"], b["amount_usd"]) for b in doc["budgets"]} == {
        ("costguard-monthly", "200"),
        ("costguard-thesis", "75"),
    }
    table = run_cli("alarm", "status")
    assert "costguard-thesis" in table.stdout
    assert "someone-elses" not in table.stdout


@pytest.mark.parametrize("width", WIDTHS)
def test_status_fits_the_terminal(
    run_cli: Callable[..., Any], calls: list[str], terminal: Callable[[int], None], width: int
) -> None:
    assert run_cli("alarm", "--budget", "1234.5", "--email", "me@uni.edu").exit_code == 0
    assert (
        run_cli(
            "alarm", "--budget", "75", "--no-notify", "--name", "thesis-chapter-three"
        ).exit_code
        == 0
    )
    terminal(width)
    result = run_cli("alarm", "status")
    assert result.exit_code == 0, result.stderr
    assert_fits(
        result.stdout, width, ["costguard-monthly", "costguard-thesis-chapter-three", "$1,234.50"]
    )


def test_delete_is_dry_run_by_default_and_removes_only_ours(
    run_cli: Callable[..., Any], calls: list[str]
) -> None:
    assert run_cli("alarm", "--budget", "200", "--no-notify").exit_code == 0
    someone_elses_budget()
    calls.clear()
    preview = run_cli("alarm", "delete")
    assert preview.exit_code == 0
    assert "Would delete" in preview.stdout
    assert writes(calls) == []
    result = run_cli("alarm", "delete", "--yes")
    assert result.exit_code == 0, result.stderr
    names = {b["BudgetName"] for b in budgets().describe_budgets(AccountId=ACCOUNT)["Budgets"]}
    assert names == {"someone-elses"}
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    assert (
        cloudwatch.describe_alarms(AlarmNames=["costguard-monthly-estimated-charges"])[
            "MetricAlarms"
        ]
        == []
    )
    topics = boto3.client("sns", region_name="us-east-1").list_topics()["Topics"]
    assert TOPIC not in [t["TopicArn"] for t in topics]


def test_dry_run_makes_no_call_at_all(run_cli: Callable[..., Any], calls: list[str]) -> None:
    result = run_cli(
        "alarm", "--budget", "200", "--email", "me@uni.edu", "--dry-run", "--format", "json"
    )
    assert result.exit_code == 0, result.stderr
    assert calls == []
    doc = result.json()
    planned = [c["call"] for c in doc["calls"] if not c["read_only"]]
    assert planned == [
        "sns.create_topic",
        "sns.set_topic_attributes",
        "sns.subscribe",
        "budgets.create_budget",
        "cloudwatch.put_metric_alarm",
    ]
    assert budgets().describe_budgets(AccountId=ACCOUNT).get("Budgets", []) == []
    text = run_cli("alarm", "--budget", "200", "--email", "me@uni.edu", "--dry-run")
    assert "no call is made" in text.stdout
    assert calls == []
    # For people: what would exist, who is told, the next step; the calls' parameters are
    # for --format json (the issue saw a wall of wrapped JSON).
    lines = text.stdout.splitlines()
    assert "Who is told:" in lines
    assert "  - me@uni.edu (email)" in lines
    assert any("monthly cost budget of $200" in line for line in lines)
    assert not [line for line in lines if "{" in line]
    assert lines[-2:] == [
        "Every call with its parameters: the same command with --format json.",
        "Next: the same command without --dry-run.",
    ]
    assert len(lines) <= 15


def test_billing_metrics_missing_is_explained(
    run_cli: Callable[..., Any], calls: list[str]
) -> None:
    result = run_cli("alarm", "--budget", "200", "--no-notify")
    assert "AWS/Billing metrics are not enabled" in result.stdout
    boto3.client("cloudwatch", region_name="us-east-1").put_metric_data(
        Namespace="AWS/Billing",
        MetricData=[
            {
                "MetricName": "EstimatedCharges",
                "Value": 12.5,
                "Dimensions": [{"Name": "Currency", "Value": "USD"}],
            }
        ],
    )
    again = run_cli("alarm", "--budget", "200", "--no-notify")
    assert "AWS/Billing metrics are not enabled" not in again.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--budget", "0"), "more than $0"),
        (("--budget", "-5"), "more than $0"),
        (("--budget", "nan"), "number of dollars"),
        (("--budget", "lots"), "number of dollars"),
        (("--budget", "2e9"), "more than costguard accepts"),
        (("--budget", "10.001"), "more than cents"),
        (("--budget", "200", "--email", "not-an-email"), "not an email"),
        (
            ("--budget", "200", *[a for i in range(11) for a in ("--email", f"u{i}@x.edu")]),
            "10 email",
        ),
        (("--budget", "200", "--thresholds", "0,50"), "outside (0, 1000]"),
        (("--budget", "200", "--thresholds", "1001"), "outside (0, 1000]"),
        (("--budget", "200", "--thresholds", "fifty"), "not a number"),
        (
            ("--budget", "200", "--thresholds", ",".join(str(i) for i in range(1, 11))),
            "10 notifications",
        ),
        (("--budget", "200", "--provider", "oracle"), "--provider"),
        (("--budget", "200", "--provider", "gcp"), "--billing-account"),
        (
            ("--budget", "200", "--provider", "gcp", "--billing-account", "123"),
            "XXXXXX-XXXXXX-XXXXXX",
        ),
        (("--budget", "200", "--provider", "azure", "--email", "a@b.edu"), "--subscription"),
        (
            (
                "--budget",
                "200",
                "--provider",
                "azure",
                "--subscription",
                "00000000-0000-0000-0000-000000000000",
            ),
            "--email",
        ),
        (("--budget", "200", "--name", "bad name!"), "--name"),
        (("--budget", "200", "--name", "bad!"), "budget name"),
        ((), "--budget"),
        (("--budget", "200"), "--no-notify"),  # nobody would be told
    ],
)
def test_bad_input_exits_2_before_any_call(
    run_cli: Callable[..., Any], calls: list[str], args: tuple[str, ...], needle: str
) -> None:
    result = run_cli("alarm", *args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert calls == []
    assert result.stderr.startswith("Error: ")
    assert needle in result.stderr
    assert "Hint: " in result.stderr
    assert "Traceback" not in result.stderr


def test_status_lists_alerts_in_numeric_order(
    run_cli: Callable[..., Any], calls: list[str]
) -> None:
    """100% after 50% (as numbers), not before it (as text)."""
    args = ("alarm", "--budget", "200", "--no-notify", "--thresholds", "100,50,8")
    assert run_cli(*args).exit_code == 0
    (budget,) = run_cli("alarm", "status", "--format", "json").json()["budgets"]
    actual = [a for a in budget["alerts"] if a.startswith("ACTUAL")]
    assert actual == ["ACTUAL > 8%", "ACTUAL > 50%", "ACTUAL > 100%"]
