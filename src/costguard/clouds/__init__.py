"""Lazy SDK client factories and per-cloud error translation.

Nothing here imports a cloud SDK at module load: each factory imports its SDK when it is
called and raises :class:`~costguard.errors.MissingDependencyError` (with the pip extra to
install) when the SDK is absent. Features call these factories and never build SDK clients
themselves, so endpoints, timeouts and retries are set in one place.

Endpoints: AWS honours the standard ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_<SERVICE>``
variables by itself. GCP and Azure clients take ``Settings.gcp_endpoint`` /
``Settings.azure_endpoint`` (``COSTGUARD_GCP_ENDPOINT`` / ``COSTGUARD_AZURE_ENDPOINT``) for
mirrors, private endpoints and tests.

Paging: :func:`pages` walks any token-paged listing with one shared guard against servers
that repeat a token or never stop paging.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TypeVar

from costguard.errors import CostguardError, MissingDependencyError

T = TypeVar("T")

#: Every cloud call gives up after this long; a cron job must never hang.
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or explain which extra installs it.

    >>> require("json", "aws").__name__
    'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(module, extra) from None


def pages(
    fetch: Callable[[str | None], tuple[list[T], str | None]], *, max_pages: int = 1000
) -> Iterator[T]:
    """Every item of a token-paged listing, page by page, with a guard against endless paging.

    ``fetch(token)`` fetches one page: it gets ``None`` for the first page and the token the
    previous page returned after that, and returns ``(items, next_token)``. Paging stops when
    ``next_token`` is ``None`` or empty. Pages are fetched lazily, as the items are consumed;
    retries belong inside ``fetch``.

    Raises :class:`~costguard.errors.CostguardError` when the server returns a token it
    already returned (it would loop forever) or keeps paging past ``max_pages`` pages.

    >>> book = {None: ([1, 2], "b"), "b": ([3], None)}
    >>> list(pages(book.__getitem__))
    [1, 2, 3]
    >>> list(pages(lambda token: ([0], "same")))
    Traceback (most recent call last):
    ...
    costguard.errors.CostguardError: the server returned the page token 'same' twice: paging stopped
    """
    token: str | None = None
    seen: set[str] = set()
    for _ in range(max_pages):
        items, token = fetch(token)
        yield from items
        if not token:
            return
        if token in seen:
            msg = f"the server returned the page token {token[:20]!r} twice: paging stopped"
            raise CostguardError(msg, hint="the API misbehaved: try again later")
        seen.add(token)
    msg = f"the server kept paging past {max_pages} pages: paging stopped"
    raise CostguardError(msg, hint="ask for less at a time, or try again later")
