"""The preemption simulator behind ``costguard launch --provider local``.

Two parts: :func:`notice_time` decides (purely) when an attempt gets its preemption
notice, and :class:`MetadataEmulator` serves it on loopback in the documented shapes of
the cloud being simulated (the offer's region says which: ``aws:us-east-1``):

* AWS IMDSv2: ``PUT /latest/api/token``, then ``GET /latest/meta-data/spot/instance-action``
  answers 404 until a notice is due, then ``{"action": "terminate", "time": ...}``;
* GCP: ``GET /computeMetadata/v1/instance/preempted`` (``Metadata-Flavor: Google``)
  answers ``FALSE``, then ``TRUE`` (and ``instance/maintenance-event`` always ``NONE``);
* Azure: ``GET /metadata/scheduledevents`` (``Metadata: true``) lists a ``Preempt`` event
  with its ``NotBefore`` time for the VM ``costguard-local`` (the instance metadata's
  ``compute/name``); a ``POST`` of ``StartRequests`` acknowledges it.

``costguard run`` polls it through ``COSTGUARD_<CLOUD>_METADATA_URL`` with the same
watcher it uses on that cloud, so a local run exercises exactly the code path a spot
instance does; only the cloud is replaced. Each node of a gang (``launch --nodes``) has
its own instance metadata under ``/node-<rank>`` (node 0's is the root), so a notice
reaches the one node the provider takes back. The local launcher kills the process
(SIGKILL) at the notice's deadline if it is still running, like the provider would.

>>> sim = Simulation(every_s=60.0)
>>> notice_time(sim, attempt=1, launched_unix=1000.0, job_started_unix=1000.0)
1060.0
>>> notice_time(Simulation(at_s=(30.0, 90.0)), attempt=2, launched_unix=1040.0,
...             job_started_unix=1000.0)
1090.0
"""

from __future__ import annotations

import json
import random
import re
import secrets
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from costguard.errors import InputError


@dataclass(frozen=True)
class Simulation:
    """``--provider local``: when the simulator sends preemption notices.

    ``every_s``: each spot attempt gets a notice that many seconds after it starts
    (randomised around it, exponentially, with ``seed``). ``at_s``: notices at these
    seconds after the job started, each once. ``notice_s``: the deadline after a notice,
    after which the process is killed (SIGKILL); ``None``: the simulated cloud's own
    (AWS 120 s, GCP and Azure 30 s).
    """

    every_s: float | None = None
    at_s: tuple[float, ...] = ()
    seed: int | None = None
    notice_s: float | None = None
    metadata_port: int = 0
    state_dir: str = ""


#: The name the emulated Azure VM answers for ``compute/name``, and its events list.
VM_NAME = "costguard-local"
#: A request for a gang's node: ``/node-<rank>`` and the path asked for.
_NODE_PATH = re.compile(r"/node-([0-9]{1,4})(/.*)", re.ASCII)

#: How long each cloud gives between its notice and the end (reference/preemption_notices).
NOTICE_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
#: A notice never comes sooner than this after a launch: the process must have started.
MIN_LEAD_S = 1.0
#: Randomised intervals stay within these multiples of ``--preempt-every``.
RANDOM_RANGE = (0.2, 3.0)


def notice_time(
    sim: Simulation, *, attempt: int, launched_unix: float, job_started_unix: float
) -> float | None:
    """When attempt ``attempt`` (1-based) gets its notice, or ``None`` (it runs undisturbed).

    ``every_s``: that long after the attempt starts; with ``seed``, an exponentially
    distributed interval of that mean (clipped to 0.2x-3x), drawn from the seed and the
    attempt number, so a rerun (or a controller that attaches) sees the same schedule.
    ``at_s``: the attempt-th time in the list, counted from the job's start (or just
    after the launch, if that time has passed already).

    >>> notice_time(Simulation(), attempt=1, launched_unix=0.0, job_started_unix=0.0) is None
    True
    >>> a = notice_time(Simulation(every_s=60.0, seed=7), attempt=3, launched_unix=0.0,
    ...                 job_started_unix=0.0)
    >>> a == notice_time(Simulation(every_s=60.0, seed=7), attempt=3, launched_unix=0.0,
    ...                  job_started_unix=0.0), 12.0 <= a <= 180.0
    (True, True)
    """
    if sim.at_s:
        if attempt > len(sim.at_s):
            return None
        return max(job_started_unix + sim.at_s[attempt - 1], launched_unix + MIN_LEAD_S)
    if sim.every_s is None:
        return None
    interval = sim.every_s
    if sim.seed is not None:
        rng = random.Random(f"{sim.seed}:{attempt}")  # noqa: S311 - a schedule, not a secret
        low, high = RANDOM_RANGE
        interval = min(
            max(rng.expovariate(1.0 / sim.every_s), low * sim.every_s), high * sim.every_s
        )
    return launched_unix + max(interval, MIN_LEAD_S)


def parse_times(text: str) -> tuple[float, ...]:
    """``--preempt-at 30,90``: seconds after the job starts, increasing.

    >>> parse_times("30, 90,150")
    (30.0, 90.0, 150.0)
    """
    try:
        times = tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        times = ()
    ok = bool(times) and all(0 < t < 10**7 for t in times)
    if not ok or list(times) != sorted(set(times)):
        msg = f"--preempt-at {text!r} must list increasing positive seconds"
        raise InputError(msg, hint="e.g. --preempt-at 30,90,150")
    return times


def simulated_cloud(region: str) -> str:
    """Which cloud a local offer's region simulates (its notice format).

    >>> simulated_cloud("gcp:us-central1"), simulated_cloud("anything")
    ('gcp', 'aws')
    """
    cloud = region.split(":", 1)[0]
    return cloud if cloud in NOTICE_S else "aws"


#: How many zones a simulated region has.
SIMULATED_ZONES = 3


def simulated_zones(region: str) -> tuple[str, ...]:
    """The zones of a local offer's region, named as the simulated cloud names them.

    >>> simulated_zones("aws:us-east-1"), simulated_zones("gcp:us-central1")[:1]
    (('us-east-1a', 'us-east-1b', 'us-east-1c'), ('us-central1-a',))
    >>> simulated_zones("azure:eastus")
    ('1', '2', '3')
    """
    cloud = simulated_cloud(region)
    name = region.split(":", 1)[-1]
    letters = "abcdefgh"[:SIMULATED_ZONES]
    if cloud == "azure":
        return tuple(str(n) for n in range(1, SIMULATED_ZONES + 1))
    if cloud == "gcp":
        return tuple(f"{name}-{letter}" for letter in letters)
    return tuple(f"{name}{letter}" for letter in letters)


def http_date(unix: float) -> str:
    """A unix time the way Scheduled Events writes ``NotBefore``.

    >>> http_date(0)
    'Thu, 01 Jan 1970 00:00:00 GMT'
    """
    return format_datetime(datetime.fromtimestamp(unix, UTC), usegmt=True)


def iso_z(unix: float) -> str:
    """A unix time the way IMDS writes it.

    >>> iso_z(0)
    '1970-01-01T00:00:00Z'
    """
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class MetadataEmulator:
    """A loopback metadata service (AWS, GCP and Azure shapes) that announces a spot
    interruption when told to.

    IMDSv2 tokens are required (a GET without one answers 401, as with
    ``HttpTokens=required``), and so are the GCP and Azure headers, so the watchers'
    real request paths run.
    """

    def __init__(self, port: int = 0) -> None:
        self._lock = threading.Lock()
        #: node rank -> (the notice's action, its deadline, its Azure event id).
        self._notices: dict[int, tuple[dict[str, str], float, str]] = {}
        self._tokens: set[str] = set()
        self.requests = 0
        #: Azure event ids acknowledged with StartRequests.
        self.acknowledged: list[str] = []
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: str, kind: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _node(self) -> int:
                """The node asked about: ``/node-<rank>/...`` (the rest is the path
                asked for), else node 0."""
                match = _NODE_PATH.fullmatch(self.path)
                if match is None:
                    return 0
                self.path = match.group(2)
                return int(match.group(1))

            def do_PUT(self) -> None:
                emulator.requests += 1
                self._node()
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
                if self.path != "/latest/api/token" or not ttl.isdigit():
                    self._send(400, "Bad Request")
                    return
                token = secrets.token_urlsafe(24)
                with emulator._lock:
                    emulator._tokens.add(token)
                self._send(200, token)

            def do_POST(self) -> None:
                emulator.requests += 1
                self._node()
                length = min(int(self.headers.get("Content-Length") or 0), 65536)
                body = self.rfile.read(length)
                if not self.path.startswith("/metadata/scheduledevents"):
                    self._send(404, "Not Found")
                    return
                if self.headers.get("Metadata") != "true":
                    self._send(400, "Bad request: Metadata header")
                    return
                try:
                    requests = json.loads(body)["StartRequests"]
                    ids = [str(r["EventId"]) for r in requests]
                except (ValueError, KeyError, TypeError):
                    self._send(400, "Bad request: StartRequests")
                    return
                with emulator._lock:
                    emulator.acknowledged.extend(ids)
                self._send(200, "")

            def do_GET(self) -> None:
                emulator.requests += 1
                node = self._node()
                with emulator._lock:
                    known = self.headers.get("X-aws-ec2-metadata-token") in emulator._tokens
                    action, deadline, event_id = emulator._notices.get(node, (None, 0.0, ""))
                if self.path.startswith("/computeMetadata/v1/instance/preempted"):
                    if self.headers.get("Metadata-Flavor") != "Google":
                        self._send(403, "Missing Metadata-Flavor:Google header.")
                    else:
                        self._send(200, "TRUE" if action else "FALSE")
                    return
                if self.path.startswith("/computeMetadata/v1/instance/maintenance-event"):
                    if self.headers.get("Metadata-Flavor") != "Google":
                        self._send(403, "Missing Metadata-Flavor:Google header.")
                    else:
                        self._send(200, "NONE")  # a simulated preemption, not maintenance
                    return
                if self.path.startswith("/metadata/instance/compute/name"):
                    if self.headers.get("Metadata") != "true":
                        self._send(400, "Bad request: Metadata header")
                    else:
                        self._send(200, VM_NAME)
                    return
                if self.path.startswith("/metadata/scheduledevents"):
                    if self.headers.get("Metadata") != "true":
                        self._send(400, "Bad request: Metadata header")
                        return
                    events = []
                    if action:
                        events.append(
                            {
                                "EventId": event_id,
                                "EventType": "Preempt",
                                "ResourceType": "VirtualMachine",
                                "Resources": [VM_NAME],
                                "EventStatus": "Scheduled",
                                "NotBefore": http_date(deadline),
                                "Description": "simulated Spot eviction",
                                "EventSource": "Platform",
                                "DurationInSeconds": -1,
                            }
                        )
                    doc = {"DocumentIncarnation": len(events), "Events": events}
                    self._send(200, json.dumps(doc), "application/json")
                    return
                if not self.path.startswith("/latest/meta-data/"):
                    self._send(404, "Not Found")
                elif not known:
                    self._send(401, "")
                elif self.path == "/latest/meta-data/spot/instance-action" and action:
                    self._send(200, json.dumps(action), "application/json")
                elif self.path == "/latest/meta-data/spot/termination-time" and action:
                    self._send(200, action["time"])
                else:
                    self._send(404, "Not Found")

        try:
            self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        except OSError as exc:
            msg = f"cannot serve the simulated metadata service on 127.0.0.1:{port}: {exc}"
            raise InputError(
                msg, hint="is another controller supervising this job? (costguard jobs status)"
            ) from None
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="costguard-imds", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """The base URL to put in ``COSTGUARD_AWS_METADATA_URL``."""
        return f"http://127.0.0.1:{self.port}"

    def announce(self, deadline_unix: float, action: str = "terminate", node: int = 0) -> None:
        """From now on, answer that the instance (of a gang: node ``node``) goes away at
        ``deadline_unix``."""
        with self._lock:
            notice = {"action": action, "time": iso_z(deadline_unix)}
            self._notices[node] = (notice, deadline_unix, secrets.token_hex(8))

    @property
    def announced(self) -> bool:
        """Whether a notice is being served (to any node)."""
        with self._lock:
            return bool(self._notices)

    def node_url(self, node: int) -> str:
        """The metadata URL of a gang's node ``node`` (node 0's is :attr:`url`).

        >>> emulator = MetadataEmulator()
        >>> emulator.node_url(0) == emulator.url, emulator.node_url(2).endswith("/node-2")
        (True, True)
        >>> emulator.close()
        """
        return self.url if node == 0 else f"{self.url}/node-{node}"

    def clear(self) -> None:
        """No notice (a new attempt starts on fresh "instances")."""
        with self._lock:
            self._notices.clear()
            self._tokens.clear()

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
