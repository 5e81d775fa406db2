"""`--hard-stop`: an AWS Budgets action that denies launches at 100%.

moto has no budget actions, so AWS Budgets is reached through a small proxy (set with the
standard AWS_ENDPOINT_URL_BUDGETS) that serves the three budget-action operations in the
AWS JSON 1.1 protocol and forwards every other request to the moto server.
"""

from __future__ import annotations

import itertools
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import boto3
import pytest

from tests.servers.http import Loopback

ROLE = "arn:aws:iam::123456789012:role/costguard-budgets"
POLICY = "arn:aws:iam::123456789012:policy/costguard-deny-run-instances"
ACTION_OPS = ("CreateBudgetAction", "DescribeBudgetActionsForBudget", "DeleteBudgetAction")


#: Headers the proxy does not pass back from moto (the loopback server sets its own).
HOP_HEADERS = ("content-length", "transfer-encoding", "connection", "server", "date")


class BudgetActionsProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.actions: list[dict[str, Any]] = []
        self.operations: list[str] = []
        #: Actions per page at most (the API's MaxResults is at most 100), with a NextToken.
        self.page_size = 100
        self._ids = itertools.count(1)
        self._loopback = Loopback(self._answer)
        self.url = self._loopback.url

    def _answer(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        operation = headers.get("X-Amz-Target", "").rsplit(".", 1)[-1]
        self.operations.append(operation)
        if operation in ACTION_OPS:
            request = json.loads(body or b"{}")
            if operation == "CreateBudgetAction":
                action = {k: v for k, v in request.items() if k != "AccountId"}
                action.update(ActionId=f"action-{next(self._ids)}", Status="STANDBY")
                self.actions.append(action)
                reply = {
                    "AccountId": request["AccountId"],
                    "BudgetName": request["BudgetName"],
                    "ActionId": action["ActionId"],
                }
            elif operation == "DescribeBudgetActionsForBudget":
                listed = [a for a in self.actions if a["BudgetName"] == request["BudgetName"]]
                start = int(request.get("NextToken") or 0)
                end = start + min(self.page_size, int(request.get("MaxResults") or 100))
                reply = {"Actions": listed[start:end]}
                if end < len(listed):
                    reply["NextToken"] = str(end)
            else:
                self.actions = [a for a in self.actions if a["ActionId"] != request["ActionId"]]
                reply = {}
            content_type = [("Content-Type", "application/x-amz-json-1.1")]
            return 200, content_type, json.dumps(reply).encode()
        forward = urllib.request.Request(
            self.upstream + target,
            data=body,
            method="POST",
            headers={
                k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")
            },
        )
        try:
            with urllib.request.urlopen(forward, timeout=30) as answer:
                return answer.status, _passed(answer.headers), answer.read()
        except urllib.error.HTTPError as error:
            return error.code, _passed(error.headers), error.read()

    def stop(self) -> None:
        self._loopback.stop()


def _passed(headers: Any) -> list[tuple[str, str]]:
    return [(k, v) for k, v in dict(headers).items() if k.lower() not in HOP_HEADERS]


@pytest.fixture
def proxy(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[BudgetActionsProxy]:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    server = BudgetActionsProxy(aws_env)
    monkeypatch.setenv("AWS_ENDPOINT_URL_BUDGETS", server.url)
    yield server
    server.stop()


HARD_STOP = (
    "--hard-stop",
    "--hard-stop-role-arn",
    ROLE,
    "--hard-stop-target",
    "user/alice",
    "--hard-stop-target",
    "role/Research",
)


def test_hard_stop_creates_policy_and_action_once(
    run_cli: Callable[..., Any], proxy: BudgetActionsProxy
) -> None:
    result = run_cli("alarm", "--budget", "200", "--no-notify", *HARD_STOP)
    assert result.exit_code == 0, result.stderr
    assert "budgets.create_budget_action" in result.stdout
    document = boto3.client("iam").get_policy_version(PolicyArn=POLICY, VersionId="v1")[
        "PolicyVersion"
    ]["Document"]
    if isinstance(document, str):
        document = json.loads(document)
    (statement,) = document["Statement"]
    assert statement["Effect"] == "Deny"
    assert "ec2:RunInstances" in statement["Action"]
    (action,) = proxy.actions
    assert action["ActionType"] == "APPLY_IAM_POLICY"
    assert action["ApprovalModel"] == "AUTOMATIC"
    assert action["ExecutionRoleArn"] == ROLE
    assert action["ActionThreshold"] == {
        "ActionThresholdValue": 100.0,
        "ActionThresholdType": "PERCENTAGE",
    }
    assert action["Definition"] == {
        "IamActionDefinition": {"PolicyArn": POLICY, "Users": ["alice"], "Roles": ["Research"]}
    }

    proxy.operations.clear()
    again = run_cli("alarm", "--budget", "200", "--no-notify", *HARD_STOP)
    assert again.exit_code == 0, again.stderr
    assert again.stdout.startswith("No changes")
    assert "CreateBudgetAction" not in proxy.operations
    assert len(proxy.actions) == 1


def test_hard_stop_reads_every_page_of_the_budgets_actions(
    run_cli: Callable[..., Any], proxy: BudgetActionsProxy
) -> None:
    """DescribeBudgetActionsForBudget pages with a NextToken: an action of costguard's on
    the second page is found (only the first page was read, and a second one created)."""
    result = run_cli("alarm", "--budget", "200", "--no-notify", *HARD_STOP)
    assert result.exit_code == 0, result.stderr
    (ours,) = proxy.actions
    someone = {**ours, "ActionId": "action-by-someone", "ActionType": "RUN_SSM_DOCUMENTS",
               "Definition": {"SsmActionDefinition": {}}}  # fmt: skip
    proxy.actions.insert(0, someone)
    proxy.page_size = 1
    proxy.operations.clear()
    again = run_cli("alarm", "--budget", "200", "--no-notify", *HARD_STOP)
    assert again.exit_code == 0, again.stderr
    assert proxy.operations.count("DescribeBudgetActionsForBudget") >= 2
    assert "CreateBudgetAction" not in proxy.operations
    assert again.stdout.startswith("No changes"), again.stdout
    assert len(proxy.actions) == 2


def test_hard_stop_dry_run_lists_the_action(
    run_cli: Callable[..., Any], proxy: BudgetActionsProxy
) -> None:
    result = run_cli(
        "alarm", "--budget", "200", "--no-notify", *HARD_STOP, "--dry-run", "--format", "json"
    )
    assert result.exit_code == 0
    calls = [c["call"] for c in result.json()["calls"]]
    assert "iam.create_policy" in calls
    assert calls[-2:] == ["budgets.create_budget_action", "cloudwatch.put_metric_alarm"]
    assert proxy.operations == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--hard-stop",), "ARN of the role AWS Budgets assumes, none was given"),  # not None
        (
            ("--hard-stop", "--hard-stop-role-arn", "not-an-arn", "--hard-stop-target", "user/a"),
            "ARN of the role AWS Budgets assumes, not 'not-an-arn'",
        ),
        (("--hard-stop", "--hard-stop-role-arn", ROLE), "--hard-stop-target"),
        (("--hard-stop", "--hard-stop-role-arn", ROLE, "--hard-stop-target", "alice"), "user/NAME"),
        (("--hard-stop-role-arn", ROLE), "only apply with --hard-stop"),
        (
            (
                "--hard-stop",
                "--provider",
                "azure",
                "--subscription",
                "00000000-0000-0000-0000-000000000000",
                "--email",
                "a@b.edu",
            ),
            "AWS Budgets action",
        ),
    ],
)
def test_hard_stop_bad_input(
    run_cli: Callable[..., Any], proxy: BudgetActionsProxy, args: tuple[str, ...], needle: str
) -> None:
    result = run_cli("alarm", "--budget", "200", "--no-notify", *args)
    assert result.exit_code == 2, result.stderr
    assert needle in result.stderr
    assert proxy.operations == []
