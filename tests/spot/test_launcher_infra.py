"""infra/ documents for the launcher grant what the adapters call, under conditions their
requests meet, and no more."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from costguard.clouds import aws as aws_clouds
from costguard.spot import node
from costguard.spot.launcher.aws import AwsLauncher
from costguard.spot.launcher.base import Handle, LaunchSpec, Market, Offer
from costguard.tags import JOB_TAG, OWNER_TAG

INFRA = Path(__file__).resolve().parents[2] / "infra"


def statements(name: str) -> list[dict[str, Any]]:
    policy = json.loads((INFRA / "aws" / name).read_text())
    assert policy["Version"] == "2012-10-17"
    return list(policy["Statement"])


def listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def allows(action: str) -> list[dict[str, Any]]:
    return [
        s
        for s in statements("launcher-policy.json")
        if s["Effect"] == "Allow" and action in listed(s["Action"])
    ]


class Recorder:
    """Every EC2 operation the launcher sends to moto, with its API parameters (botocore hook)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def client(self, region: str) -> Any:
        ec2 = aws_clouds.client("ec2", region or None, attempts=1)

        def record(model: Any, params: dict[str, Any], **kwargs: Any) -> None:
            self.calls.append((model.name, copy.deepcopy(params)))  # botocore edits it later

        ec2.meta.events.register(  # once: the client is shared
            "provide-client-params.ec2", record, unique_id=f"record-{id(self)}"
        )
        return ec2


def test_aws_policy_covers_every_call_of_a_job(aws_env: str) -> None:
    iam = aws_clouds.client("iam", attempts=1)
    trust = (INFRA / "aws" / "launcher-instance-role-trust.json").read_text()
    iam.create_role(RoleName="costguard-instance-alice", AssumeRolePolicyDocument=trust)
    iam.create_instance_profile(InstanceProfileName="costguard-instance-alice")
    iam.add_role_to_instance_profile(
        InstanceProfileName="costguard-instance-alice", RoleName="costguard-instance-alice"
    )
    recorder = Recorder()
    launcher = AwsLauncher(regions=["us-east-1"], clients=recorder.client)
    spec = LaunchSpec(
        "run-1", "s3://my-checkpoints/costguard/alice/run-1", ("python", "train.py"), "alice",
        datetime(2026, 12, 2, tzinfo=UTC),
        options={"image": "ami-12345678", "instance_profile": "costguard-instance-alice",
                 "disk_gb": "200"},
    )  # fmt: skip
    offer = Offer("aws", "us-east-1", "g5.xlarge", Market.SPOT, Decimal("0.4"), "A10G", 1)
    # The whole life of a job: launch, watch, attach (find), terminate twice, a lost id.
    launcher.check(spec)
    assert recorder.calls == []  # check() is offline
    launcher.zones("us-east-1", "g5.xlarge")
    request = launcher.request(offer, spec, 1)
    handle = launcher.launch(offer, spec, 1)
    launcher.status(handle)
    launcher.find("run-1")
    launcher.terminate(handle)
    launcher.terminate(handle)
    launcher.status(Handle("aws", "us-east-1", "i-0123456789abcdef0"))
    operations = {name for name, _ in recorder.calls}
    assert operations == {
        "DescribeAvailabilityZones",
        "DescribeInstanceTypeOfferings",
        "RunInstances",
        "DescribeInstances",
        "TerminateInstances",
    }
    for operation in operations:
        assert allows(f"ec2:{operation}"), operation
    # Tags given at launch need CreateTags, allowed only as part of the creating call.
    (create_tags,) = [s for s in allows("ec2:CreateTags") if "ec2:CreateAction" in str(s)]
    assert "RunInstances" in create_tags["Condition"]["StringEquals"]["ec2:CreateAction"]

    # RunInstances on the instance and its volumes is allowed only with the job tag, and
    # denied without IMDSv2: the launcher's own request meets both conditions.
    (run,) = [params for name, params in recorder.calls if name == "RunInstances"]
    assert run == request
    tagged = {t["ResourceType"]: {x["Key"]: x["Value"] for x in t["Tags"]}
              for t in run["TagSpecifications"]}  # fmt: skip
    (scoped,) = [s for s in allows("ec2:RunInstances") if "Condition" in s]
    (needed,) = scoped["Condition"]["StringLike"].values()
    for resource in ("instance", "volume"):
        assert any(f":{resource}/*" in r for r in listed(scoped["Resource"]))
        assert fnmatchcase(tagged[resource][JOB_TAG], needed.replace("?", "[!/]"))
    (deny,) = [s for s in statements("launcher-policy.json") if s["Effect"] == "Deny"]
    assert deny["Condition"]["StringNotEquals"]["ec2:MetadataHttpTokens"] == "required"
    assert run["MetadataOptions"]["HttpTokens"] == "required"

    # Terminate only what carries the job tag; the launched instance carries it.
    (terminate,) = allows("ec2:TerminateInstances")
    assert set(terminate["Condition"]["StringLike"]) == {f"aws:ResourceTag/{JOB_TAG}"}

    # PassRole: the instance role only, to EC2 only; it is the role of the profile used.
    (pass_role,) = allows("iam:PassRole")
    # Each owner passes only the role of their own prefix (issue 28): costguard-instance-<owner>.
    role = f"role/costguard-instance-{spec.owner}"
    pass_to = "arn:aws:iam::111122223333:" + role
    to_ec2 = {"iam:PassedToService": "ec2.amazonaws.com", **ALICE}
    assert launcher_allows("iam:PassRole", pass_to, to_ec2)
    assert not launcher_allows("iam:PassRole", pass_to.replace("alice", "bob"), to_ec2)
    assert not launcher_allows("iam:PassRole", pass_to, {**to_ec2, **BOB})
    assert pass_role["Condition"]["StringEquals"]["iam:PassedToService"] == "ec2.amazonaws.com"
    profile = iam.get_instance_profile(InstanceProfileName="costguard-instance-alice")
    assert [r["RoleName"] for r in profile["InstanceProfile"]["Roles"]] == [role.split("/")[1]]


def test_aws_policy_scopes_everything_but_describe() -> None:
    for statement in statements("launcher-policy.json"):
        for action in listed(statement["Action"]):
            assert action.startswith(("ec2:", "iam:PassRole", "s3:")), action
            if action.startswith("s3:"):  # the job's own objects: the checkpoint prefix
                assert all(r.startswith("arn:aws:s3:::my-checkpoints")
                           for r in listed(statement["Resource"])), action  # fmt: skip
            elif action.startswith("ec2:Describe"):  # EC2 offers no resource scope for these
                assert statement["Resource"] == "*"
            else:
                assert "*" not in listed(statement["Resource"]), action


def test_instance_role_reaches_only_the_checkpoint_prefix() -> None:
    trust = statements("launcher-instance-role-trust.json")
    assert [s["Principal"] for s in trust] == [{"Service": "ec2.amazonaws.com"}]
    for statement in statements("launcher-instance-role-policy.json"):
        assert all(a.startswith("s3:") for a in listed(statement["Action"]))
        if statement["Effect"] == "Deny":  # the job document: tests/test_iam_policies.py
            assert (
                statement["Resource"]
                == "arn:aws:s3:::my-checkpoints/costguard/OWNER/*/job/job.json"
            )
            continue
        assert statement["Effect"] == "Allow"
        for resource in listed(statement["Resource"]):
            if resource.endswith("/*"):  # one owner's prefix, never every job's (issue 28)
                assert resource == "arn:aws:s3:::my-checkpoints/costguard/OWNER/*"
            elif statement["Action"] == "s3:ListBucketMultipartUploads":
                # The stale-upload sweep, granted on the bucket without a prefix condition:
                # the code lists with the prefix and aborts only what lies under it.
                assert resource == "arn:aws:s3:::my-checkpoints"
            else:  # the bucket itself: listing, within the prefix only
                assert resource == "arn:aws:s3:::my-checkpoints"
                prefixes = statement["Condition"]["StringLike"]["s3:prefix"]
                assert all(p.startswith("costguard/OWNER/") for p in prefixes)


def gcp_permissions(*names: str) -> list[str]:
    """The permissions of the launcher's GCP roles (both, unless ``names`` says which)."""
    found = []
    for name in names or ("launcher-role.yaml", "launcher-instances-role.yaml"):
        role = (INFRA / "gcp" / name).read_text()
        found += re.findall(r"^\s+- ([a-zA-Z.]+)$", role, flags=re.MULTILINE)
    return found


def test_gcp_changes_only_vms_named_by_costguard() -> None:
    """Creating, deleting and setting metadata are granted under a name condition only; the
    project-wide role reads and uses, and the condition's prefix is the one costguard gives."""
    from costguard.spot.bootstrap import resource_name

    project_wide = gcp_permissions("launcher-role.yaml")
    scoped = gcp_permissions("launcher-instances-role.yaml")
    changing = {"compute.instances.create", "compute.instances.delete",
                "compute.instances.setMetadata", "compute.instances.setLabels"}  # fmt: skip
    assert changing <= set(scoped)
    assert not changing & set(project_wide)
    # A gang's firewall rule needs compute.networks.updatePolicy on its network (not
    # nameable by the condition), which changes nothing without firewalls.create/delete.
    assert all(p.endswith((".get", ".list", ".use", ".useExternalIp", ".useReadOnly"))
               for p in project_wide if p != "compute.networks.updatePolicy")  # fmt: skip
    assert {"compute.firewalls.create", "compute.firewalls.delete"} <= set(scoped)
    condition = (INFRA / "gcp" / "launcher-instances-condition.yaml").read_text()
    prefixes = re.findall(
        r'extract\("/(instances|disks|firewalls|resourcePolicies)/\{name\}"\)\.startsWith\("([^"]+)"\)',
        condition,
    )
    assert {kind for kind, _ in prefixes} == {"instances", "disks", "firewalls", "resourcePolicies"}
    # Bound per owner (issue 28: a bare "costguard-" let any launcher user delete another's
    # VMs): alice's binding reaches the VMs of alice's jobs, never bob's or alice2's.
    from costguard.spot.prepare import owner_word

    def vm_name(owner: str) -> str:
        return resource_name(f"cg-{owner_word(owner)}-20261202-201512-a1b2c3", 7, 63)

    for _, prefix in prefixes:
        assert "OWNER" in prefix
        alices = prefix.replace("OWNER", owner_word("Alice"))
        assert vm_name("alice").startswith(alices)
        assert not any(vm_name(other).startswith(alices) for other in ("bob", "alice2", "al"))
    readme = (INFRA / "README.md").read_text()
    assert "launcher-instances-role.yaml" in readme
    assert "launcher-instances-condition.yaml" in readme


def test_gcp_role_is_compute_only() -> None:
    permissions = gcp_permissions()
    assert "compute.instances.create" in permissions
    assert all(p.startswith("compute.") for p in permissions)
    assert len(permissions) == len(set(permissions))


def test_azure_role_is_compute_network_and_identity_only() -> None:
    role = json.loads((INFRA / "azure" / "launcher-role.json").read_text())
    assert role["IsCustom"] is True
    assert role["DataActions"] == []
    assert "Microsoft.Compute/virtualMachines/write" in role["Actions"]
    assert all(
        a.startswith(("Microsoft.Compute/", "Microsoft.Network/", "Microsoft.ManagedIdentity/"))
        for a in role["Actions"]
    )
    assert all("*" not in a for a in role["Actions"])
    assert all("/resourceGroups/" in s for s in role["AssignableScopes"])


def gcp_permission(method: str, path: str) -> str:
    """The permission a Compute Engine REST call needs (its documented IAM permission)."""
    verb = {"POST": "create", "GET": "get", "DELETE": "delete"}[method]
    if "/global/operations/" in path:
        return "compute.globalOperations.get"
    if "/regions/" in path and "/operations/" in path:
        return "compute.regionOperations.get"
    if path.endswith("/aggregated/resourcePolicies"):
        return "compute.resourcePolicies.list"
    if "/resourcePolicies" in path:
        return f"compute.resourcePolicies.{verb}"
    if "/global/firewalls" in path:
        return f"compute.firewalls.{verb}"
    if path.endswith("/setMetadata"):
        return "compute.instances.setMetadata"
    if method == "GET" and "/regions/" in path and "/zones/" not in path:
        return "compute.regions.get"
    if path.endswith("/aggregated/instances") or (method == "GET" and path.endswith("/instances")):
        return "compute.instances.list"
    if "/operations" in path:
        return "compute.zoneOperations.get" if "/operations/" in path else (
            "compute.zoneOperations.list")  # fmt: skip
    return f"compute.instances.{verb}"


def gcp_calls(run: Any) -> list[tuple[str, str, Any]]:
    """The Compute Engine calls ``run(launcher)`` makes, against a fresh fake."""
    from google.auth.credentials import AnonymousCredentials

    from costguard.settings import Settings
    from costguard.spot.launcher.gcp import GcpLauncher
    from tests.servers.gcp import ComputeServer

    server = ComputeServer()
    try:
        server.reset()
        launcher = GcpLauncher(
            Settings(gcp_endpoint=server.url),
            project="lab-project",
            credentials=AnonymousCredentials(),
            poll_interval_s=0.01,
        )
        run(launcher, server)
        return [(r.method, r.path, r.body) for r in server.requests]
    finally:
        server.stop()


def test_gcp_role_covers_every_call_of_a_job() -> None:
    from tests.spot.test_gcp_launcher import offer
    from tests.spot.test_gcp_launcher import spec as gcp_spec

    def job(launcher: Any, server: Any) -> None:
        assert launcher.zones("us-central1")
        handle = launcher.launch(offer(), gcp_spec(), attempt=1)
        launcher.status(handle)
        launcher.find("run-1")
        server.preempt(handle.instance_id)
        launcher.status(handle)
        launcher.terminate(handle)

    calls = gcp_calls(job)
    permissions = set(gcp_permissions())
    needed = {gcp_permission(method, path) for method, path, _ in calls}
    assert needed == {
        "compute.instances.create", "compute.instances.get", "compute.instances.list",
        "compute.instances.delete", "compute.zoneOperations.get", "compute.zoneOperations.list",
        "compute.regions.get",
    }  # fmt: skip
    assert needed <= permissions
    # Creating a VM with these fields needs these permissions too (Compute Engine IAM docs).
    (body,) = [b for method, path, b in calls if method == "POST"]
    implied = {
        "labels": "compute.instances.setLabels",
        "metadata": "compute.instances.setMetadata",
        "serviceAccounts": "compute.instances.setServiceAccount",
        "disks": "compute.disks.create",
    }
    for field, permission in implied.items():
        assert body.get(field), field
        assert permission in permissions, permission
    assert body["disks"][0]["initializeParams"]["sourceImage"]
    assert "compute.images.useReadOnly" in permissions
    (nic,) = body["networkInterfaces"]
    assert nic["network"] == "global/networks/default"
    assert {"compute.networks.use", "compute.subnetworks.use"} <= permissions
    if nic.get("accessConfigs"):
        assert "compute.networks.useExternalIp" in permissions
        assert "compute.subnetworks.useExternalIp" in permissions


def test_gcp_role_covers_every_call_of_a_gang() -> None:
    from tests.spot.test_gcp_gang import gang, offer

    def job(launcher: Any, server: Any) -> None:
        for handle in launcher.launch_gang(offer(), gang(placement="compact"), attempt=1):
            launcher.terminate(handle)
        launcher.release(gang())

    calls = gcp_calls(job)
    permissions = set(gcp_permissions())
    needed = {gcp_permission(method, path) for method, path, _ in calls}
    assert needed == {
        "compute.instances.create", "compute.instances.get", "compute.instances.delete",
        "compute.instances.setMetadata", "compute.zoneOperations.get",
        "compute.firewalls.create", "compute.firewalls.get", "compute.firewalls.delete",
        "compute.globalOperations.get", "compute.resourcePolicies.create",
        "compute.resourcePolicies.list", "compute.resourcePolicies.delete",
        "compute.regionOperations.get",
    }  # fmt: skip
    assert needed <= permissions
    # VMs created under a placement policy use it.
    assert "compute.resourcePolicies.use" in permissions
    # A rule on a network needs its updatePolicy; VMs created with network tags, setTags.
    (rule,) = [b for m, p, b in calls if m == "POST" and p.endswith("/global/firewalls")]
    assert rule["network"]
    assert "compute.networks.updatePolicy" in permissions
    (bulk,) = [b for m, p, b in calls if p.endswith("/instances/bulkInsert")]
    assert bulk["instanceProperties"]["tags"]["items"]
    assert "compute.instances.setTags" in permissions


def azure_action(method: str, path: str) -> str:
    """The RBAC action an ARM call of the launcher needs."""
    if "/locations/" in path and "/operations/" in path:
        return "Microsoft.Compute/locations/operations/read"
    if path.endswith("/providers/Microsoft.Compute/skus"):
        return "Microsoft.Compute/skus/read"
    verbs = {"PUT": "write", "PATCH": "write", "GET": "read", "DELETE": "delete"}
    network = re.search(r"/Microsoft\.Network/(\w+)", path)
    if network:
        return f"Microsoft.Network/{network[1]}/{verbs[method]}"
    if "/proximityPlacementGroups" in path:
        return f"Microsoft.Compute/proximityPlacementGroups/{verbs[method]}"
    return f"Microsoft.Compute/virtualMachines/{verbs[method]}"


def test_azure_role_covers_every_call_of_a_gang() -> None:
    from costguard.settings import Settings
    from costguard.spot.launcher.azure import AzureLauncher
    from tests.servers.azure import GROUP, SUBSCRIPTION, ArmServer
    from tests.servers.http import FakeTokenCredential, azure_client_options
    from tests.spot.test_azure_gang import gang, offer

    server = ArmServer()
    try:
        server.reset()
        launcher = AzureLauncher(
            Settings(azure_endpoint=server.url),
            subscription_id=SUBSCRIPTION,
            resource_group=GROUP,
            credential=FakeTokenCredential(),
            client_options=azure_client_options(),
        )
        for handle in launcher.launch_gang(offer(), gang(), attempt=1):
            launcher.terminate(handle)
        launcher.release(gang())
        calls = [(r.method, r.path) for r in server.requests]
    finally:
        server.stop()
    role = json.loads((INFRA / "azure" / "launcher-role.json").read_text())
    needed = {azure_action(method, path) for method, path in calls}
    assert {
        "Microsoft.Compute/proximityPlacementGroups/write",
        "Microsoft.Compute/proximityPlacementGroups/read",
        "Microsoft.Compute/proximityPlacementGroups/delete",
        "Microsoft.Network/networkInterfaces/read",
        "Microsoft.Network/networkSecurityGroups/write",
        "Microsoft.Network/applicationSecurityGroups/write",
        "Microsoft.Network/networkSecurityGroups/delete",
        "Microsoft.Compute/virtualMachines/write",
    } <= needed
    assert needed <= set(role["Actions"])
    # The NICs declared inline join the job's groups (what the PUT body references).
    assert {
        "Microsoft.Network/networkSecurityGroups/join/action",
        "Microsoft.Network/applicationSecurityGroups/joinIpConfiguration/action",
    } <= set(role["Actions"])


def test_azure_role_covers_every_call_of_a_job() -> None:
    from costguard.settings import Settings
    from costguard.spot.launcher.azure import AzureLauncher
    from tests.servers.azure import SUBSCRIPTION, ArmServer
    from tests.servers.http import FakeTokenCredential, azure_client_options
    from tests.spot.test_azure_launcher import GROUP, offer
    from tests.spot.test_azure_launcher import spec as azure_spec

    server = ArmServer()
    try:
        server.reset()
        launcher = AzureLauncher(Settings(azure_endpoint=server.url),
                                 subscription_id=SUBSCRIPTION, resource_group=GROUP,
                                 credential=FakeTokenCredential(),
                                 client_options=azure_client_options())  # fmt: skip
        assert launcher.zones("eastus", "Standard_NC4as_T4_v3")
        handle = launcher.launch(offer(), azure_spec(), attempt=1)
        launcher.status(handle)
        launcher.find("run-1")
        launcher.terminate(handle)
        calls = [(r.method, r.path, r.body) for r in server.requests]
    finally:
        server.stop()
    role = json.loads((INFRA / "azure" / "launcher-role.json").read_text())
    actions = set(role["Actions"])
    needed = {azure_action(method, path) for method, path, _ in calls}
    assert needed == {
        "Microsoft.Compute/virtualMachines/write", "Microsoft.Compute/virtualMachines/read",
        "Microsoft.Compute/virtualMachines/delete", "Microsoft.Compute/locations/operations/read",
        "Microsoft.Compute/skus/read",
    }  # fmt: skip
    assert needed <= actions
    # What the PUT body creates or joins besides the VM.
    (body,) = [b for method, _, b in calls if method == "PUT"]
    properties = body["properties"]
    (nic,) = properties["networkProfile"]["networkInterfaceConfigurations"]
    assert nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"]
    assert {
        "Microsoft.Network/networkInterfaces/write",
        "Microsoft.Network/networkInterfaces/join/action",
        "Microsoft.Network/virtualNetworks/subnets/join/action",
        "Microsoft.Network/networkInterfaces/delete",  # deleteOption Delete
    } <= actions
    assert properties["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    assert {"Microsoft.Compute/disks/write", "Microsoft.Compute/disks/delete"} <= actions
    assert body["identity"]["type"] == "UserAssigned"
    assert "Microsoft.ManagedIdentity/userAssignedIdentities/assign/action" in actions


ALICE = {"aws:PrincipalTag/costguard-owner": "alice"}
BOB = {"aws:PrincipalTag/costguard-owner": "bob"}


def launcher_allows(action: str, resource: str, context: dict[str, Any]) -> bool:
    """Whether launcher-policy.json allows ``action`` on a ``resource`` ARN in ``context``
    (condition keys to values; ``${aws:PrincipalTag/...}`` variables are read from it too,
    and a variable the context lacks matches nothing, as IAM evaluates it)."""
    from tests.reaper.test_infra import condition_holds

    def resolved(wanted: str | list[str]) -> list[str]:
        values = []
        for text in listed(wanted):
            names = re.findall(r"\$\{([^}]+)\}", text)
            if all(name in context for name in names):
                for name in names:
                    text = text.replace(f"${{{name}}}", str(context[name]))
                values.append(text)
        return values

    def holds(statement: dict[str, Any]) -> bool:
        patterns = resolved(statement["Resource"])
        return any(fnmatchcase(resource, r) for r in patterns) and all(
            condition_holds(operator, key, resolved(wanted), context)
            for operator, pairs in statement.get("Condition", {}).items()
            for key, wanted in pairs.items()
        )

    chosen = [s for s in statements("launcher-policy.json") if action in listed(s["Action"])]
    denied = any(holds(s) for s in chosen if s["Effect"] == "Deny")
    return not denied and any(holds(s) for s in chosen if s["Effect"] == "Allow")


def test_aws_policy_launches_and_terminates_only_as_its_owner() -> None:
    # Issue 28: TerminateInstances was allowed on any instance with a costguard:job tag,
    # so any launcher user could terminate another's job (or a forged job.json made the
    # controller do it). The owner tag must be the caller's, at launch and at terminate.
    spec = LaunchSpec("run-1", "s3://my-checkpoints/costguard/run-1", ("python", "t.py"),
                      "alice", datetime(2026, 12, 2, tzinfo=UTC))  # fmt: skip
    tags = spec.tags(1)
    assert tags[OWNER_TAG] == "alice"
    instance = "arn:aws:ec2:us-east-1:111122223333:instance/i-0123456789abcdef0"
    volume = "arn:aws:ec2:us-east-1:111122223333:volume/vol-0123456789abcdef0"
    alice = ALICE
    mine = {f"aws:ResourceTag/{k}": v for k, v in tags.items()}
    theirs = {**mine, f"aws:ResourceTag/{OWNER_TAG}": "bob"}
    assert launcher_allows("ec2:TerminateInstances", instance, {**alice, **mine})
    assert not launcher_allows("ec2:TerminateInstances", instance, {**alice, **theirs})
    assert not launcher_allows("ec2:TerminateInstances", instance, mine)  # no principal tag
    untagged = {k: v for k, v in mine.items() if not k.endswith(OWNER_TAG)}
    assert not launcher_allows("ec2:TerminateInstances", instance, {**alice, **untagged})
    request = {f"aws:RequestTag/{k}": v for k, v in tags.items()}
    imds = {"ec2:MetadataHttpTokens": "required"}
    for resource in (instance, volume):
        assert launcher_allows("ec2:RunInstances", resource, {**alice, **request, **imds})
        forged = {**alice, **request, **imds, f"aws:RequestTag/{OWNER_TAG}": "bob"}
        assert not launcher_allows("ec2:RunInstances", resource, forged)
    readme = (INFRA / "README.md").read_text()
    assert "costguard-owner" in readme


def test_aws_policy_covers_every_call_of_a_gang_and_only_its_owners(ec2_faults: Any) -> None:
    """A gang's fleet, security group, launch template, placement group and node tags:
    every call allowed, and each only on what carries the caller's owner tag."""
    from tests.servers.aws import launch_account
    from tests.spot.test_aws_gang import gang
    from tests.spot.test_aws_gang import offer as gang_offer

    launch_account()
    recorder = Recorder()
    launcher = AwsLauncher(regions=["us-east-1"], clients=recorder.client)
    spec = gang(placement="cluster")
    for handle in launcher.launch_gang(gang_offer(), spec, attempt=1):
        launcher.terminate(handle)
    launcher.release(spec)
    operations = {name for name, _ in recorder.calls}
    assert {"CreateFleet", "CreateLaunchTemplate", "CreateSecurityGroup", "CreatePlacementGroup",
            "AuthorizeSecurityGroupIngress", "CreateTags", "DeleteSecurityGroup",
            "DeleteLaunchTemplate", "DeletePlacementGroup"} <= operations  # fmt: skip
    for operation in operations:
        assert allows(f"ec2:{operation}"), operation
    arn = "arn:aws:ec2:us-east-1:111122223333"
    mine = {f"aws:ResourceTag/{k}": v for k, v in spec.tags(1).items()}
    theirs = {**mine, f"aws:ResourceTag/{OWNER_TAG}": "bob"}
    signed = replace(spec, job_key="00" * 32)  # a launch's spec: its nodes' values signed
    told = {"aws:TagKeys": sorted(node.signed(signed, 1, "i-0123", 1, "10.0.0.5"))}
    assert "costguard:node-proof" in told["aws:TagKeys"]
    instance = f"{arn}:instance/i-0123456789abcdef0"
    assert launcher_allows("ec2:CreateTags", instance, {**ALICE, **mine, **told})
    assert not launcher_allows("ec2:CreateTags", instance, {**ALICE, **theirs, **told})
    keep = {"aws:TagKeys": ["costguard:keep"]}  # never another tag after the launch
    assert not launcher_allows("ec2:CreateTags", instance, {**ALICE, **mine, **keep})
    for action, resource in (
        ("ec2:DeleteSecurityGroup", f"{arn}:security-group/sg-0123456789abcdef0"),
        ("ec2:AuthorizeSecurityGroupIngress", f"{arn}:security-group/sg-0123456789abcdef0"),
        ("ec2:DeleteLaunchTemplate", f"{arn}:launch-template/lt-0123456789abcdef0"),
        ("ec2:DeletePlacementGroup", f"{arn}:placement-group/costguard-cg-alice-gang-1"),
    ):
        assert launcher_allows(action, resource, {**ALICE, **mine}), action
        assert not launcher_allows(action, resource, {**ALICE, **theirs}), action
    request = {f"aws:RequestTag/{k}": v for k, v in spec.tags(1).items()}
    forged = {**request, f"aws:RequestTag/{OWNER_TAG}": "bob"}
    for resource in (f"{arn}:fleet/fleet-0123", instance):
        assert launcher_allows("ec2:CreateFleet", resource, {**ALICE, **request})
        assert not launcher_allows("ec2:CreateFleet", resource, {**ALICE, **forged})
    group = f"{arn}:security-group/sg-0123456789abcdef0"
    assert launcher_allows("ec2:CreateSecurityGroup", group, {**ALICE, **request})
    assert not launcher_allows("ec2:CreateSecurityGroup", group, {**ALICE, **forged})
