"""AWS: spot interruption and rebalance notices from the instance metadata service (IMDSv2).

``PUT /latest/api/token`` gives a session token; ``GET
/latest/meta-data/spot/instance-action`` answers 404 until an interruption is scheduled,
then ``{"action": "terminate", "time": "2017-09-18T08:22:00Z"}`` (two minutes ahead);
``GET /latest/meta-data/events/recommendations/rebalance`` answers ``{"noticeTime": ...}``
when the instance is at elevated risk. Parsing is pure; :class:`AwsMetadata` does the HTTP.

>>> parse_instance_action(200, '{"action": "stop", "time": "2017-09-18T08:22:00Z"}')
Notice(source='aws', kind='stop', deadline_unix=1505722920.0, detail='spot instance-action')
>>> parse_instance_action(404, "Not Found") is None
True
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from costguard.checkpoint.notices import Notice, fetch

TOKEN_TTL_S = 21600
ACTIONS = ("terminate", "stop", "hibernate")


def parse_time(text: str) -> float | None:
    """An ISO-8601 UTC time (``2017-09-18T08:22:00Z``) as unix seconds, ``None`` if bad.

    >>> parse_time("1970-01-01T00:01:00Z")
    60.0
    """
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _json_object(status: int, body: str) -> dict[str, Any] | None:
    """The JSON object of a 200 answer; ``None`` for any other status or body."""
    if status != 200:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def parse_instance_action(status: int, body: str) -> Notice | None:
    """The ``spot/instance-action`` answer as a notice (``None`` when there is none).

    Some mocks name the key ``instance-action`` instead of ``action``: both are read. An
    unknown action is still a notice: the machine is going away either way.
    """
    data = _json_object(status, body)
    if data is None:
        return None
    action = str(data.get("action") or data.get("instance-action") or "terminate").lower()
    deadline = parse_time(str(data.get("time", "")))
    kind = action if action in ACTIONS else "terminate"
    return Notice("aws", kind, deadline, "spot instance-action")


def parse_termination_time(status: int, body: str) -> Notice | None:
    """The older ``spot/termination-time`` answer (a bare timestamp) as a notice.

    >>> parse_termination_time(200, "2017-09-18T08:22:00Z").kind
    'terminate'
    """
    if status != 200:
        return None
    deadline = parse_time(body)
    return Notice("aws", "terminate", deadline, "spot termination-time") if deadline else None


def parse_rebalance(status: int, body: str) -> Notice | None:
    """The rebalance recommendation as an advisory notice.

    >>> parse_rebalance(200, '{"noticeTime": "2020-10-27T08:22:00Z"}').kind
    'rebalance'
    """
    data = _json_object(status, body)
    if data is None:
        return None
    return Notice("aws", "rebalance", None, f"noticeTime {data.get('noticeTime', '?')}")


class AwsMetadata:
    """Polls IMDSv2; fetches a new token on 401 (tokens expire, instances get restored)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._token: str | None = None

    def _get_token(self) -> str:
        status, body = fetch(
            "PUT",
            f"{self.base_url}/latest/api/token",
            {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            data=b"",
        )
        if status != 200:
            msg = f"IMDSv2 token request answered {status}"
            raise OSError(msg)
        return body.strip()

    def get(self, path: str) -> tuple[int, str]:
        """``(status, body)`` of ``/latest/meta-data/<path>``, with a token (a new one
        on 401); also how a gang's node reads its instance tags (:mod:`costguard.spot.node`)."""
        for _ in range(2):
            if self._token is None:
                self._token = self._get_token()
            status, body = fetch(
                "GET",
                f"{self.base_url}/latest/meta-data/{path}",
                {"X-aws-ec2-metadata-token": self._token},
            )
            if status != 401:
                return status, body
            self._token = None
        return 401, ""

    def poll(self) -> list[Notice]:
        """The notices the metadata service announces right now."""
        notices = []
        action = parse_instance_action(*self.get("spot/instance-action"))
        if action is None:
            action = parse_termination_time(*self.get("spot/termination-time"))
        if action is not None:
            notices.append(action)
        rebalance = parse_rebalance(*self.get("events/recommendations/rebalance"))
        if rebalance is not None:
            notices.append(rebalance)
        return notices
