"""infra/ documents are valid and grant what `costguard alarm`/`burn` call - no more."""

from __future__ import annotations

import json
import re
from pathlib import Path

from costguard.alarms.aws import AwsAlarms
from costguard.alarms.plan_aws import ObservedAws, plan_aws
from costguard.alarms.spec import alarm_spec

INFRA = Path(__file__).resolve().parents[2] / "infra"


def pascal(operation: str) -> str:
    return "".join(part.title() for part in operation.split("_"))


def allowed_actions() -> dict[str, set[str]]:
    policy = json.loads((INFRA / "aws" / "alarm-policy.json").read_text())
    actions: dict[str, set[str]] = {}
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        for action in statement["Action"]:
            actions.setdefault(action, set()).add(statement["Resource"])
    return actions


BUDGET_ACTIONS = ("create_budget_action", "describe_budget_actions_for_budget")


def test_aws_policy_covers_every_call_of_a_run() -> None:
    spec = alarm_spec(
        budget="200",
        emails=["me@uni.edu"],
        hard_stop=True,
        hard_stop_role_arn="arn:aws:iam::111122223333:role/costguard-budgets",
        hard_stop_targets=["user/alice"],
    )
    calls = AwsAlarms().dry_run_plan(spec).calls
    assert {c.operation for c in calls} >= {"create_policy", *BUDGET_ACTIONS}
    allowed = allowed_actions()
    for call in calls:
        if call.service == "sts":
            continue  # GetCallerIdentity needs no permission
        if call.operation == "create_policy":
            # An administrator's step (infra/README.md): see the next test.
            assert "iam:CreatePolicy" not in allowed
            assert call.params["PolicyDocument"] == json.loads(
                (INFRA / "aws" / "deny-run-instances-policy.json").read_text()
            )
            continue
        if call.service == "budgets" and call.operation not in BUDGET_ACTIONS:
            # Budgets authorises its API with two actions only.
            needed = "budgets:ViewBudget" if call.read_only else "budgets:ModifyBudget"
        else:
            needed = f"{call.service}:{pascal(call.operation)}"
        assert needed in allowed, f"{call} needs {needed}"
    assert "iam:PassRole" in allowed  # Budgets assumes the execution role


def test_hard_stop_role_documents() -> None:
    trust = json.loads((INFRA / "aws" / "budgets-action-role-trust.json").read_text())
    (statement,) = trust["Statement"]
    assert statement["Principal"] == {"Service": "budgets.amazonaws.com"}
    permissions = json.loads((INFRA / "aws" / "budgets-action-role-policy.json").read_text())
    (statement,) = permissions["Statement"]
    assert statement["Condition"]["ArnEquals"]["iam:PolicyARN"].endswith(
        ":policy/costguard-deny-run-instances"
    )


def test_aws_policy_is_scoped_to_costguard_resources() -> None:
    allowed = allowed_actions()
    for action, resources in allowed.items():
        if action in ("cloudwatch:ListMetrics", "budgets:ViewBudget") or action.startswith(
            "ec2:Describe"
        ):
            continue  # these cannot be scoped to a resource name
        assert all("costguard" in r for r in resources), action


def test_plan_writes_only_costguard_named_resources() -> None:
    spec = alarm_spec(budget="200", name="thesis")
    for call in plan_aws(spec, ObservedAws(account_id="111122223333")).calls:
        params = dict(call.params)
        found = [params.get(key) for key in ("Name", "BudgetName", "AlarmName", "TopicArn")]
        found.append(params.get("Budget", {}).get("BudgetName"))
        names = [str(n).rsplit(":", 1)[-1] for n in found if n]
        assert names, call
        assert all(n.startswith("costguard-") for n in names), (call, names)


def test_gcp_role_and_azure_role_parse() -> None:
    role = (INFRA / "gcp" / "alarm-role.yaml").read_text()
    permissions = re.findall(r"^\s+- ([a-z.]+)$", role, flags=re.MULTILINE)
    assert "billing.budgets.create" in permissions
    # The plan reads the account's currency and the project's number (costguard.alarms.gcp).
    reads = {"billing.accounts.get", "resourcemanager.projects.get"}
    assert reads <= set(permissions)
    assert all(
        p in reads or p.startswith(("billing.budgets.", "monitoring.notificationChannels."))
        for p in permissions
    )
    azure = json.loads((INFRA / "azure" / "alarm-role.json").read_text())
    assert azure["IsCustom"] is True
    assert all(
        a.startswith(("Microsoft.Consumption/budgets/", "Microsoft.Compute/"))
        for a in azure["Actions"]
    )


def test_the_alarm_policy_cannot_make_the_policy_a_hard_stop_attaches() -> None:
    # Issue 28: iam:CreatePolicy on costguard-* let an alarm user create
    # costguard-deny-run-instances first, with any content, for the budget action to attach.
    policy = json.loads((INFRA / "aws" / "alarm-policy.json").read_text())
    iam_actions = {a for s in policy["Statement"] for a in s["Action"] if a.startswith("iam:")}
    assert iam_actions == {"iam:GetPolicy", "iam:PassRole"}
    (get_policy,) = [s for s in policy["Statement"] if "iam:GetPolicy" in s["Action"]]
    assert get_policy["Resource"] == "arn:aws:iam::*:policy/costguard-deny-run-instances"
    readme = (INFRA / "README.md").read_text()
    assert "--policy-document file://infra/aws/deny-run-instances-policy.json" in readme
