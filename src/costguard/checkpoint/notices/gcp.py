"""GCP: the ``instance/preempted`` flag and the ``instance/maintenance-event`` key of the
metadata server.

``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google`` answers
``TRUE`` once the Spot VM is being preempted; the VM is powered off about 30 s later,
so the deadline is 30 s after the flag was first seen.

``GET /computeMetadata/v1/instance/maintenance-event`` answers ``NONE``, or
``MIGRATE_ON_HOST_MAINTENANCE`` before a live migration (the VM keeps running), or
``TERMINATE_ON_HOST_MAINTENANCE`` when host maintenance will stop the VM: GPU VMs cannot
live-migrate (costguard launches them with ``onHostMaintenance=TERMINATE``), and Compute
Engine gives them an hour's notice, other VMs 60 s (cloud.google.com/compute/docs/gpus/
gpu-host-maintenance). That is a ``stop`` notice, saved for like a preemption; its deadline
is the shorter notice, 60 s, since the key does not say which one this VM got.

>>> parse_preempted(200, "TRUE", now_unix=100.0)
Notice(source='gcp', kind='preempt', deadline_unix=130.0, detail='instance/preempted')
>>> parse_preempted(200, "FALSE", now_unix=100.0) is None
True
>>> parse_maintenance(200, "TERMINATE_ON_HOST_MAINTENANCE", now_unix=100.0).kind
'stop'
>>> parse_maintenance(200, "MIGRATE_ON_HOST_MAINTENANCE", now_unix=100.0) is None
True
"""

from __future__ import annotations

import time

from costguard.checkpoint.notices import Notice, fetch

NOTICE_S = 30.0
#: The shortest notice before host maintenance stops a VM (GPU VMs get an hour).
MAINTENANCE_NOTICE_S = 60.0
#: The ``maintenance-event`` value that announces a stop (the others: NONE, a migration).
TERMINATE_ON_MAINTENANCE = "TERMINATE_ON_HOST_MAINTENANCE"


def parse_preempted(status: int, body: str, now_unix: float) -> Notice | None:
    """The metadata answer as a notice (``None`` unless it says TRUE)."""
    if status != 200 or body.strip().upper() != "TRUE":
        return None
    return Notice("gcp", "preempt", now_unix + NOTICE_S, "instance/preempted")


def parse_maintenance(status: int, body: str, now_unix: float) -> Notice | None:
    """The ``maintenance-event`` answer as a notice (``None`` unless the VM will stop)."""
    if status != 200 or body.strip().upper() != TERMINATE_ON_MAINTENANCE:
        return None
    detail = f"instance/maintenance-event {TERMINATE_ON_MAINTENANCE}"
    return Notice("gcp", "stop", now_unix + MAINTENANCE_NOTICE_S, detail)


class GcpMetadata:
    """Polls the metadata server (both keys); the first notice fixes the deadline."""

    def __init__(self, base_url: str) -> None:
        base = f"{base_url.rstrip('/')}/computeMetadata/v1/instance"
        self.url = f"{base}/preempted"
        self.maintenance_url = f"{base}/maintenance-event"
        self._notice: Notice | None = None

    def poll(self) -> list[Notice]:
        """``[notice]`` once preempted or due for a maintenance stop (the same one each
        time), else ``[]``."""
        if self._notice is not None:
            return [self._notice]
        headers = {"Metadata-Flavor": "Google"}
        status, body = fetch("GET", self.url, headers)
        self._notice = parse_preempted(status, body, time.time())
        if self._notice is None:
            status, body = fetch("GET", self.maintenance_url, headers)
            self._notice = parse_maintenance(status, body, time.time())
        return [self._notice] if self._notice else []
