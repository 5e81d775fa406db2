"""`--hard-stop`: an AWS Budgets action that denies launches at 100%.

moto has no budget actions, so AWS Budgets is reached through a small proxy (set with the
standard AWS_ENDPOINT_URL_BUDGETS) that serves the three budget-action operations in the
AWS JSON 1.1 protocol and forwards every other request to the moto server.
"""

from __future__ import annotations

import itertools
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest

ROLE = "arn:aws:iam::123456789012:role/costguard-budgets"
POLICY = "arn:aws:iam::123456789012:policy/costguard-deny-run-instances"
ACTION_OPS = ("CreateBudgetAction", "DescribeBudgetActionsForBudget", "DeleteBudgetAction")


class BudgetActionsProxy:
    def __init__(self, upstream: str) -> None:
        self.actions: list[dict[str, Any]] = []
        self.operations: list[str] = []
        ids = itertools.count(1)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = self.headers.get("X-Amz-Target", "")
                operation = target.rsplit(".", 1)[-1]
                proxy.operations.append(operation)
                if operation in ACTION_OPS:
                    request = json.loads(body or b"{}")
                    if operation == "CreateBudgetAction":
                        action = {k: v for k, v in request.items() if k != "AccountId"}
                        action.update(ActionId=f"action-{next(ids)}", Status="STANDBY")
                        proxy.actions.append(action)
                        reply = {
                            "AccountId": request["AccountId"],
                            "BudgetName": request["BudgetName"],
                            "ActionId": action["ActionId"],
                        }
                    elif operation == "DescribeBudgetActionsForBudget":
                        reply = {
                            "Actions": [
                                a for a in proxy.actions if a["BudgetName"] == request["BudgetName"]
                            ]
                        }
                    else:
                        proxy.actions = [
                            a for a in proxy.actions if a["ActionId"] != request["ActionId"]
                        ]
                        reply = {}
                    self._send(
                        200,
                        {"Content-Type": "application/x-amz-json-1.1"},
                        json.dumps(reply).encode(),
                    )
                    return
                forward = urllib.request.Request(
                    upstream + self.path,
                    data=body,
                    method="POST",
                    headers={
                        k: v
                        for k, v in self.headers.items()
                        if k.lower() not in ("host", "content-length")
                    },
                )
                try:
                    with urllib.request.urlopen(forward, timeout=30) as answer:
                        self._send(answer.status, dict(answer.headers), answer.read())
                except urllib.error.HTTPError as error:
                    self._send(error.code, dict(error.headers), error.read())

            def _send(self, status: int, headers: dict[str, str], data: bytes) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    if key.lower() not in (
                        "content-length",
                        "transfer-encoding",
                        "connection",
                        "server",
                        "date",
                    ):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


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
        (("--hard-stop",), "ARN of the role"),
        (
            ("--hard-stop", "--hard-stop-role-arn", "not-an-arn", "--hard-stop-target", "user/a"),
            "ARN of the role",
        ),
        (("--hard-stop", "--hard-stop-role-arn", ROLE), "--hard-stop-target"),
        (("--hard-stop", "--hard-stop-role-arn", ROLE, "--hard-stop-target", "alice"), "user/NAME"),
        (("--hard-stop-role-arn", ROLE), "only apply with --hard-stop"),
        (
            ("--hard-stop", "--provider", "azure", "--subscription", "s", "--email", "a@b.edu"),
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
