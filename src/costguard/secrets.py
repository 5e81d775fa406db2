"""Keep credentials out of what costguard prints, logs and reports.

A URL may carry a credential in two places: its userinfo (``s3://KEY:SECRET@bucket/p``,
``https://user:pass@host/x``) and its query string (Azure SAS ``?sv=...&sig=...``, S3 and
GCS signed URLs ``?X-Amz-Signature=...``, ``?X-Goog-Signature=...``). :func:`redact_url`
masks both in one URL; :func:`redact` masks them wherever a URL appears in free text (an
exception message from a storage SDK, a log line), so a line can be printed whatever it
quotes.

>>> redact_url("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/run1")
's3://***@bucket/run1'
>>> redact("GET az://c/p?sv=2024&sig=abc%2F failed: timeout")
'GET az://c/p?*** failed: timeout'
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

MASK = "***"

#: A URL in free text: a scheme, ``://``, then everything up to white space or a quote.
_URL_IN_TEXT = re.compile(r"""\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'"<>]+""")
#: ``scheme://userinfo@`` at the start of a URL (userinfo has no ``/``).
_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#]*@")


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
    """``text`` with every URL in it passed through :func:`redact_url`.

    >>> redact("no url here")
    'no url here'
    >>> redact("retrying s3://K:S@b/p (attempt 2)")
    'retrying s3://***@b/p (attempt 2)'
    """
    return _URL_IN_TEXT.sub(lambda found: redact_url(found[0]), text)


def url_has_credentials(url: str) -> bool:
    """Whether ``url`` carries userinfo or a query string (either may be a credential).

    >>> url_has_credentials("s3://bucket/p"), url_has_credentials("az://c/p?sig=x")
    (False, True)
    """
    parts = urlsplit(url)
    return bool(parts.username or parts.password or parts.query)
