"""The reaper's infra/ files agree with the code: permissions, agent config, units, cron."""

from __future__ import annotations

import json
import re
import shlex
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import click
import pytest

from costguard.cli.agent import agent_command
from costguard.cli.reap import reap_command
from costguard.reaper import agent, aws, azure, policy
from costguard.tags import KEEP_TAG, MARK_TAG

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
SOURCE = ROOT / "src" / "costguard" / "reaper"


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def aws_operations() -> set[str]:
    """Every boto3 operation the AWS adapter calls (or pages through), as IAM actions."""
    text = (SOURCE / "aws.py").read_text()
    calls = re.findall(r"\b(ec2|cloudwatch)\.([a-z]+_[a-z_]+)", text)
    pages = re.findall(r'self\.(ec2|cloudwatch),\s*"([a-z_]+)"', text)
    return {f"{service}:{camel(op)}" for service, op in calls + pages}


def test_the_aws_policy_allows_every_call_and_guards_the_destructive_ones() -> None:
    policy = json.loads((INFRA / "aws" / "reaper-policy.json").read_text())
    allowed = {a for s in policy["Statement"] for a in s["Action"]}
    used = aws_operations()
    assert used >= {"ec2:DescribeInstances", "cloudwatch:GetMetricData", "ec2:StopInstances"}
    assert used <= allowed, used - allowed
    assert "cloudwatch:GetMetricStatistics" not in allowed  # no per-instance metric calls


def condition_holds(operator: str, key: str, wanted: Any, context: dict[str, Any]) -> bool:
    """One IAM condition, evaluated as the IAM documentation defines its operator (the few
    the reaper's policy uses); ``context`` maps condition keys to a value, a list of
    values (multivalued keys such as aws:TagKeys) or nothing (the key is absent)."""
    wanted = [wanted] if isinstance(wanted, str) else list(wanted)
    present = key in context
    value = context.get(key)
    if operator == "Null":  # "true": the key is absent; "false": present (and not empty)
        absent = not present or value == []
        return absent == (wanted == ["true"])
    if operator.startswith("ForAllValues:"):
        inner = operator.removeprefix("ForAllValues:")
        return all(condition_holds(inner, key, wanted, {key: v}) for v in value or [])
    if not present:
        return operator.startswith("StringNot")
    if operator == "StringEquals":
        return value in wanted
    if operator == "StringNotEquals":
        return value not in wanted
    if operator == "StringEqualsIgnoreCase":
        return str(value).lower() in [w.lower() for w in wanted]
    if operator == "StringLike":
        return any(fnmatchcase(value, w) for w in wanted)
    raise AssertionError(f"the evaluator does not know {operator}")


def iam_allows(action: str, context: dict[str, Any]) -> bool:
    """Whether the reaper's AWS policy allows ``action`` in ``context`` (no Deny in it)."""
    policy = json.loads((INFRA / "aws" / "reaper-policy.json").read_text())
    return any(
        statement["Effect"] == "Allow"
        and action in statement["Action"]
        and all(
            condition_holds(operator, key, wanted, context)
            for operator, pairs in statement.get("Condition", {}).items()
            for key, wanted in pairs.items()
        )
        for statement in policy["Statement"]
    )


@pytest.mark.parametrize(
    "keep",
    [None, "true", "TRUE", "yes", "1", "on", "", "keep", "y", "protect", "\uff54\uff52\uff55\uff45",
     "false", "FALSE", "no", "0", "off", " false", "false\n"],
)  # fmt: skip
@pytest.mark.parametrize("action", ["ec2:StopInstances", "ec2:TerminateInstances"])
def test_the_aws_policy_stops_exactly_what_the_rule_may_stop(keep: str | None, action: str) -> None:
    """Deny on the protect tag's presence, not on one spelling: IAM and the code agree."""
    context: dict[str, Any] = {"ec2:InstanceType": "g5.xlarge"}
    tags = {}
    if keep is not None:
        context[f"aws:ResourceTag/{KEEP_TAG}"] = keep
        tags[KEEP_TAG] = keep
    now = datetime(2026, 12, 1, tzinfo=UTC)
    box = policy.Instance("aws", "us-east-1", "i-1", "g5.xlarge", True, 1, now, tags=tags)
    protected = policy.static_verdict(box, policy.IdlePolicy(grace_minutes=0), now) is not None
    assert iam_allows(action, context) is not protected
    assert not iam_allows(action, {**context, "ec2:InstanceType": "m5.large"})


@pytest.mark.parametrize(
    ("action", "keys", "allowed"),
    [
        ("ec2:CreateTags", ["costguard:idle-since"], True),
        ("ec2:DeleteTags", ["costguard:idle-since"], True),
        ("ec2:DeleteTags", [], False),  # no Tags: EC2 deletes every tag, the keep tag too
        ("ec2:DeleteTags", None, False),
        ("ec2:DeleteTags", ["costguard:keep"], False),
        ("ec2:DeleteTags", ["costguard:idle-since", "costguard:keep"], False),
        ("ec2:CreateTags", ["costguard:keep"], False),
    ],
)
def test_the_aws_policy_writes_only_the_mark(
    action: str, keys: list[str] | None, allowed: bool
) -> None:
    """The request carries only the keys the Service Authorization Reference lists for the
    action on an instance (``DeleteTags`` has no ``ec2:InstanceType``: a condition on it
    refused every unmark; tests/aws_service_authorization.json)."""
    marked: dict[str, Any] = {
        "ec2:InstanceType": "p4d.24xlarge",
        f"aws:ResourceTag/{MARK_TAG}": "2026-12-01",
    }
    if keys is not None:
        marked["aws:TagKeys"] = keys
    assert iam_allows(action, request_context(action, marked)) is allowed
    unmarked = {k: v for k, v in marked.items() if k != f"aws:ResourceTag/{MARK_TAG}"}
    if action == "ec2:DeleteTags":  # only from an instance that carries the mark
        assert not iam_allows(action, request_context(action, unmarked))


def request_context(action: str, context: dict[str, Any]) -> dict[str, Any]:
    """``context`` less the keys the reference does not list for ``action`` on an instance."""
    table = json.loads((ROOT / "tests" / "aws_service_authorization.json").read_text())
    listed = [*table["actions"][action]["instance"], *table["actions"][action]["(action)"]]
    patterns = [re.escape(k).replace(re.escape("${TagKey}"), ".+") for k in listed]
    return {k: v for k, v in context.items() if any(re.fullmatch(p, k) for p in patterns)}


def test_the_cloudwatch_agent_config_ties_gpu_metrics_to_instances() -> None:
    config = json.loads((INFRA / "cloudwatch-agent.json").read_text())
    metrics = config["metrics"]
    assert metrics["namespace"] == aws.GPU_NAMESPACE
    assert metrics["append_dimensions"]["InstanceId"] == "${aws:InstanceId}"
    assert ["InstanceId"] in metrics["aggregation_dimensions"]
    measured = metrics["metrics_collected"]["nvidia_gpu"]["measurement"]
    assert "utilization_gpu" in measured  # the agent publishes it as nvidia_smi_utilization_gpu
    assert aws.GPU_METRIC == "nvidia_smi_utilization_gpu"


def test_the_gcp_role_covers_the_calls() -> None:
    text = (INFRA / "gcp" / "reaper-role.yaml").read_text()
    permissions = set(re.findall(r"^\s+- ([a-zA-Z.]+)$", text, re.MULTILINE))
    assert permissions == {
        "compute.instances.list",
        "compute.instances.get",
        "compute.instances.stop",
        "compute.instances.delete",
        "compute.instances.setLabels",
        "compute.zoneOperations.get",
        "monitoring.timeSeries.list",
    }


def test_the_azure_roles_read_on_the_subscription_and_act_on_resource_groups_only() -> None:
    read = json.loads((INFRA / "azure" / "reaper-role.json").read_text())
    act = json.loads((INFRA / "azure" / "reaper-act-role.json").read_text())
    assert all(a.endswith("/read") for a in read["Actions"])  # subscription-wide: reads only
    changing = {a for a in act["Actions"] if not a.endswith("/read")}
    assert changing == {
        "Microsoft.Compute/virtualMachines/deallocate/action",
        "Microsoft.Compute/virtualMachines/delete",
        "Microsoft.Resources/tags/write",
    }
    for scope in act["AssignableScopes"]:  # never a whole subscription
        assert re.fullmatch(r"/subscriptions/[^/]+/resourceGroups/[^/]+(/.+)?", scope), scope
    assert not any("Microsoft.Authorization" in a for a in act["Actions"])  # locks stay


def test_the_azure_role_deallocates_and_never_needs_power_off() -> None:
    role = json.loads((INFRA / "azure" / "reaper-role.json").read_text())
    act = json.loads((INFRA / "azure" / "reaper-act-role.json").read_text())
    actions = set(role["Actions"]) | set(act["Actions"])
    assert "Microsoft.Compute/virtualMachines/deallocate/action" in actions
    assert "Microsoft.Insights/metrics/read" in actions
    assert not any("powerOff" in a for a in actions)
    assert "begin_power_off" not in (SOURCE / "azure.py").read_text()
    assert azure.VM_NAMESPACE == "Microsoft.Compute/virtualMachines"


def command_args(line: str, command: str) -> list[str]:
    """The arguments after ``costguard <command>`` in a shell line, without $VARS and redirects."""
    words = shlex.split(line.split(">>")[0])
    start = words.index(command) + 1
    return [w for w in words[start:] if not w.startswith("$")]


def parses(command: click.Command, args: list[str]) -> dict[str, Any]:
    context = command.make_context(command.name or "x", list(args), resilient_parsing=False)
    return dict(context.params)


@pytest.mark.parametrize(
    ("path", "command", "name"),
    [
        ("cron/costguard-reap", reap_command, "reap"),
        ("systemd/costguard-reap.service", reap_command, "reap"),
        ("systemd/costguard-agent.service", agent_command, "agent"),
    ],
)
def test_units_and_cron_run_valid_commands(path: str, command: click.Command, name: str) -> None:
    lines = [
        line.removeprefix("ExecStart=")
        for line in (INFRA / path).read_text().splitlines()
        if not line.startswith(("#", "Description=")) and f"costguard {name} " in line
    ]
    assert len(lines) == 1, lines
    params = parses(command, command_args(lines[0], name))
    assert params["execute"] is True  # every command that stops machines is a dry run without
    if name == "reap":
        assert params["output_format"] == "json"


def test_the_agent_unit_provides_the_jobs_directory() -> None:
    unit = (INFRA / "systemd" / "costguard-agent.service").read_text()
    assert f"{agent.JOBS_DIR_ENV}={agent.DEFAULT_JOBS_DIR}" in unit
    assert "RuntimeDirectoryMode=0755" in unit  # not world-writable (issue 28)
    timer = (INFRA / "systemd" / "costguard-reap.timer").read_text()
    assert "OnCalendar=*:0/15" in timer


def test_the_readme_has_a_reaper_section() -> None:
    readme = (INFRA / "README.md").read_text()
    assert "## Idle reaper and on-instance autostop" in readme
    for name in (
        "reaper-policy.json",
        "reaper-role.yaml",
        "reaper-role.json",
        "reaper-act-role.json",
        "costguard-agent.service",
    ):
        assert name in readme


def test_the_aws_policy_reads_user_data_of_no_instance_but_gpu_ones() -> None:
    # Issue 28: DescribeInstanceAttribute on "*" also returns every instance's user data
    # (startup scripts, often with secrets); the reaper reads protection of GPU
    # candidates only, so that is all it may read.
    policy = json.loads((INFRA / "aws" / "reaper-policy.json").read_text())
    (statement,) = [
        s for s in policy["Statement"] if "ec2:DescribeInstanceAttribute" in s["Action"]
    ]
    assert statement["Action"] == ["ec2:DescribeInstanceAttribute"]
    assert statement["Resource"] == "arn:aws:ec2:*:*:instance/*"
    assert iam_allows("ec2:DescribeInstanceAttribute", {"ec2:InstanceType": "p4d.24xlarge"})
    assert not iam_allows("ec2:DescribeInstanceAttribute", {"ec2:InstanceType": "m5.large"})
    assert not iam_allows("ec2:DescribeInstanceAttribute", {})
    assert all(s["Resource"] != "*" for s in policy["Statement"]
               if set(s["Action"]) & {"ec2:DescribeInstanceAttribute", "ec2:StopInstances",
                                       "ec2:TerminateInstances"})  # fmt: skip
