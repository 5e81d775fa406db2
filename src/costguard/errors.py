"""One exception root for costguard, with actionable messages and exit codes.

Library code raises these and never prints or exits; the CLI shows ``Error: <message>``
and ``Hint: <hint>`` and exits with :attr:`CostguardError.exit_code`:

* ``2`` - bad input (unknown names, out-of-range numbers); nothing was done.
* ``1`` - the command ran but failed or found a problem (e.g. over budget).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import re

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
#: The shell's code for a command ended by Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130


class CostguardError(Exception):
    """Root of every error costguard raises on purpose.

    >>> err = CostguardError("the table is missing", hint="reinstall costguard")
    >>> (str(err), err.hint, err.exit_code)
    ('the table is missing', 'reinstall costguard', 1)
    """

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class InputError(CostguardError):
    """The user's input cannot be used; nothing was done (exit code 2)."""

    exit_code = EXIT_BAD_INPUT


class MissingCredentialsError(InputError):
    """No credentials for a cloud the command needs; nothing was done (exit code 2).

    The message names the cloud and what was about to be done, the hint how to sign in.
    Never retried: another try finds no more credentials than the first.
    """


class UnknownNameError(InputError):
    """A name (GPU, region, provider, instance type) that is not in the tables.

    The hint suggests the closest known names.

    >>> err = UnknownNameError("GPU", "a10q", ["A10G", "L4", "T4"])
    >>> str(err)
    "unknown GPU 'a10q'"
    >>> err.hint
    'did you mean A10G?'
    """

    def __init__(
        self, kind: str, name: str, known: Iterable[str], *, hint: str | None = None
    ) -> None:
        known = sorted(set(known))
        if hint is None:
            hint = did_you_mean(name, known) or f"known {kind} names: {', '.join(known)}"
        super().__init__(f"unknown {kind} {name!r}", hint=hint)
        self.kind = kind
        self.name = name
        self.known = known


def check_names(
    kind: str, names: Iterable[str], known: Iterable[str], *, pattern: re.Pattern[str], hint: str
) -> None:
    """Each of ``names`` has the form of a ``kind`` (the whole name matches ``pattern``: else
    an :class:`InputError` with ``hint``) and is one of ``known`` (else an
    :class:`UnknownNameError`).

    >>> import re
    >>> region = re.compile("[a-z0-9-]+")
    >>> check_names("GCP region", ["us-central1"], ["us-central1"], pattern=region, hint="")
    >>> check_names("GCP region", ["us-centrl1"], ["us-central1"], pattern=region, hint="")
    Traceback (most recent call last):
    ...
    costguard.errors.UnknownNameError: unknown GCP region 'us-centrl1'
    """
    known = list(known)
    for name in names:
        if not pattern.fullmatch(name):
            msg = f"unknown {kind} {name!r}"
            raise InputError(msg, hint=hint)
        if name not in known:
            raise UnknownNameError(kind, name, known)


class BudgetExceededError(CostguardError):
    """The cheapest option is over the budget the user gave (exit code 1)."""


class StoreError(CostguardError):
    """A checkpoint store operation failed after its retries (the data may be fine)."""


class TooLargeError(StoreError):
    """An object longer than the most its reader accepts (``Store.get``)."""


class NoStoreError(StoreError):
    """A local store folder that a reading command was given and that does not exist:
    nothing to read, and nothing made (bad input: exit 2)."""

    exit_code = EXIT_BAD_INPUT


class NotAnObjectError(StoreError):
    """A path of a local store that is no regular file (a FIFO, a device, a folder): never
    opened, since reading a FIFO waits for a writer forever (bad input: exit 2)."""

    exit_code = EXIT_BAD_INPUT


#: What each optional extra brings, in the words a person installing it would use.
EXTRAS = {
    "aws": "the AWS SDK, boto3",
    "gcp": "the Google Cloud client libraries",
    "azure": "the Azure SDK",
    "billing": "pyarrow, to read billing exports",
    "stores": "the fsspec storage backends: s3fs, gcsfs, adlfs",
    "train": "torch and the fsspec storage backends",
    "pandas": "pandas",
    "plot": "matplotlib",
    "transformers": "Hugging Face transformers and accelerate",
    "lightning": "PyTorch Lightning",
}


#: The extras that bring torch, and the line that installs its CPU build first (a laptop,
#: CI: no CUDA wheels), as the README's install section does.
TORCH_EXTRAS = frozenset({"train", "transformers", "lightning", "all"})
CPU_TORCH = (
    "without a CUDA GPU, first: `pip install torch --index-url "
    "https://download.pytorch.org/whl/cpu` (the CPU build)"
)


class MissingDependencyError(CostguardError):
    """An optional dependency (a cloud SDK, torch) is not installed.

    The message names the extra that installs it, not the module that failed to import
    (which is an implementation detail, e.g. ``botocore.exceptions``).
    """

    def __init__(self, module: str, extra: str) -> None:
        what = EXTRAS.get(extra, module.split(".")[0])
        hint = (
            f'in the costguard checkout: pip install ".[{extra}]" (the name costguard on PyPI '
            "is another project)"
        )
        if extra in TORCH_EXTRAS:  # from PyPI, torch on Linux is the CUDA build: gigabytes
            hint = f"{CPU_TORCH}, then {hint[0].lower()}{hint[1:]}"
        super().__init__(
            f"this needs costguard's [{extra}] extra ({what}), which is not installed",
            hint=hint,
        )
        self.module = module
        self.extra = extra


def did_you_mean(name: str, known: Iterable[str]) -> str | None:
    """Suggest close matches for ``name`` among ``known`` (case-insensitive).

    >>> did_you_mean("h10", ["H100", "H200", "L4"])
    'did you mean H100?'
    """
    import difflib  # on error paths only: not worth its import on every run

    by_lower = {k.lower(): k for k in known}
    matches = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)
    if not matches:
        return None
    names = [by_lower[m] for m in matches]
    return "did you mean " + " or ".join(names) + "?"


class StalePricesWarning(UserWarning):
    """The prices an answer used are older than their limit (``costguard pricing refresh``
    updates them): the notebook API's form of the CLI's stale-price ``Warning:`` line."""
