"""Keep credentials out of what costguard prints, logs, reports and writes into scripts.

The one place that knows what a secret looks like:

* :func:`shapes` - credentials recognisable by their form wherever they appear: cloud keys
  (AWS, Azure, GCP service-account JSON), tokens (Hugging Face ``hf_``, GitHub ``ghp_`` and
  ``github_pat_``, GitLab, Slack ``xox*``, OpenAI-style ``sk-``), signed URLs (S3, GCS,
  Azure SAS ``sig=``), ``https://user:pass@`` URLs and private keys.
  :func:`find_shape` names the first one in a text.
* :func:`find_env_value` - the value of a credential-like environment variable
  (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``...) inside a list of words, compared with the
  words themselves, never with a shell-quoted rendering of them (quoting rewrites a ``'``).
* :func:`redact` masks both kinds of URL credential (:func:`redact_url`) and every shape
  in free text, so a line can be printed or logged whatever it quotes;
  :func:`install_log_redaction` applies it to every ``costguard.*`` log record.

A URL may carry a credential in two places: its userinfo (``s3://KEY:SECRET@bucket/p``,
``https://user:pass@host/x``) and its query string (Azure SAS ``?sv=...&sig=...``, S3 and
GCS signed URLs ``?X-Amz-Signature=...``, ``?X-Goog-Signature=...``).

>>> redact_url("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/run1")
's3://***@bucket/run1'
>>> redact("GET az://c/p?sv=2024&sig=abc%2F failed: timeout")
'GET az://c/p?*** failed: timeout'
>>> redact("python train.py --token hf_abcdefghijklmnopqrstuvwxyz0123456789")
'python train.py --token ***'
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

MASK = "***"

#: A URL in free text: a scheme, ``://``, then everything up to white space or a quote.
_URL_IN_TEXT = re.compile(r"""\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'"<>]+""")
#: ``scheme://userinfo@`` at the start of a URL (userinfo has no ``/``).
_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#]*@")


@functools.cache
def shapes() -> tuple[tuple[re.Pattern[str], str], ...]:
    """Credentials recognisable by their shape: (pattern, what it is). Formats from the
    issuers' documentation: AWS "Understanding unique ID prefixes" (AKIA/ASIA), Hugging Face
    "User access tokens" (hf_), GitHub "About authentication" (ghp_, gho_, ghu_, ghs_, ghr_,
    github_pat_), GitLab "Personal access tokens" (glpat-), Slack "Token types" (xoxb-,
    xoxp-, xoxa-, xoxr-, xoxs-, xoxe-), OpenAI API keys (sk-, sk-proj-), Google API keys
    (AIza), Azure Storage connection strings (AccountKey=) and SAS (sig=), Entra ID client
    secrets (three characters, a digit, "Q~"), S3 SigV4 and GCS V4 signed URLs.

    Compiled on first use, not on import: ``costguard estimate`` never needs them
    unless something goes wrong, and compiling them costs more than the rest of the module.
    """
    return (
        (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "an AWS access key id"),
        (
            re.compile(r"aws_secret_access_key\s*[=:]\s*\S{16,}", re.IGNORECASE),
            "an AWS secret access key",
        ),
        (
            re.compile(
                r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:.*?-----END [A-Z ]*PRIVATE KEY-----|.*)",
                re.DOTALL,
            ),
            "a private key",
        ),
        (
            re.compile(
                r'"(?:private_key|private_key_id)"\s*:\s*"[^"]*"?|"type"\s*:\s*"service_account"'
            ),
            "a GCP service account key file",
        ),
        (re.compile(r"AccountKey=[^;\s'\"]*", re.IGNORECASE), "an Azure storage account key"),
        (re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{86}=="), "an Azure storage account key"),
        (
            re.compile(r"\b[A-Za-z0-9_~.-]{3}[0-9]Q~[A-Za-z0-9_~.-]{31,34}"),
            "an Azure client secret",
        ),
        (re.compile(r"(?:^|(?<=[?&\s'\";]))sig=[^&\s'\"]{8,}", re.IGNORECASE), "a SAS signature"),
        (
            re.compile(
                r"X-(?:Amz|Goog)-(?:Signature|Credential|Security-Token)=[^&\s'\"]*", re.IGNORECASE
            ),
            "a signed URL",
        ),
        (
            re.compile(
                r"[?&](?:Signature|GoogleAccessId|AWSAccessKeyId)=[^&\s'\"]*", re.IGNORECASE
            ),
            "a signed URL",
        ),
        (
            re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@'\"]+:[^/\s@'\"]+@"),
            "a user name and password in a URL",
        ),
        (re.compile(r"\bhf_[A-Za-z0-9]{30,}"), "a Hugging Face token"),
        (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"), "a GitHub token"),
        (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{30,}"), "a GitHub token"),
        (re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"), "a GitLab token"),
        (re.compile(r"\bxox[abeoprs]-[A-Za-z0-9-]{10,}"), "a Slack token"),
        (re.compile(r"hooks\.slack\.com/services/[A-Za-z0-9/]{20,}"), "a Slack webhook"),
        (re.compile(r"\bsk-(?:[a-z]+-)?[A-Za-z0-9_-]{20,}"), "an API key (sk-...)"),
        (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), "a Google API key"),
    )


#: Environment variable names that hold credentials.
SECRET_NAME = re.compile(
    r"SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|ACCESS_KEY|ACCOUNT_KEY|"
    r"CONNECTION_STRING|SAS|_KEY$|^KEY$",
    re.IGNORECASE,
)
#: Secret values shorter than this are too common to search for ("true", "1").
MIN_SECRET_CHARS = 8


def redact_url(url: str) -> str:
    """``url`` with its userinfo and its query string masked; the rest kept, so the user
    still sees which bucket and folder is meant.

    >>> redact_url("https://me:hunter2@example.com/x?token=1#frag")
    'https://***@example.com/x?***#frag'
    >>> redact_url("gs://bucket/run1")
    'gs://bucket/run1'
    >>> redact_url("/local/folder")
    '/local/folder'
    """
    masked = _USERINFO.sub(rf"\1{MASK}@", url)
    head, sep, tail = masked.partition("?")
    if sep:
        _, hash_sep, fragment = tail.partition("#")
        masked = f"{head}?{MASK}{hash_sep}{fragment}"
    return masked


def redact(text: str) -> str:
    """``text`` with every URL in it passed through :func:`redact_url` and every secret
    shape (:func:`shapes`) masked.

    >>> redact("no url here")
    'no url here'
    >>> redact("retrying s3://K:S@b/p (attempt 2)")
    'retrying s3://***@b/p (attempt 2)'
    >>> redact("key AKIAABCDEFGHIJKLMNOP refused")
    'key *** refused'
    """
    text = _URL_IN_TEXT.sub(lambda found: redact_url(found[0]), text)
    for pattern, _ in shapes():
        text = pattern.sub(MASK, text)
    return text


def url_has_credentials(url: str) -> bool:
    """Whether ``url`` carries userinfo or a query string (either may be a credential).

    >>> url_has_credentials("s3://bucket/p"), url_has_credentials("az://c/p?sig=x")
    (False, True)
    """
    parts = urlsplit(url)
    return bool(parts.username or parts.password or parts.query)


def find_shape(text: str) -> str | None:
    """What credential ``text`` contains, by its shape (never the value), or ``None``.

    >>> find_shape("--token ghp_" + "a" * 36)
    'a GitHub token'
    >>> find_shape("python train.py --lr 3e-4") is None
    True
    """
    for pattern, what in shapes():
        if pattern.search(text):
            return what
    return None


def find_env_value(words: Iterable[str], environ: Mapping[str, str]) -> str | None:
    """The name of a credential-like variable of ``environ`` whose value is inside one of
    ``words`` (compared as they are, before any shell quoting), or ``None``.

    >>> find_env_value(["--key", "it's-a-secret"], {"API_TOKEN": "it's-a-secret"})
    'API_TOKEN'
    >>> find_env_value(["--lr", "3e-4"], {"AWS_SECRET_ACCESS_KEY": "abcdefgh1234"}) is None
    True
    """
    values = [
        (name, value.strip())
        for name, value in sorted(environ.items())
        if SECRET_NAME.search(name) and len(value.strip()) >= MIN_SECRET_CHARS
    ]
    for word in words:
        for name, value in values:
            if value in word:
                return name
    return None


def find_secret(
    places: Mapping[str, Iterable[str]], environ: Mapping[str, str]
) -> tuple[str, str] | None:
    """Where a secret is among ``places`` (a description of each place -> its words) and
    what it is: ``(place, what)``, never the value; ``None`` when there is none.

    >>> find_secret({"argument 3 of the command": ["hf_" + "x" * 34]}, {})
    ('argument 3 of the command', 'a Hugging Face token')
    >>> find_secret({"the checkpoint URL": ["s3://b/run"]}, {"HF_TOKEN": "s3://b/run"})
    ('the checkpoint URL', 'the value of HF_TOKEN')
    """
    for place, words in places.items():
        listed = list(words)
        name = find_env_value(listed, environ)
        if name:
            return place, f"the value of {name}"
        for word in listed:
            what = find_shape(word)
            if what:
                return place, what
    return None


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
    """Mask secrets (:func:`redact`) in every log record of a ``costguard.*`` logger, in
    this process, whatever handler prints it. Idempotent."""
    factory = logging.getLogRecordFactory()
    if not isinstance(factory, _RedactingFactory):
        logging.setLogRecordFactory(_RedactingFactory(factory))
