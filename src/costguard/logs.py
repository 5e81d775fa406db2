"""costguard's loggers, each of which masks credentials in what it logs.

Every costguard module makes its logger with :func:`get_logger`, which first installs
a log record factory that masks secrets (:func:`costguard.secrets.redact`) in every
record of a ``costguard.*`` logger, whatever handler prints it. The factory is installed
when the first costguard logger is made, not when ``costguard`` is imported: commands
that log nothing, such as ``costguard estimate``, do not load :mod:`logging`.
"""

from __future__ import annotations

import logging
import sys
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


class _Stderr(logging.Handler):
    """Each record's message alone on the standard error of the moment (a notebook's, a
    test runner's capture), as Python's last-resort handler writes it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(record.getMessage() + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed: nowhere left to say it
            pass


def get_warning_logger(name: str) -> logging.Logger:
    """The logger ``name``, masked as :func:`get_logger`'s, whose warnings are for the
    user: each is written to stderr as it comes, whatever logging the program set up
    (a record of a store left out, for example, must be named, never dropped).

    >>> get_warning_logger("costguard.example.warnings").propagate
    False
    """
    logger = get_logger(name)
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        logger.addHandler(_Stderr(logging.WARNING))
        logger.propagate = False
    return logger
