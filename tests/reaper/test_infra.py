"""The reaper's infra/ files agree with the code: permissions, agent config, units, cron."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest

from costguard.cli.agent import agent_command
from costguard.cli.reap import reap_command
from costguard.reaper import agent, aws, azure

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
    for statement in policy["Statement"]:
        if {"ec2:StopInstances", "ec2:TerminateInstances"} & set(statement["Action"]):
            keep = statement["Condition"]["StringNotEqualsIgnoreCase"]
            assert keep == {"aws:ResourceTag/costguard:keep": "true"}
        if "ec2:CreateTags" in statement["Action"]:
            keys = statement["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"]
            assert keys == ["costguard:idle-since"]


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


def test_the_azure_role_deallocates_and_never_needs_power_off() -> None:
    role = json.loads((INFRA / "azure" / "reaper-role.json").read_text())
    actions = set(role["Actions"])
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
    assert "RuntimeDirectoryMode=1777" in unit
    timer = (INFRA / "systemd" / "costguard-reap.timer").read_text()
    assert "OnCalendar=*:0/15" in timer


def test_the_readme_has_a_reaper_section() -> None:
    readme = (INFRA / "README.md").read_text()
    assert "## Idle reaper and on-instance autostop" in readme
    for name in (
        "reaper-policy.json",
        "reaper-role.yaml",
        "reaper-role.json",
        "costguard-agent.service",
    ):
        assert name in readme
