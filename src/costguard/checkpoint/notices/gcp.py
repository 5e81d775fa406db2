"""GCP: the ``instance/preempted`` flag of the metadata server.

``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google`` answers
``TRUE`` once the Spot VM is being preempted; the VM is powered off about 30 s later,
so the deadline is 30 s after the flag was first seen.

>>> parse_preempted(200, "TRUE", now_unix=100.0)
Notice(source='gcp', kind='preempt', deadline_unix=130.0, detail='instance/preempted')
>>> parse_preempted(200, "FALSE", now_unix=100.0) is None
True
"""

from __future__ import annotations

import time

from costguard.checkpoint.notices import Notice, fetch

NOTICE_S = 30.0


def parse_preempted(status: int, body: str, now_unix: float) -> Notice | None:
    """The metadata answer as a notice (``None`` unless it says TRUE)."""
    if status != 200 or body.strip().upper() != "TRUE":
        return None
    return Notice("gcp", "preempt", now_unix + NOTICE_S, "instance/preempted")


class GcpMetadata:
    """Polls the metadata server; the first TRUE fixes the deadline."""

    def __init__(self, base_url: str) -> None:
        self.url = f"{base_url.rstrip('/')}/computeMetadata/v1/instance/preempted"
        self._notice: Notice | None = None

    def poll(self) -> list[Notice]:
        """``[notice]`` once preempted (the same one each time), else ``[]``."""
        if self._notice is not None:
            return [self._notice]
        status, body = fetch("GET", self.url, {"Metadata-Flavor": "Google"})
        self._notice = parse_preempted(status, body, time.time())
        return [self._notice] if self._notice else []
