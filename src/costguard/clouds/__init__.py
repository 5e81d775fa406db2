"""Lazy SDK client factories and per-cloud error translation.

Nothing here imports a cloud SDK at module load: each factory imports its SDK when it is
called and raises :class:`~costguard.errors.MissingDependencyError` (with the pip extra to
install) when the SDK is absent. Features call these factories and never build SDK clients
themselves, so endpoints, timeouts and retries are set in one place.

Endpoints: AWS honours the standard ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_<SERVICE>``
variables by itself. GCP and Azure clients take ``Settings.gcp_endpoint`` /
``Settings.azure_endpoint`` (``COSTGUARD_GCP_ENDPOINT`` / ``COSTGUARD_AZURE_ENDPOINT``) for
mirrors, private endpoints and tests.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from costguard.errors import MissingDependencyError

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
