"""Preemption notices: what they say, where they come from, and the board they land on.

Sources: the clouds' metadata services (:mod:`.aws`, :mod:`.gcp`, :mod:`.azure`, polled
by a :class:`Watcher` thread), signals (:mod:`.signals`: SIGTERM from Kubernetes or a
shutting-down VM, SIGUSR1 from SLURM's ``--signal``), and the pipe through which
``costguard run`` relays what its own watcher saw (:class:`PipeListener`). Every source
posts :class:`Notice` values on a :class:`NoticeBoard`; the Checkpointer reads the board at
each step boundary.

Which cloud: ``COSTGUARD_CLOUD`` (``aws``, ``gcp``, ``azure``, ``none``) or, by default,
the machine's DMI vendor strings - a local file read, so off-cloud nothing is polled and
no network call is made. Endpoints: ``COSTGUARD_AWS_METADATA_URL``,
``COSTGUARD_GCP_METADATA_URL``, ``COSTGUARD_AZURE_METADATA_URL``.

>>> board = NoticeBoard()
>>> board.post(Notice("aws", "rebalance", None))
>>> board.urgent() is None, [n.kind for n in board.take_advisory()]
(True, ['rebalance'])
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from costguard import contract
from costguard.clouds import metadata
from costguard.errors import InputError
from costguard.logs import get_logger

logger = get_logger(__name__)

CLOUDS = ("aws", "gcp", "azure")
#: Environment variables that configure notices (``costguard run`` sets the FD one).
ENV_CLOUD = contract.ENV_CLOUD
ENV_NOTICE_FD = contract.ENV_NOTICE_FD
ENV_POLL_S = contract.ENV_NOTICE_POLL_S
ENDPOINT_ENV = {
    "aws": contract.ENV_AWS_METADATA_URL,
    "gcp": "COSTGUARD_GCP_METADATA_URL",
    "azure": "COSTGUARD_AZURE_METADATA_URL",
}
DEFAULT_ENDPOINTS = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}
#: GCP and Azure give about 30 s; poll at least once a second there (AWS gives 2 min).
DEFAULT_POLL_S = 1.0
#: Kinds that mean "this machine is going away": save, wait for durability, stop.
URGENT_KINDS = frozenset({"terminate", "stop", "hibernate", "preempt", "signal"})


@dataclass(frozen=True)
class Notice:
    """One notice: who sent it, what it announces, and by when (unix time) it happens."""

    source: str  # aws, gcp, azure, signal
    kind: str  # terminate, stop, hibernate, preempt, rebalance, signal
    deadline_unix: float | None
    detail: str = ""

    @property
    def urgent(self) -> bool:
        """Whether the machine is going away (a rebalance recommendation is advisory)."""
        return self.kind in URGENT_KINDS

    def to_json(self) -> str:
        """One line of JSON (the relay format of ``costguard run``)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Notice:
        """Parse :meth:`to_json`'s output; ``ValueError`` if it is not a notice."""
        data = json.loads(text)
        if not isinstance(data, dict):
            msg = "a notice must be a JSON object"
            raise ValueError(msg)
        deadline = data.get("deadline_unix")
        return cls(
            source=str(data["source"]),
            kind=str(data["kind"]),
            deadline_unix=float(deadline) if deadline is not None else None,
            detail=str(data.get("detail", "")),
        )

    def describe(self, now_unix: float | None = None) -> str:
        """A sentence for the log.

        >>> Notice("aws", "terminate", 130.0).describe(now_unix=10.0)
        'aws terminate notice, deadline in 120 s'
        >>> Notice("signal", "signal", None, "SIGTERM").describe()
        'signal notice (SIGTERM)'
        """
        what = self.source if self.kind == self.source else f"{self.source} {self.kind}"
        text = f"{what} notice"
        if self.detail:
            text += f" ({self.detail})"
        if self.deadline_unix is not None:
            left = self.deadline_unix - (time.time() if now_unix is None else now_unix)
            text += f", deadline in {left:.0f} s"
        return text


class NoticeBoard:
    """Where notices land. Lock-free (list appends), so a signal handler may post."""

    def __init__(self) -> None:
        self._notices: list[Notice] = []
        self._advisory_taken = 0

    def post(self, notice: Notice) -> None:
        """Add a notice (safe from threads and signal handlers)."""
        self._notices.append(notice)

    def urgent(self) -> Notice | None:
        """The first urgent notice posted, if any."""
        for notice in list(self._notices):
            if notice.urgent:
                return notice
        return None

    def take_advisory(self) -> list[Notice]:
        """Advisory notices (rebalance) posted since the last call."""
        notices = list(self._notices)
        new = [n for n in notices[self._advisory_taken :] if not n.urgent]
        self._advisory_taken = len(notices)
        return new

    def all(self) -> list[Notice]:
        """Every notice so far, oldest first."""
        return list(self._notices)


def detect_cloud(env: Mapping[str, str], dmi_dir: Path = Path("/sys/class/dmi/id")) -> str | None:
    """Which cloud this machine runs on, from ``COSTGUARD_CLOUD`` or the DMI vendor strings.

    Reads local files only: off-cloud (a laptop, a SLURM node) it returns ``None`` quickly
    and makes no network call.

    >>> detect_cloud({"COSTGUARD_CLOUD": "gcp"}), detect_cloud({"COSTGUARD_CLOUD": "none"})
    ('gcp', None)
    """
    chosen = env.get(ENV_CLOUD, "auto").strip().lower() or "auto"
    if chosen == "none":
        return None
    if chosen in CLOUDS:
        return chosen
    if chosen != "auto":
        msg = f"{ENV_CLOUD}={chosen!r} is not one of auto, none, {', '.join(CLOUDS)}"
        raise InputError(msg, hint=f"e.g. {ENV_CLOUD}=aws, or unset it to detect the cloud")
    texts = []
    for name in ("sys_vendor", "board_vendor", "bios_vendor", "product_name", "chassis_asset_tag"):
        try:
            texts.append((dmi_dir / name).read_text(encoding="utf-8", errors="replace").strip())
        except OSError:
            continue
    blob = " ".join(texts).lower()
    if "amazon" in blob:
        return "aws"
    if "google" in blob:
        return "gcp"
    # Azure VMs carry this chassis asset tag; Microsoft alone could be Hyper-V on a desk.
    if "7783-7084-3265-9085-8269-3286-77" in blob:
        return "azure"
    return None


#: Metadata services answer in milliseconds; a slow one must not stall the watcher: the
#: whole answer within this, its body within ``metadata.MAX_BYTES`` (1 MiB).
HTTP_TIMEOUT_S = 2.0


def fetch(
    method: str,
    url: str,
    headers: Mapping[str, str],
    data: bytes | None = None,
    timeout_s: float = HTTP_TIMEOUT_S,
) -> tuple[int, str]:
    """One HTTP request to a metadata service: ``(status, body)``; 4xx/5xx are returned,
    not raised. Connection errors, an answer not whole within ``timeout_s`` and a body
    over 1 MiB raise ``OSError`` (:func:`costguard.clouds.metadata.fetch`).
    """
    status, body = metadata.fetch(method, url, headers, data, deadline_s=timeout_s)
    return status, body.decode("utf-8", errors="replace")


def endpoint(cloud: str, env: Mapping[str, str]) -> str:
    """The metadata base URL for ``cloud`` (the env override, else the documented one)."""
    return (env.get(ENDPOINT_ENV[cloud]) or DEFAULT_ENDPOINTS[cloud]).rstrip("/")


def poll_interval_s(env: Mapping[str, str]) -> float:
    """Seconds between metadata polls: ``COSTGUARD_NOTICE_POLL_S``, default 1."""
    text = env.get(ENV_POLL_S, "").strip()
    if not text:
        return DEFAULT_POLL_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.05 <= value <= 60:
        msg = f"{ENV_POLL_S}={text!r} must be a number of seconds between 0.05 and 60"
        raise InputError(msg)
    return value


def cloud_poller(cloud: str, base_url: str) -> Callable[[], list[Notice]]:
    """The poll function of ``cloud``'s metadata watcher."""
    if cloud == "aws":
        from costguard.checkpoint.notices.aws import AwsMetadata

        return AwsMetadata(base_url).poll
    if cloud == "gcp":
        from costguard.checkpoint.notices.gcp import GcpMetadata

        return GcpMetadata(base_url).poll
    if cloud == "azure":
        from costguard.checkpoint.notices.azure import AzureScheduledEvents

        return AzureScheduledEvents(base_url).poll
    msg = f"unknown cloud {cloud!r}"
    raise InputError(msg)


def acknowledge(notice: Notice, env: Mapping[str, str] | None = None) -> bool:
    """Tell the cloud that the machine is ready for what ``notice`` announced.

    Only Azure has such an API (Scheduled Events ``StartRequests``); for every other notice
    this does nothing and returns ``False``. Call it after the emergency save is durable,
    never before: the platform may take the machine the moment it is acknowledged. Best
    effort and bounded (one HTTP request with a short timeout); never raises.

    >>> acknowledge(Notice("signal", "signal", None, "SIGTERM"))
    False
    """
    if notice.source != "azure":
        return False
    from costguard.checkpoint.notices.azure import acknowledge as azure_acknowledge

    return azure_acknowledge(notice, endpoint("azure", os.environ if env is None else env))


class Watcher(threading.Thread):
    """Polls a metadata service and posts each new notice once.

    Errors (the service not answering, a timeout) are logged at debug level and polling
    goes on: metadata services are best effort, and a watcher must never stop training.
    """

    def __init__(
        self,
        name: str,
        poll: Callable[[], Sequence[Notice]],
        board: NoticeBoard,
        interval_s: float = DEFAULT_POLL_S,
        on_notice: Callable[[Notice], None] | None = None,
    ) -> None:
        super().__init__(name=f"costguard-notice-{name}", daemon=True)
        self._poll = poll
        self._board = board
        self._interval_s = interval_s
        self._on_notice = on_notice
        self._stop_event = threading.Event()
        self._seen: set[Notice] = set()
        self.polls = 0

    def run(self) -> None:
        """Poll until :meth:`stop`."""
        while not self._stop_event.is_set():
            try:
                notices = self._poll()
            except Exception as exc:  # a watcher never dies of a bad answer
                logger.debug("notice poll %s failed: %s", self.name, exc)
                notices = []
            self.polls += 1
            for notice in notices:
                if notice not in self._seen:
                    self._seen.add(notice)
                    logger.warning("costguard: %s", notice.describe())
                    self._board.post(notice)
                    if self._on_notice is not None:
                        self._on_notice(notice)
            self._stop_event.wait(self._interval_s)

    def stop(self) -> None:
        """Ask the thread to end after the current poll."""
        self._stop_event.set()


def start_cloud_watcher(
    board: NoticeBoard,
    env: Mapping[str, str],
    on_notice: Callable[[Notice], None] | None = None,
) -> Watcher | None:
    """Start the metadata watcher of the cloud this machine is on; ``None`` off-cloud."""
    cloud = detect_cloud(env)
    if cloud is None:
        return None
    watcher = Watcher(
        cloud, cloud_poller(cloud, endpoint(cloud, env)), board, poll_interval_s(env), on_notice
    )
    watcher.start()
    return watcher


class PipeListener(threading.Thread):
    """Reads notices relayed by ``costguard run`` (JSON lines on an inherited pipe)."""

    def __init__(self, fd: int, board: NoticeBoard) -> None:
        super().__init__(name="costguard-notice-relay", daemon=True)
        self._fd = fd
        self._board = board

    def run(self) -> None:
        """Read until the writer closes the pipe (``costguard run`` exited)."""
        try:
            with os.fdopen(self._fd, "r", encoding="utf-8", closefd=True) as stream:
                for line in stream:
                    try:
                        notice = Notice.from_json(line)
                    except (ValueError, KeyError) as exc:
                        logger.warning("costguard: ignored a bad relayed notice: %s", exc)
                        continue
                    logger.warning("costguard: relayed %s", notice.describe())
                    self._board.post(notice)
        except OSError as exc:
            logger.debug("notice relay pipe closed: %s", exc)


def relay(fd: int, notice: Notice) -> None:
    """Send one notice down the pipe to the child (``costguard run``'s side)."""
    os.write(fd, (notice.to_json() + "\n").encode())
