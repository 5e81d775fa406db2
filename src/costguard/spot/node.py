"""What one node of a gang (``costguard launch --nodes``) learns of itself before it
starts ``torchrun``: its node rank, and where the gang meets (node 0's private address and
the rendezvous port).

The controller writes both once the whole gang is up (all or none), where only the
cloud's API can write: the instance's own tags on AWS (``costguard:node-rank``,
``costguard:rendezvous``, read through IMDSv2 with ``InstanceMetadataTags`` enabled), its
metadata on GCP (``costguard-node-rank``, ``costguard-rendezvous``, set with
``instances.setMetadata``), its tags on Azure (IMDS ``compute/tagsList``). Never the
checkpoint store: whoever may write there (docs/threat-model.md) could otherwise send the
gang's collectives to an address of their choosing.

What the service answers is checked before it is used: a rank within the gang, a private
IPv4 address (:data:`PRIVATE_NETWORKS`) and a port from 1024 to 65535; node 0 accepts only its own
private address (it hosts the rendezvous). The wait is bounded (:data:`WAIT_S`).

And it is proven, not only well formed: the controller signs what it tells each node
(``costguard:node-proof``: :func:`costguard.proof.told_proof`, an Ed25519 signature of the
job, the attempt, the node's own instance, its rank and the rendezvous, with a key derived
from this user's job key for that attempt), and the boot script gives the node the public
half (``--told-key``). The node reads its instance's id or name from the same service
(set by the cloud: AWS ``instance-id``, GCP ``instance/name``, Azure ``compute/name``) and
acts only on values whose signature holds for it: whoever may write an instance's tags or
metadata (``ec2:CreateTags``, ``setMetadata``) but does not hold the user's key cannot
point a gang elsewhere, give two nodes one rank, or copy one node's values onto another
instance or a later attempt. Unsigned or forged values are waited past (the controller's
own may come after them), then refused when the wait ends.

The boot script (``infra/bootstrap/user-data.sh``) runs ``python -m costguard.spot.node
--cloud aws --nodes 2 --told-key KEY`` and reads ``RANK ADDRESS:PORT`` from its one line
of output.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from costguard.checkpoint import notices
from costguard.checkpoint.notices.aws import AwsMetadata
from costguard.contract import ENV_JOB_ATTEMPT, ENV_JOB_ID
from costguard.errors import CostguardError
from costguard.spot.bootstrap import RDZV_PORT
from costguard.spot.launcher.base import LaunchSpec
from costguard.tags import NODE_PROOF_TAG, NODE_RANK_TAG, RENDEZVOUS_TAG, gcp_label

#: How long a node waits for the controller to tell it its rank (it does so seconds
#: after the fleet answers; a node boots and installs for minutes before it asks).
WAIT_S = 600.0
#: The pause between two reads of the metadata service.
POLL_S = 2.0
#: Azure's instance metadata API version (``compute/tagsList`` and the interface).
AZURE_API_VERSION = "2021-02-01"


#: Where a gang's nodes live: the private ranges of RFC 1918 and the shared address space
#: of RFC 6598 (VPC secondary ranges). Not :attr:`ipaddress.IPv4Address.is_private`, which
#: also counts the documentation networks (``203.0.113.0/24``...) and loopback.
PRIVATE_NETWORKS = tuple(
    ipaddress.IPv4Network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
)


def private_ipv4(text: object) -> str | None:
    """``text`` as a private IPv4 address (:data:`PRIVATE_NETWORKS`), else ``None``.

    >>> private_ipv4("10.1.2.3"), private_ipv4("203.0.113.7"), private_ipv4("localhost")
    ('10.1.2.3', None, None)
    """
    try:
        address = ipaddress.IPv4Address(str(text))
    except ValueError:
        return None
    return str(address) if any(address in net for net in PRIVATE_NETWORKS) else None


def told(rank: int, address: str) -> dict[str, str]:
    """What the controller writes on node ``rank`` once its whole gang is up, where only
    the cloud's API writes (tags, metadata): its rank, and the rendezvous at node 0's
    private ``address``; what :func:`wait` reads back on the node.

    >>> told(1, "10.0.0.5")
    {'costguard:node-rank': '1', 'costguard:rendezvous': '10.0.0.5:29500'}
    """
    return {NODE_RANK_TAG: str(rank), RENDEZVOUS_TAG: f"{address}:{RDZV_PORT}"}


def signed(
    spec: LaunchSpec, attempt: int, instance: str, rank: int, address: str
) -> dict[str, str]:
    """:func:`told`, for node ``rank`` on instance ``instance`` of attempt ``attempt`` of
    ``spec``, with the controller's signature of it (``costguard:node-proof``:
    :func:`costguard.proof.told_proof`) when the spec carries its job's key: what the
    launchers write once the whole gang is up."""
    from costguard import proof

    values = told(rank, address)
    if spec.job_key:
        key = bytes.fromhex(spec.job_key)
        values[NODE_PROOF_TAG] = proof.told_proof(
            key, spec.job_id, attempt, instance, rank, values[RENDEZVOUS_TAG]
        )
    return values


def noted(told_values: Mapping[str, str], key: str = NODE_RANK_TAG) -> dict[str, str]:
    """A found instance's node rank for its handle (``{"node": R}``), from the values the
    controller told it (its tags; ``key``: the spelling there), when it holds one that is
    a small whole number; ``{}`` otherwise (a single instance, or a node not told yet).

    >>> noted({"costguard:node-rank": "1"}), noted({"costguard:node-rank": "-1"}), noted({})
    ({'node': '1'}, {}, {})
    """
    text = str(told_values.get(key, ""))
    return {"node": text} if text.isascii() and text.isdigit() and len(text) <= 6 else {}


@dataclass(frozen=True)
class Rendezvous:
    """A node's place in its gang."""

    rank: int
    address: str
    port: int

    def line(self) -> str:
        """What the boot script reads: ``RANK ADDRESS:PORT``."""
        return f"{self.rank} {self.address}:{self.port}"


def check(rank_text: str, rendezvous_text: str, nodes: int, own_address: str) -> Rendezvous:
    """The node's place from the values its metadata holds, or a :class:`CostguardError`
    saying what is wrong (the values are shown escaped and cut).

    >>> check("1", "10.0.0.5:29500", 2, "10.0.0.9").line()
    '1 10.0.0.5:29500'
    >>> check("0", "10.0.0.5:29500", 2, "10.0.0.9")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    costguard.errors.CostguardError: node 0 is told to meet at 10.0.0.5, which is not its own ...
    >>> check("2", "10.0.0.5:29500", 2, "10.0.0.9")
    Traceback (most recent call last):
    ...
    costguard.errors.CostguardError: the node rank '2' is not one of a gang of 2
    """
    rank_text, rendezvous_text = rank_text.strip(), rendezvous_text.strip()
    if not (rank_text.isascii() and rank_text.isdigit() and int(rank_text) < nodes):
        msg = f"the node rank {rank_text[:20]!r} is not one of a gang of {nodes}"
        raise CostguardError(msg, hint=_HINT)
    host, _, port_text = rendezvous_text.rpartition(":")
    address = private_ipv4(host)
    if address is None or not (
        port_text.isascii() and port_text.isdigit() and 1024 <= int(port_text) <= 65535
    ):
        msg = f"the rendezvous {rendezvous_text[:60]!r} is not a private IPv4 address and port"
        raise CostguardError(msg, hint=_HINT)
    rank = int(rank_text)
    if rank == 0 and address != own_address.strip():
        msg = (
            f"node 0 is told to meet at {address}, which is not its own address "
            f"{own_address.strip()[:40]}"
        )
        raise CostguardError(msg, hint=_HINT)
    return Rendezvous(rank, address, int(port_text))


_HINT = "only the controller writes it, after the whole gang is up: was it changed?"

#: ``(status, body)`` of a GET of a path below a cloud's metadata endpoint.
Get = Callable[[str], tuple[int, str]]


@dataclass(frozen=True)
class Told:
    """What a node's metadata holds (``None``: not there yet): its rank, the rendezvous,
    its own private address, the controller's signature of them, and its instance's id
    (AWS) or name (GCP, Azure)."""

    rank: str | None
    rendezvous: str | None
    own: str | None
    proof: str | None
    instance: str | None


class _Reader:
    """One cloud's metadata, as the values a node needs (:class:`Told`)."""

    def __init__(self, cloud: str, base: str) -> None:
        self.cloud = cloud
        self.base = base.rstrip("/")
        self._aws = AwsMetadata(self.base) if cloud == "aws" else None

    def _get(self, path: str, headers: Mapping[str, str]) -> tuple[int, str]:
        if self._aws is not None:
            return self._aws.get(path)
        return notices.fetch("GET", f"{self.base}{path}", headers)

    def read(self) -> Told:
        """What the service answers now."""
        if self.cloud == "azure":
            tail = f"?api-version={AZURE_API_VERSION}"
            headers = {"Metadata": "true"}
            status, body = self._get(f"/metadata/instance/compute/tagsList{tail}", headers)
            tags = _azure_tags(body) if status == 200 else {}
            own = self._value(
                "/metadata/instance/network/interface/0/ipv4/ipAddress/0/privateIpAddress"
                f"{tail}&format=text",
                headers,
            )
            name = self._value(f"/metadata/instance/compute/name{tail}&format=text", headers)
            return Told(tags.get(NODE_RANK_TAG), tags.get(RENDEZVOUS_TAG), own,
                        tags.get(NODE_PROOF_TAG), name)  # fmt: skip
        if self.cloud == "gcp":
            headers = {"Metadata-Flavor": "Google"}
            base = "/computeMetadata/v1/instance"
            return Told(
                self._value(f"{base}/attributes/{gcp_label(NODE_RANK_TAG)}", headers),
                self._value(f"{base}/attributes/{gcp_label(RENDEZVOUS_TAG)}", headers),
                self._value(f"{base}/network-interfaces/0/ip", headers),
                self._value(f"{base}/attributes/{gcp_label(NODE_PROOF_TAG)}", headers),
                self._value(f"{base}/name", headers),
            )
        return Told(
            self._value(f"tags/instance/{NODE_RANK_TAG}", {}),
            self._value(f"tags/instance/{RENDEZVOUS_TAG}", {}),
            self._value("local-ipv4", {}),
            self._value(f"tags/instance/{NODE_PROOF_TAG}", {}),
            self._value("instance-id", {}),
        )

    def _value(self, path: str, headers: Mapping[str, str]) -> str | None:
        status, body = self._get(path, headers)
        return body if status == 200 else None


def _azure_tags(body: str) -> dict[str, str]:
    """``compute/tagsList``: ``[{"name": ..., "value": ...}]`` as a dict (strings only)."""
    try:
        listed = json.loads(body)
    except ValueError:
        return {}
    if not isinstance(listed, list):
        return {}
    return {
        str(item["name"]): str(item["value"])
        for item in listed
        if isinstance(item, dict)
        and isinstance(item.get("name"), str)
        and isinstance(item.get("value"), str)
    }


def proven(place: Rendezvous, told: Told, key: str, job_id: str, attempt: int) -> bool:
    """Whether ``told`` carries this job's controller's signature of ``place`` for this
    node's own instance and attempt ``attempt`` (``key``: the public half the boot script
    gave; :func:`costguard.proof.told_holds`)."""
    from costguard import proof

    if not told.proof or not told.instance:
        return False
    return proof.told_holds(
        key, told.proof.strip(), job_id, attempt, told.instance.strip(), place.rank,
        f"{place.address}:{place.port}",
    )  # fmt: skip


def wait(
    cloud: str,
    nodes: int,
    env: Mapping[str, str],
    *,
    told_key: str = "",
    wait_s: float = WAIT_S,
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Rendezvous:
    """This node's place in its gang of ``nodes``, read from ``cloud``'s metadata service
    (the endpoint ``env`` names, else the documented one) until the controller has written
    it, for at most ``wait_s`` seconds; checked by :func:`check` and, with ``told_key``
    (the boot script's), proven by :func:`proven` for the job and attempt of ``env``
    (``COSTGUARD_JOB_ID``, ``COSTGUARD_JOB_ATTEMPT``): values that are not are waited past."""
    if cloud not in notices.CLOUDS:
        msg = f"no metadata service for the cloud {cloud!r}"
        raise CostguardError(msg, hint=f"one of {', '.join(notices.CLOUDS)}")
    job_id, attempt_text = env.get(ENV_JOB_ID, ""), env.get(ENV_JOB_ATTEMPT, "")
    if told_key and not (job_id and attempt_text.isascii() and attempt_text.isdigit()):
        msg = f"{ENV_JOB_ID} and {ENV_JOB_ATTEMPT} are needed to prove what this node is told"
        raise CostguardError(msg, hint="the boot script exports both before it asks")
    reader = _Reader(cloud, notices.endpoint(cloud, env))
    deadline = clock() + wait_s
    seen = "nothing"
    while True:
        try:
            told = reader.read()
        except OSError as exc:
            seen = f"no answer ({exc})"
        else:
            if told.rank is not None and told.rendezvous is not None and told.own is not None:
                place = check(told.rank, told.rendezvous, nodes, told.own)
                if not told_key or proven(place, told, told_key, job_id, int(attempt_text)):
                    return place
                seen = (
                    "a rank and rendezvous not signed by this job's controller for this "
                    f"instance and attempt ({place.line()})"
                )
            else:
                seen = "no rank and rendezvous yet"
        if clock() + poll_s > deadline:
            msg = f"this node was not told its rank in {wait_s:.0f} s: {seen}"
            raise CostguardError(
                msg, hint="the controller tells every node once the whole gang is up"
            )
        sleep(poll_s)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m costguard.spot.node --cloud CLOUD --nodes N``: prints ``RANK
    ADDRESS:PORT``; exit 1 (with ``Error:`` and ``Hint:`` on stderr) when it cannot."""
    parser = argparse.ArgumentParser(
        prog="python -m costguard.spot.node",
        description="Wait for this gang node's rank and rendezvous (boot script use), "
        "e.g. python -m costguard.spot.node --cloud aws --nodes 2",
    )
    parser.add_argument("--cloud", required=True, choices=notices.CLOUDS)
    parser.add_argument("--nodes", required=True, type=int)
    parser.add_argument("--wait-s", type=float, default=WAIT_S)
    parser.add_argument(
        "--told-key", default="", help="the public key the controller signs the values with"
    )
    args = parser.parse_args(argv)
    try:
        place = wait(args.cloud, args.nodes, os.environ, told_key=args.told_key, wait_s=args.wait_s)
    except CostguardError as exc:
        print(f"Error: {exc.message}", file=sys.stderr)
        print(f"Hint: {exc.hint}", file=sys.stderr)
        return 1
    print(place.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
