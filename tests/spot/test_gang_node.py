"""A gang's node learns its rank and node 0's address from its own metadata service only
(``costguard.spot.node``), checked and within a bounded wait; the boot script starts
``torchrun`` with them under ``costguard run``. The metadata services are the loopback
fake of tests/helpers/metadata.py, speaking IMDSv2, GCP metadata and Azure IMDS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from costguard import proof
from costguard.checkpoint import notices
from costguard.errors import CostguardError
from costguard.spot import bootstrap, node
from costguard.spot.launcher.base import LaunchSpec
from costguard.tags import NODE_PROOF_TAG, NODE_RANK_TAG, RENDEZVOUS_TAG, gcp_label
from tests.helpers.clock import Clock
from tests.helpers.metadata import MetadataHandler, MetadataState, serving

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def state() -> MetadataState:
    return MetadataState(private_address="10.0.0.9")


@pytest.fixture
def url(state: MetadataState) -> Iterator[str]:
    with serving(MetadataHandler, state) as base:
        yield base


def tell(state: MetadataState, cloud: str, rank: str, rendezvous: str) -> None:
    """What the controller writes on the node after the whole gang is up."""
    tell_values(state, cloud, {NODE_RANK_TAG: rank, RENDEZVOUS_TAG: rendezvous})


def tell_values(state: MetadataState, cloud: str, values: dict[str, str]) -> None:
    """``values`` as the tags or metadata of ``cloud`` on this node (whoever writes them)."""
    if cloud == "aws":
        state.aws_tags.update(values)
    elif cloud == "gcp":
        state.gcp_attributes.update({gcp_label(k): v for k, v in values.items()})
    else:
        state.azure_tags.update(values)


def env_for(cloud: str, url: str) -> dict[str, str]:
    return {notices.ENDPOINT_ENV[cloud]: url}


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_node_reads_its_rank_and_rendezvous_from_its_own_metadata(
    state: MetadataState, url: str, cloud: str
) -> None:
    tell(state, cloud, "1", "10.0.0.5:29500")
    place = node.wait(cloud, 2, env_for(cloud, url), wait_s=5)
    assert place == node.Rendezvous(1, "10.0.0.5", 29500)
    if cloud == "aws":  # IMDSv2 only: a session token first, then reads with it
        assert state.requests[0] == "PUT /latest/api/token"


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_node_waits_until_the_controller_has_told_it(
    state: MetadataState, url: str, cloud: str
) -> None:
    tell(state, cloud, "0", "10.0.0.9:29500")
    state.hidden_reads = 5
    clock = Clock()
    place = node.wait(cloud, 3, env_for(cloud, url), poll_s=1, clock=clock, sleep=clock.sleep)
    assert place.line() == "0 10.0.0.9:29500"
    assert clock.now >= 1  # it waited, and asked again


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_node_never_told_gives_up_within_its_bound(url: str, cloud: str) -> None:
    clock = Clock()
    with pytest.raises(CostguardError, match="was not told its rank in 30 s"):
        node.wait(cloud, 2, env_for(cloud, url), wait_s=30, poll_s=2, clock=clock,
                  sleep=clock.sleep)  # fmt: skip
    assert 28 <= clock.now <= 30


@pytest.mark.parametrize(
    ("rank", "rendezvous", "why"),
    [
        ("2", "10.0.0.5:29500", "is not one of a gang of 2"),
        ("-1", "10.0.0.5:29500", "is not one of a gang of 2"),
        ("1", "8.8.8.8:29500", "not a private IPv4 address"),
        ("1", "127.0.0.1:29500", "not a private IPv4 address"),
        ("1", "evil.example.com:29500", "not a private IPv4 address"),
        ("1", "10.0.0.5:22", "not a private IPv4 address and port"),
        ("1", "10.0.0.5:29500 --rdzv-conf x", "not a private IPv4 address"),
        ("0", "10.0.0.5:29500", "not its own address"),
    ],
)
def test_values_the_controller_did_not_write_are_refused(
    state: MetadataState, url: str, rank: str, rendezvous: str, why: str
) -> None:
    tell(state, "aws", rank, rendezvous)
    with pytest.raises(CostguardError, match=why):
        node.wait("aws", 2, env_for("aws", url), wait_s=5)


def gang_spec(procs: int | None) -> LaunchSpec:
    return LaunchSpec(
        job_id="run-1",
        checkpoint_url="s3://ckpt/costguard/run-1",
        command=("train.py", "--note", "it's $HOME"),
        owner="alice",
        expires_at=datetime(2026, 12, 2, tzinfo=UTC),
        nodes=2,
        procs_per_node=procs,
    )


def run_gang_part(
    text: str, tmp_path: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """The boot script from the gang block through the ``costguard run`` line, with the
    real ``python -m costguard.spot.node`` and a ``costguard`` that prints its argv."""
    part = text[text.index("NODES=") : text.index("\nstatus=$?")]
    exports = [line for line in text.splitlines() if line.startswith("export COSTGUARD_")]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    stub = bin_dir / "costguard"
    stub.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "print(json.dumps([os.environ.get('COSTGUARD_NODE_RANK'), *sys.argv[1:]]))\n"
    )
    stub.chmod(0o755)
    script = "\n".join(['fail() { echo "failed: $*"; exit 1; }', "RUN=()", *exports, part])
    full_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path),
                "PYTHONPATH": str(SRC), **env}  # fmt: skip
    return subprocess.run(["bash", "-c", script], env=full_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize(("procs", "per_node"), [(2, "2"), (None, "gpu")])
def test_the_boot_script_starts_torchrun_with_what_the_node_was_told(
    state: MetadataState, url: str, tmp_path: Path, procs: int | None, per_node: str
) -> None:
    tell(state, "aws", "1", "10.0.0.5:29500")
    text = bootstrap.render(gang_spec(procs), 3, "aws", environ={})
    done = run_gang_part(text, tmp_path, env_for("aws", url))
    assert done.returncode == 0, done.stderr
    node_rank, *argv = json.loads(done.stdout.splitlines()[-1])
    assert node_rank == "1"  # costguard run writes this node's own exit record
    assert argv == [
        "run", "--checkpoint", "s3://ckpt/costguard/run-1", "--cloud", "aws", "--",
        "torchrun", "--nnodes", "2", "--nproc-per-node", per_node, "--rdzv-backend", "c10d",
        "--node-rank", "1", "--rdzv-endpoint", "10.0.0.5:29500", "--rdzv-id", "run-1-3",
        "train.py", "--note", "it's $HOME",
    ]  # fmt: skip


def test_the_boot_script_of_a_node_told_a_forged_address_never_starts_the_job(
    state: MetadataState, url: str, tmp_path: Path
) -> None:
    tell(state, "aws", "1", "203.0.113.7:29500")
    text = bootstrap.render(gang_spec(2), 3, "aws", environ={})
    done = run_gang_part(text, tmp_path, {**env_for("aws", url)})
    assert done.returncode == 1
    assert "failed: this node was not told its rank and rendezvous" in done.stdout
    assert "not a private IPv4 address" in done.stderr
    assert '"run"' not in done.stdout  # costguard run was never started


def test_a_single_node_job_starts_no_torchrun_and_asks_no_metadata(
    state: MetadataState, url: str, tmp_path: Path
) -> None:
    spec = gang_spec(2)
    single = LaunchSpec(**{**spec.__dict__, "nodes": 1})
    text = bootstrap.render(single, 1, "aws", environ={})
    done = run_gang_part(text, tmp_path, env_for("aws", url))
    assert done.returncode == 0, done.stderr
    node_rank, *argv = json.loads(done.stdout.splitlines()[-1])
    assert node_rank is None
    assert argv[argv.index("--") + 1 :] == ["train.py", "--note", "it's $HOME"]
    assert state.requests == []


# -- proven, not only well formed: the controller's signature for this instance ----------

KEY = proof.job_key(b"this user's key, never in a bucket", "run-1").hex()
OTHER_KEY = proof.job_key(b"another user's key, say a labmate", "run-1").hex()
ATTEMPT = 3
#: This instance as each cloud's metadata names it (MetadataState's defaults).
INSTANCE = {"aws": "i-0123456789abcdef0", "gcp": "cg-test-1-a1-n0", "azure": "vm1"}


def signed_spec(key: str = KEY) -> LaunchSpec:
    return replace(gang_spec(2), job_key=key)


def told_env(cloud: str, url: str, attempt: int = ATTEMPT) -> dict[str, str]:
    return {**env_for(cloud, url), "COSTGUARD_JOB_ID": "run-1",
            "COSTGUARD_JOB_ATTEMPT": str(attempt)}  # fmt: skip


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_node_acts_on_what_its_controller_signed_for_this_instance(
    state: MetadataState, url: str, cloud: str
) -> None:
    spec = signed_spec()
    tell_values(state, cloud, node.signed(spec, ATTEMPT, INSTANCE[cloud], 1, "10.0.0.5"))
    place = node.wait(cloud, 2, told_env(cloud, url), told_key=spec.told_public(ATTEMPT),
                      wait_s=5)  # fmt: skip
    assert place == node.Rendezvous(1, "10.0.0.5", 29500)


def forgeries() -> list[tuple[str, dict[str, str]]]:
    """What someone who may write this instance's tags (or metadata), but holds no key of
    this user's, can put there: each well formed, none proven."""
    spec, other = signed_spec(), signed_spec(OTHER_KEY)
    genuine = node.signed(spec, ATTEMPT, INSTANCE["aws"], 1, "10.0.0.5")
    return [
        ("unsigned", {k: v for k, v in genuine.items() if k != NODE_PROOF_TAG}),
        ("another address", {**genuine, RENDEZVOUS_TAG: "10.9.9.9:29500"}),
        ("another port", {**genuine, RENDEZVOUS_TAG: "10.0.0.5:29501"}),
        ("another rank", {**genuine, NODE_RANK_TAG: "0", RENDEZVOUS_TAG: "10.0.0.9:29500"}),
        ("a sibling's values", node.signed(spec, ATTEMPT, "i-0fedcba9876543210", 1, "10.0.0.5")),
        ("an earlier attempt's", node.signed(spec, ATTEMPT - 1, INSTANCE["aws"], 1, "10.0.0.5")),
        ("another key's", node.signed(other, ATTEMPT, INSTANCE["aws"], 1, "10.9.9.9")),
        ("a proof that is none", {**genuine, NODE_PROOF_TAG: "x" * 86}),
        ("the public key as proof", {**genuine, NODE_PROOF_TAG: spec.told_public(ATTEMPT)}),
    ]


@pytest.mark.parametrize(("what", "values"), forgeries(), ids=[f[0] for f in forgeries()])
def test_values_not_signed_for_this_node_are_never_acted_on(
    state: MetadataState, url: str, what: str, values: dict[str, str]
) -> None:
    tell_values(state, "aws", values)
    clock = Clock()
    with pytest.raises(CostguardError, match="not signed by this job's controller"):
        node.wait("aws", 2, told_env("aws", url), told_key=signed_spec().told_public(ATTEMPT),
                  wait_s=10, poll_s=1, clock=clock, sleep=clock.sleep)  # fmt: skip
    assert clock.now >= 9  # waited the whole bound for the controller's own values


def test_the_controllers_values_written_after_a_forgery_are_taken(
    state: MetadataState, url: str
) -> None:
    """A forger who writes first delays a node, never misdirects it: it waits past
    values it cannot prove, and takes the controller's when they come."""
    spec = signed_spec()
    tell_values(state, "aws", forgeries()[1][1])  # node 0 moved to 10.9.9.9
    clock = Clock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 4:
            tell_values(state, "aws", node.signed(spec, ATTEMPT, INSTANCE["aws"], 1, "10.0.0.5"))

    place = node.wait("aws", 2, told_env("aws", url), told_key=spec.told_public(ATTEMPT),
                      wait_s=30, poll_s=1, clock=clock, sleep=sleep)  # fmt: skip
    assert place.line() == "1 10.0.0.5:29500"


def test_the_boot_script_gives_the_node_the_attempts_public_key_and_checks_with_it(
    state: MetadataState, url: str, tmp_path: Path
) -> None:
    """The boot script's node proves its values with the key and the job and attempt it
    was launched with (a wrong one of those would wait past them all)."""
    spec = signed_spec()
    text = bootstrap.render(spec, ATTEMPT, "aws", environ={})
    assert f"TOLD_KEY={spec.told_public(ATTEMPT)}" in text
    assert KEY not in text  # the job's key never leaves the controller
    tell_values(state, "aws", node.signed(spec, ATTEMPT, INSTANCE["aws"], 1, "10.0.0.5"))
    done = run_gang_part(text, tmp_path, env_for("aws", url))
    assert done.returncode == 0, done.stderr
    node_rank, *argv = json.loads(done.stdout.splitlines()[-1])
    assert node_rank == "1"
    assert "10.0.0.5:29500" in argv
    assert any(r.endswith("/tags/instance/costguard:node-proof") for r in state.requests)
