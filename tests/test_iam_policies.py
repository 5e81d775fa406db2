"""The IAM documents in ``infra/aws`` match the code's calls exactly (issue 27).

Every AWS operation in ``src/`` is found by walking the code (AST): a method or operation
name of a boto3 client (botocore's service models name them) in a module, or in the
functions of a code path; the checkpoint store reaches S3 through s3fs, whose requests
are recorded on the wire (moto behind the fault proxy). Each operation is mapped to the
IAM action it needs (the Service Authorization Reference: most are ``prefix:Operation``;
S3 and Budgets differ, tabled below). Every action a code path needs is allowed by its
policy, and every action a policy allows is needed by one of its code paths, or implied
by a call's parameters (tabled with the reason).
"""

from __future__ import annotations

import ast
import json
import re
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "costguard"
INFRA = REPO / "infra" / "aws"

#: Services costguard calls, and their IAM action prefix.
PREFIXES = {
    service: service
    for service in ("ec2", "s3", "budgets", "sns", "cloudwatch", "iam", "sts", "pricing")
}
#: Operations whose IAM action is not ``prefix:Operation`` (None: no permission needed).
ACTIONS = {
    ("sts", "GetCallerIdentity"): None,  # "No permissions are required" (STS API reference)
    ("budgets", "DescribeBudget"): "budgets:ViewBudget",
    ("budgets", "DescribeBudgets"): "budgets:ViewBudget",
    ("budgets", "DescribeNotificationsForBudget"): "budgets:ViewBudget",
    ("budgets", "DescribeSubscribersForNotification"): "budgets:ViewBudget",
    ("budgets", "CreateBudget"): "budgets:ModifyBudget",
    ("budgets", "UpdateBudget"): "budgets:ModifyBudget",
    ("budgets", "DeleteBudget"): "budgets:ModifyBudget",
    ("budgets", "CreateNotification"): "budgets:ModifyBudget",
    ("budgets", "DeleteNotification"): "budgets:ModifyBudget",
    ("budgets", "CreateSubscriber"): "budgets:ModifyBudget",
    ("budgets", "DeleteSubscriber"): "budgets:ModifyBudget",
    ("s3", "HeadObject"): "s3:GetObject",
    ("s3", "HeadBucket"): "s3:ListBucket",
    ("s3", "ListObjectsV2"): "s3:ListBucket",
    ("s3", "DeleteObjects"): "s3:DeleteObject",
    ("s3", "CreateMultipartUpload"): "s3:PutObject",
    ("s3", "UploadPart"): "s3:PutObject",
    ("s3", "CompleteMultipartUpload"): "s3:PutObject",
    ("s3", "ListMultipartUploads"): "s3:ListBucketMultipartUploads",
    ("s3", "ListParts"): "s3:ListMultipartUploadParts",
}
#: Allowed actions no operation names, each needed by a call's parameters.
IMPLIED = {
    ("launcher-policy.json", "ec2:CreateTags"): "RunInstances with TagSpecifications",
    ("launcher-policy.json", "iam:PassRole"): "RunInstances with an IamInstanceProfile",
    ("alarm-policy.json", "iam:PassRole"): "CreateBudgetAction with an ExecutionRoleArn",
    # Without it S3 answers 403, not 404, for an object that is not there yet (an exit
    # record the instance has not written): the controller would read "forbidden".
    ("launcher-policy.json", "s3:ListBucket"): "GetObject of a missing key answers 404",
}
#: Each policy's code paths: (module, functions or None for the whole module).
CODE_PATHS: dict[str, list[tuple[str, tuple[str, ...] | None]]] = {
    "launcher-policy.json": [("spot/launcher/aws.py", None)],
    "reaper-policy.json": [("reaper/aws.py", None)],
    "alarm-policy.json": [
        ("alarms/aws.py", None),
        ("alarms/plan_aws.py", None),
        # `costguard burn` lists the running instances through the reaper's fleet.
        ("reaper/aws.py", ("instances", "_describe_types", "_every_type", "enabled_regions")),
    ],
    "pricing-refresh-policy.json": [("pricing/refresh/aws.py", None)],
    "launcher-instance-role-policy.json": [("checkpoint/uploads.py", None)],
}
#: Calls a code path makes that its policy leaves to an administrator on purpose, each with
#: the reason (issue 28: ``iam:CreatePolicy`` let an alarm user write the deny policy first).
ADMIN_STEPS = {
    ("alarm-policy.json", "iam:CreatePolicy"): "the deny policy of --hard-stop: infra/README.md",
}
#: Policies no costguard code runs under: AWS Budgets itself attaches the deny policy, which
#: an administrator creates once (deny-run-instances-policy.json is that policy's content).
NOT_CODE = {"budgets-action-role-policy.json", "deny-run-instances-policy.json"}


def operations(service: str) -> dict[str, str]:
    """snake_case method name -> operation name, from botocore's service model."""
    import botocore.session
    from botocore import xform_name

    model = botocore.session.get_session().get_service_model(service)
    return {xform_name(op): op for op in model.operation_names}


def names_in(module: str, functions: tuple[str, ...] | None) -> set[str]:
    """Attribute names and string constants in ``module`` (or only in ``functions``)."""
    tree = ast.parse((SRC / module).read_text())
    roots: list[ast.AST] = [tree]
    if functions is not None:
        defs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        roots = [n for n in defs if n.name in functions]
        assert {n.name for n in defs if n.name in functions} == set(functions), module
    found = set()
    for root in roots:
        for node in ast.walk(root):
            if isinstance(node, ast.Attribute):
                found.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return found


def action(service: str, operation: str) -> str | None:
    return ACTIONS.get((service, operation), f"{PREFIXES[service]}:{operation}")


def called(module: str, functions: tuple[str, ...] | None) -> set[str]:
    """The IAM actions of the boto3 operations named in a code path."""
    names = names_in(module, functions)
    needed = set()
    for service in PREFIXES:
        for method, operation in operations(service).items():
            if method in names and (found := action(service, operation)):
                needed.add(found)
    return needed


def statements(name: str) -> list[dict[str, Any]]:
    policy = json.loads((INFRA / name).read_text())
    assert policy["Version"] == "2012-10-17"
    return list(policy["Statement"])


def listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def allowed(name: str) -> set[str]:
    return {a for s in statements(name) if s["Effect"] == "Allow" for a in listed(s["Action"])}


def needed_by(name: str) -> set[str]:
    return set().union(*(called(m, f) for m, f in CODE_PATHS[name]))


def test_every_policy_is_checked() -> None:
    assert {p.name for p in INFRA.glob("*-policy.json")} == set(CODE_PATHS) | NOT_CODE


@pytest.mark.parametrize("name", sorted(CODE_PATHS))
def test_every_call_is_allowed_by_the_policy_it_runs_under(name: str) -> None:
    needed = needed_by(name)
    assert needed, name  # the walk finds the calls
    missing = needed - allowed(name) - {a for (p, a) in ADMIN_STEPS if p == name}
    assert not missing, f"{name} lacks {sorted(missing)}"
    for policy, admin_only in ADMIN_STEPS:  # what an administrator does is never granted
        assert policy != name or admin_only not in allowed(name)


@pytest.mark.parametrize("name", sorted(CODE_PATHS))
def test_every_allowed_action_is_called_or_implied(name: str) -> None:
    extra = allowed(name) - needed_by(name) - {a for (p, a) in IMPLIED if p == name}
    if name in STORE_SIDES:  # its S3 actions: checked on the wire, below
        extra = {a for a in extra if not a.startswith("s3:")}
    assert not extra, f"{name} allows {sorted(extra)}, which no code calls"


def test_the_walk_finds_the_calls_an_audit_found_by_hand() -> None:
    """The calls issue 27's audit named, each where it runs."""
    assert "s3:ListBucketMultipartUploads" in needed_by("launcher-instance-role-policy.json")
    assert {"pricing:GetProducts", "ec2:DescribeSpotPriceHistory"} <= needed_by(
        "pricing-refresh-policy.json"
    )
    assert "ec2:DescribeInstanceTypes" in needed_by("alarm-policy.json")
    assert "budgets:DeleteBudgetAction" not in needed_by("alarm-policy.json")
    assert "s3:ListMultipartUploadParts" not in needed_by("launcher-instance-role-policy.json")


# -- the checkpoint store's S3 requests (s3fs: not boto3 calls in src/), on the wire --------


Seen = list[tuple[str, str, dict[str, str]]]


def s3_operation(method: str, path: str) -> str:
    """The S3 REST operation of one request (path-style, as moto is reached)."""
    query = path.split("?", 1)[1] if "?" in path else ""
    key = path.split("?", 1)[0].strip("/").partition("/")[2]
    if "uploadId=" in query:
        return {"PUT": "UploadPart", "POST": "CompleteMultipartUpload",
                "DELETE": "AbortMultipartUpload", "GET": "ListParts"}[method]  # fmt: skip
    if re.search(r"(^|&)uploads(=|&|$)", query):
        return "CreateMultipartUpload" if method == "POST" else "ListMultipartUploads"
    if re.search(r"(^|&)delete(=|&|$)", query):
        return "DeleteObjects"
    if not key:
        return {"GET": "ListObjectsV2", "HEAD": "HeadBucket"}[method]
    return {"PUT": "PutObject", "GET": "GetObject", "HEAD": "HeadObject",
            "DELETE": "DeleteObject"}[method]  # fmt: skip


def s3_actions(seen: Seen) -> set[str]:
    return {a for m, p, _ in seen if (a := action("s3", s3_operation(m, p)))}


#: Each side's S3 requests: what the controller does (``costguard launch``, ``jobs
#: status``, ``--attach``: the probe, job.json, the wheel, exit records) and what
#: ``costguard run`` does on the instance (the probe, a save, its exit record, the sweep).
STORE_SIDES = ("launcher-policy.json", "launcher-instance-role-policy.json")


def record_store(side: str, moto: str, monkeypatch: pytest.MonkeyPatch) -> Seen:
    """The S3 requests of one side, seen by the fault proxy in front of moto."""
    from costguard.checkpoint.store import Store
    from costguard.checkpoint.uploads import PartLimits
    from costguard.spot.job import (
        ExitRecord,
        Job,
        load_job,
        read_exit_record,
        save_job,
        write_exit_record,
    )
    from tests.helpers.faults import Faults, fault_proxy
    from tests.helpers.stores import make_s3_bucket
    from tests.spot.test_offers_and_job import spec

    make_s3_bucket(moto, "my-checkpoints")
    url = "s3://my-checkpoints/costguard/run-1"
    faults = Faults(eligible=lambda method, path: True)
    with fault_proxy(moto, faults) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy)
        store = Store.open(url, parts=PartLimits(part_bytes=5 * 2**20))
        store.check_writable()
        if side == "launcher-policy.json":
            save_job(store, Job(spec(url)))
            load_job(store)
            store.put_hashed("wheels/costguard.whl", b"wheel")
            read_exit_record(store, 1, "cg-test-1")
        else:
            store.put_hashed("ckpt-1/state.pt", bytes(11 * 2**20))  # in parts
            write_exit_record(store, ExitRecord(1, 0, 10, 0.0, job_id="cg-test-1"))
            store.abort_stale_uploads(0)
            store.listing()  # the restore looks for the latest checkpoint
            store.delete(["ckpt-1/state.pt"])  # retention
    return faults.seen


@pytest.mark.parametrize("side", STORE_SIDES)
def test_the_store_calls_of_each_side_are_allowed_and_all_it_is_allowed(
    side: str, aws_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = record_store(side, aws_env, monkeypatch)
    needed = s3_actions(seen)
    s3_allowed = {a for a in allowed(side) if a.startswith("s3:")}
    assert needed <= s3_allowed, (side, sorted(needed - s3_allowed))
    implied = {a for (p, a) in IMPLIED if p == side}
    assert s3_allowed <= needed | needed_by(side) | implied, sorted(
        s3_allowed - needed - needed_by(side) - implied
    )
    for method, path, _ in seen:  # every object under the checkpoint prefix the policy names
        key = path.split("?", 1)[0].strip("/")
        assert key == "my-checkpoints" or fnmatchcase(key, "my-checkpoints/costguard/*"), key
        if side == "launcher-instance-role-policy.json":  # which its policy denies it
            assert method == "GET" or not key.endswith("/job/job.json"), (method, key)


def s3_allows(policy: list[dict[str, Any]], action_name: str, key: str) -> bool:
    """Whether ``policy`` (no conditions on objects) allows ``action_name`` on object ``key``
    (``bucket/path``): some Allow names it, no Deny does."""

    def names(statement: dict[str, Any]) -> bool:
        return action_name in listed(statement["Action"]) and any(
            fnmatchcase(f"arn:aws:s3:::{key}", r) for r in listed(statement["Resource"])
        )

    effects = {s["Effect"] for s in policy if names(s)}
    return "Allow" in effects and "Deny" not in effects


def test_the_instance_role_never_rewrites_a_job_document() -> None:
    """The instance runs the user's command with the owner's role: it writes checkpoints
    and exit records, but only the controller writes ``job/job.json`` (which says what to
    launch and which instances are the job's), so no job's code rewrites another's job
    (issue 28: one role per job is not possible, see infra/README.md)."""
    policy = statements("launcher-instance-role-policy.json")
    job = "my-checkpoints/costguard/OWNER/run-1/"
    assert s3_allows(policy, "s3:PutObject", job + "ckpt-1/state.pt")
    assert s3_allows(policy, "s3:PutObject", job + "job/attempt-1.exit.json")
    assert s3_allows(policy, "s3:GetObject", job + "job/job.json")
    for action_name in ("s3:PutObject", "s3:DeleteObject"):
        assert not s3_allows(policy, action_name, job + "job/job.json")
        assert not s3_allows(policy, action_name, "my-checkpoints/costguard/BOB/run-2/x")


# ------------------------------------------ what the Service Authorization Reference says

#: The reference's facts for the actions the policies scope (resource types and their
#: condition keys, ARN formats), with their sources: tests/aws_service_authorization.json.
REFERENCE: dict[str, Any] = json.loads(
    (REPO / "tests" / "aws_service_authorization.json").read_text()
)


def _like(pattern: str, text: str) -> bool:
    """``text`` (a policy's ARN or key, ``*`` a wildcard) fits ``pattern`` (the reference's,
    each ``${Name}`` a placeholder for anything)."""
    parts = re.split(r"\$\{[^}]+\}", pattern)
    regex = ".*".join(re.escape(p) for p in parts)
    return re.fullmatch(regex, text.replace("*", "x")) is not None


#: ARNs a policy names that the reference does not list for the action, each with why.
UNLISTED = {
    ("ec2:RunInstances", "arn:aws:ec2:*:*:spot-instances-request/*"): "the reference lists no "
    "spot request for RunInstances, so it grants nothing; kept, unverified either way, in case "
    "a spot launch is authorized against one",
}


def resource_types(action_name: str, resources: list[str]) -> set[str]:
    """The resource types of ``action_name`` that a statement's ``Resource`` names."""
    service = action_name.split(":")[0]
    types = {t for t in REFERENCE["actions"][action_name] if t != "(action)"}
    if resources == ["*"]:
        return types
    found = set()
    for arn in resources:
        if (action_name, arn) in UNLISTED:
            continue
        fits = {t for t in types if _like(REFERENCE["arns"][f"{service}:{t}"], arn)}
        assert fits, f"{arn} is no ARN of a resource type {action_name} takes: {sorted(types)}"
        found |= fits
    return found


def scoped_statements() -> list[tuple[str, dict[str, Any]]]:
    """(policy, statement) for each statement with a Condition or a Resource other than *."""
    return [
        (path.name, s)
        for path in sorted(INFRA.glob("*.json"))
        for s in statements(path.name)
        if "Action" in s and (s.get("Condition") or listed(s.get("Resource", "*")) != ["*"])
    ]


def test_every_condition_key_is_one_the_reference_lists_for_the_action() -> None:
    """A key the reference does not list for an action (and resource type) is never in that
    request's context: a StringLike on it fails, so the statement allows nothing (issue 28:
    ``ec2:DeleteTags`` has no ``ec2:InstanceType``, which kept the reaper from removing its
    own mark)."""
    wrong = []
    for policy, statement in scoped_statements():
        keys = {k for operator in statement.get("Condition", {}).values() for k in operator}
        for action_name in listed(statement["Action"]):
            table = REFERENCE["actions"].get(action_name)
            if table is None:
                local = keys - set(REFERENCE["global_keys"])
                assert not local, f"{policy}: add {action_name} to the reference table"
                continue
            resources = listed(statement.get("Resource", "*"))
            for kind in resource_types(action_name, resources):
                known = [*table[kind], *table["(action)"], *REFERENCE["global_keys"]]
                wrong += [
                    f"{policy} {statement.get('Sid')}: {action_name} on {kind} has no {key}"
                    for key in sorted(keys)
                    if not any(_like(k, key) for k in known)
                ]
    assert wrong == []


def test_policy_variables_sit_in_the_resource_part_of_an_arn() -> None:
    """ "Only in the resource portion of the ARN ... after the 5th colon" (the IAM User
    Guide's variables page, in the reference's sources); ``${aws:PrincipalTag/...}`` is one
    the guide shows there (the launcher's PassRole and instance role names)."""
    for policy, statement in scoped_statements():
        for arn in listed(statement.get("Resource", "*")):
            if "${" in arn:
                assert "${" not in ":".join(arn.split(":")[:5]), (policy, arn)
                assert re.fullmatch(r"[^$]*(\$\{aws:PrincipalTag/[\w:-]+\}[^$]*)+", arn), arn


def test_the_reference_table_holds_the_facts_the_policies_rest_on() -> None:
    """The three facts issue 28 took from memory, now read from the reference."""
    describe = REFERENCE["actions"]["ec2:DescribeInstanceAttribute"]
    assert set(describe) == {"instance", "(action)"}  # only an instance ARN
    assert "ec2:InstanceType" in describe["instance"]
    assert REFERENCE["arns"]["ec2:instance"].endswith(":instance/${InstanceId}")
    assert "ec2:InstanceType" not in REFERENCE["actions"]["ec2:DeleteTags"]["instance"]
    assert "iam:PassedToService" in REFERENCE["actions"]["iam:PassRole"]["(action)"]
    assert "variables" in REFERENCE["sources"]
