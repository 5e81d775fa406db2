"""infra/ documents are valid and grant what `costguard alarm`/`burn` call - no more."""

from __future__ import annotations

import json
import re
from pathlib import Path

from costguard.alarms.aws import AwsAlarms
from costguard.alarms.plan import ObservedAws, alarm_spec, plan_aws

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


def test_aws_policy_covers_every_call_of_a_run() -> None:
    spec = alarm_spec(budget="200", emails=["me@uni.edu"])
    calls = AwsAlarms().dry_run_plan(spec).calls
    allowed = allowed_actions()
    for call in calls:
        if call.service == "sts":
            continue  # GetCallerIdentity needs no permission
        if call.service == "budgets":
            needed = "budgets:ViewBudget" if call.read_only else "budgets:ModifyBudget"
        else:
            needed = f"{call.service}:{pascal(call.operation)}"
        assert needed in allowed, f"{call} needs {needed}"


def test_aws_policy_is_scoped_to_costguard_resources() -> None:
    allowed = allowed_actions()
    for action, resources in allowed.items():
        if action in ("cloudwatch:ListMetrics", "ec2:DescribeInstances", "budgets:ViewBudget"):
            continue  # these cannot be scoped to a resource name
        assert all("costguard" in r for r in resources), action


def test_plan_writes_only_costguard_named_resources() -> None:
    spec = alarm_spec(budget="200", name="thesis")
    for call in plan_aws(spec, ObservedAws(account_id="111122223333")).calls:
        params = dict(call.params)
        names = [params.get(key) for key in ("Name", "BudgetName", "AlarmName")]
        names += [params.get("Budget", {}).get("BudgetName"), params.get("TopicArn")]
        names = [str(n).rsplit(":", 1)[-1] for n in names if n]
        assert names, call
        assert all(n.startswith("costguard-") for n in names), (call, names)


def test_gcp_role_and_azure_role_parse() -> None:
    role = (INFRA / "gcp" / "alarm-role.yaml").read_text()
    permissions = re.findall(r"^\s+- ([a-z.]+)$", role, flags=re.MULTILINE)
    assert "billing.budgets.create" in permissions
    assert all(p.startswith(("billing.budgets.", "monitoring.notificationChannels."))
               for p in permissions)
    azure = json.loads((INFRA / "azure" / "alarm-role.json").read_text())
    assert azure["IsCustom"] is True
    assert all(a.startswith(("Microsoft.Consumption/budgets/", "Microsoft.Compute/"))
               for a in azure["Actions"])
