"""How every call to a checkpoint store is made: retried by :mod:`costguard.retry`'s rule
(transient errors as :mod:`~costguard.checkpoint.backends` classifies them, jittered,
bounded, never past a save's deadline) and translated into a :class:`StoreError` that names
what was being done.

:class:`StoreCalls` holds one store's filesystem, root and these rules; the
:class:`~costguard.checkpoint.store.Store` is one, and the streamed writers of
:mod:`~costguard.checkpoint.uploads` make their calls through it (neither module imports
the other's internals).
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from costguard.checkpoint import backends
from costguard.errors import CostguardError, MissingCredentialsError, StoreError
from costguard.logs import get_logger
from costguard.retry import (
    OnRetry,
    RetryPolicy,
    Transient,
    call_with_retry,
    call_with_retry_async,
)
from costguard.secrets import redact, redact_url

logger = get_logger(__name__)
T = TypeVar("T")
#: A retry that would start less than this before the deadline is not started.
DEADLINE_MARGIN_S = 1.0


def _classify(exc: Exception) -> Transient | None:
    return Transient(type(exc).__name__) if backends.is_transient(exc) else None


class StoreCalls:
    """One checkpoint root in one fsspec filesystem, and the rule its calls follow."""

    def __init__(
        self,
        fs: Any,
        root: str,
        url: str,
        *,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        #: The URL as it may be shown: userinfo and query string masked.
        self.url = redact_url(url)
        self.backend = backends.backend_name(url)
        self.retry = retry or RetryPolicy()
        #: When set (unix time), no retry starts that could not end before it: the save
        #: of a preemption notice must commit, or say it could not, while the machine lives.
        self.deadline_unix: float | None = None
        self._sleep = sleep
        self._rng = random.Random()  # noqa: S311 - jitter, not security
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.is_local = protocol in ("file", "local")

    @property
    def is_s3(self) -> bool:
        """Whether this store is S3 (or an S3-compatible endpoint) through s3fs."""
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return protocol in ("s3", "s3a")

    def full(self, path: str) -> str:
        """The absolute path (in the filesystem's terms) of a relative ``path``."""
        return f"{self.root}/{path.lstrip('/')}" if path else self.root

    def call(self, action: str, func: Callable[[], T]) -> T:
        """Run ``func`` with retries; the last error becomes a :class:`StoreError`."""
        return self.translate(action, lambda: self.with_retries(action, func))

    def with_retries(self, action: str, func: Callable[[], T]) -> T:
        """Run ``func``, again after each transient error while the policy allows."""
        return call_with_retry(
            func,
            _classify,
            self.retry,
            sleep=self._sleep,
            rand=self._rng.random,
            may_wait=self._may_retry,
            on_retry=self._on_retry(action),
        )

    def translate(self, action: str, func: Callable[[], T]) -> T:
        """Run ``func``; what it raises becomes a :class:`StoreError` that names ``action``."""
        try:
            return func()
        except CostguardError:
            raise
        except Exception as exc:
            raise self._store_error(action, exc) from exc

    async def with_retries_async(self, action: str, func: Callable[[], Awaitable[T]]) -> T:
        """:meth:`call` for a coroutine (one S3 call on fsspec's event loop)."""
        try:
            return await call_with_retry_async(
                func,
                _classify,
                self.retry,
                rand=self._rng.random,
                may_wait=self._may_retry,
                on_retry=self._on_retry(action),
            )
        except CostguardError:
            raise
        except Exception as exc:
            raise self._store_error(action, exc) from exc

    def _may_retry(self, delay_s: float) -> bool:
        """Whether a retry after ``delay_s`` could still end before the deadline."""
        if self.deadline_unix is None:
            return True
        return time.time() + delay_s + DEADLINE_MARGIN_S < self.deadline_unix

    def _on_retry(self, action: str) -> OnRetry:
        def log(exc: Exception, retry: int, retries: int, delay_s: float) -> None:
            logger.warning(
                "%s on %s failed (%s: %s); retry %d of %d in %.1f s",
                action,
                self.url,
                type(exc).__name__,
                redact(str(exc))[:300],
                retry,
                retries,
                delay_s,
            )

        return log

    def _store_error(self, action: str, exc: Exception) -> CostguardError:
        if backends.no_credentials(exc) and self.backend in backends.CREDENTIALS:
            cloud, hint = backends.CREDENTIALS[self.backend]
            return MissingCredentialsError(
                f"no {cloud} credentials while {action} on {self.url}", hint=hint
            )
        if isinstance(exc, FileNotFoundError):
            # The action names the object: nothing of the exception's text to redact (a
            # missing exit record is every running job's answer at every poll).
            return StoreError(f"{action} on {self.url}: not found")
        detail = redact(str(exc))[:300]
        if isinstance(exc, PermissionError):
            return StoreError(f"{action} on {self.url}: permission denied ({detail})")
        return StoreError(f"{action} on {self.url} failed: {type(exc).__name__}: {detail}")
