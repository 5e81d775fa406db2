"""costguard's loggers, each of which masks credentials in what it logs.

Every costguard module makes its logger with :func:`get_logger`, which first installs
a log record factory that masks secrets (:func:`costguard.secrets.redact`) in every
record of a ``costguard.*`` logger, whatever handler prints it. The factory is installed
when the first costguard logger is made, not when ``costguard`` is imported: commands
that log nothing, such as ``costguard estimate``, do not load :mod:`logging`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from costguard.secrets import redact


class _RedactingFactory:
    """A log record factory that masks secrets in the messages of ``costguard.*`` loggers."""

    def __init__(self, inner: Callable[..., logging.LogRecord]) -> None:
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.inner(*args, **kwargs)
        if record.name == "costguard" or record.name.startswith("costguard."):
            try:
                message = record.getMessage()
            except (TypeError, ValueError):  # a bad format string: leave it to logging
                return record
            record.msg, record.args = redact(message), None
        return record


def install_log_redaction() -> None:
    """Mask secrets (:func:`~costguard.secrets.redact`) in every log record of a
    ``costguard.*`` logger, in this process, whatever handler prints it. Idempotent."""
    factory = logging.getLogRecordFactory()
    if not isinstance(factory, _RedactingFactory):
        logging.setLogRecordFactory(_RedactingFactory(factory))


def get_logger(name: str) -> logging.Logger:
    """The logger ``name`` (a ``costguard.*`` module's ``__name__``), its records masked.

    >>> get_logger("costguard.example").name
    'costguard.example'
    """
    install_log_redaction()
    return logging.getLogger(name)
