"""One HTTP request to an instance metadata service, within a budget of time and bytes.

The notice watchers (:mod:`costguard.checkpoint.notices`) and the agent's Azure identity
call (:mod:`costguard.reaper.agent`) read link-local services that answer a few hundred
bytes in milliseconds. A socket timeout bounds each read, not the answer: a service that
sends one byte a second never times out, and one that floods fills memory. So the whole
answer (connection, headers, body) must arrive within ``deadline_s``, its body within
``max_bytes``; a timer closes the connection when the deadline passes, whatever call
is waiting on it. Never through an HTTP(S)_PROXY (``http.client`` uses none).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Mapping
from urllib.parse import urlsplit

#: A metadata answer is at most a few KiB (Azure's compute document is the largest).
MAX_BYTES = 1 << 20
#: Read this much at a time.
_CHUNK = 64 * 1024


def fetch(
    method: str,
    url: str,
    headers: Mapping[str, str],
    data: bytes | None = None,
    *,
    deadline_s: float,
    max_bytes: int = MAX_BYTES,
) -> tuple[int, bytes]:
    """``(status, body)`` of one request; 4xx/5xx are returned, not raised.

    Raises ``OSError`` when it cannot connect, when the whole answer has not arrived
    within ``deadline_s`` seconds, or when the body is longer than ``max_bytes``.
    """
    import http.client

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        msg = f"metadata endpoint {url[:200]!r} must be an http(s) URL"
        raise OSError(msg)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=deadline_s)
    expired = threading.Event()
    #: The socket once connected: the connection forgets it when the answer says it will
    #: close (HTTP/1.0), while the response still reads from it.
    held: list[socket.socket] = []

    def cut() -> None:
        expired.set()
        for sock in (connection.sock, *held):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # wakes whatever call waits on it

    timer = threading.Timer(deadline_s, cut)
    timer.daemon = True
    timer.start()
    response: http.client.HTTPResponse | None = None
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request(method, target, body=data, headers=dict(headers))
        if connection.sock is not None:
            held.append(connection.sock)
        response = connection.getresponse()
        status = response.status
        body = bytearray()
        while len(body) <= max_bytes:
            chunk = response.read(min(_CHUNK, max_bytes + 1 - len(body)))
            if not chunk:
                break
            body += chunk
    except http.client.HTTPException as exc:
        if expired.is_set():
            raise _late(deadline_s) from None
        msg = f"a malformed answer from {parts.hostname}: {type(exc).__name__}"
        raise OSError(msg) from None
    except OSError:
        if expired.is_set():
            raise _late(deadline_s) from None
        raise
    finally:
        timer.cancel()
        if response is not None:
            response.close()
        connection.close()
    if expired.is_set():  # the connection was cut: what arrived may be a truncated body
        raise _late(deadline_s)
    if len(body) > max_bytes:
        msg = f"{parts.hostname} answered more than {max_bytes} bytes"
        raise OSError(msg)
    return status, bytes(body)


def _late(deadline_s: float) -> OSError:
    return TimeoutError(f"no whole answer within {deadline_s:g} s")
