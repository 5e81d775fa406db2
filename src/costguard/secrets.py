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
  :func:`costguard.logs.install_log_redaction` applies it to every ``costguard.*`` log
  record.

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
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
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
        (re.compile(r"\bya29\.[0-9A-Za-z_-]{20,}"), "a Google OAuth access token"),
        (re.compile(r"\bpypi-[0-9A-Za-z_-]{40,}"), "a PyPI token"),
        (re.compile(r"\bnpm_[A-Za-z0-9]{36}"), "an npm token"),
        (re.compile(r"\b[rs]k_(?:live|test)_[0-9A-Za-z]{20,}"), "a Stripe key"),
        (re.compile(r"\br8_[0-9A-Za-z]{30,}"), "a Replicate token"),
        (re.compile(r"\bdapi[0-9a-f]{32}(?:-[0-9]+)?"), "a Databricks token"),
        (
            re.compile(r"\beyJ[0-9A-Za-z_-]{8,}\.eyJ[0-9A-Za-z_-]{8,}\.[0-9A-Za-z_-]*"),
            "a JSON web token",
        ),
        (
            re.compile(
                r"\bBearer[ \t]+(?=[\w.~+/=-]*[0-9])[\w.~+/=-]{8,}", re.IGNORECASE | re.ASCII
            ),
            "a bearer token",
        ),
    )


#: Words of a flag or variable name that make its value a credential, whatever it is.
_ALWAYS_SECRET = ("password", "passwd", "passphrase", "secret", "credential", "credentials")
#: Words that make it one when the value also looks random (``--label-key labels`` is
#: not one, ``--wandb-key`` followed by 40 hex digits is).
_KEY_WORDS = ("key", "token", "apikey", "accesskey", "secretkey", "auth", "pat", "sas", "bearer")
#: Words of a command line after which the next word is a credential, as after a flag.
_HEADER_WORDS = ("bearer", "authorization:", "token:")
#: A last word that makes the value where a credential is, not the credential.
_REFERENCE_WORDS = frozenset(
    {"file", "path", "dir", "env", "var", "name", "id", "type", "len", "length", "size"}
    | {"count", "limit", "column", "field", "prefix", "url", "arn", "ref", "header"}
)
#: A flag, a ``NAME=value`` word's name, or a ``name: value`` key in free text that
#: mentions one of the words above (the full rule is :func:`secret_name_kind`).
_NAMED_IN_TEXT = re.compile(
    r"""(?P<name>(?<![\w.-])-{0,2}(?=[A-Za-z_])[\w.-]{0,64}?"""
    r"""(?:key|token|secret|passw|passphrase|credential|auth|pat|sas|bearer)[\w.-]{0,64})["']?"""
    r"""(?P<sep>[ \t]*[=:][ \t]*|[ \t]+)(?P<value>"[^"\n]*"|'[^'\n]*'|[^\s'",;&-][^\s'",;&]*)""",
    re.IGNORECASE | re.ASCII,
)
#: Runs of characters a random credential is made of (base64, hex).
_RANDOM_RUN = re.compile(r"[A-Za-z0-9+/=]{16,}")
_NAME_WORD = re.compile(r"[a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_VARIABLE = re.compile(r"-{0,2}[A-Za-z_][A-Za-z0-9_.-]*")


def secret_name_kind(name: str) -> str | None:
    """Whether a flag or variable name says its value is a credential: ``"always"``
    (password, secret, credential: any value is one), ``"random"`` (key, token, auth: a
    random-looking value is one) or ``None``. A last word such as ``file`` or ``name``
    says where the credential is, not what it is.

    >>> [secret_name_kind(n) for n in ("--db-password", "WANDB_API_KEY", "--hfToken")]
    ['always', 'random', 'random']
    >>> [secret_name_kind(n) for n in ("--max-tokens", "--tokenizer", "--key-file", "--lr")]
    [None, None, None, None]
    >>> secret_name_kind("ssh_public_key"), secret_name_kind("--public-key")
    (None, None)
    """
    words = _NAME_WORD.findall(_CAMEL.sub("_", name.lstrip("-")).lower())
    if not words or words[-1] in _REFERENCE_WORDS or "public" in words:
        return None  # where a credential is; or a public key (an SSH key's public half)
    if any(word.endswith(_ALWAYS_SECRET) for word in words):
        return "always"
    if any(word in _KEY_WORDS or word.endswith(("token", "apikey", "accesskey")) for word in words):
        return "random"
    return None


def looks_random(value: str) -> bool:
    """Whether ``value`` holds a run of 16 or more base64/hex characters mixing letters
    and digits (or 32 of any of them): a key, not a word, a path or a model's name.

    >>> looks_random("0123456789abcdef0123456789abcdef01234567"), looks_random("labels")
    (True, False)
    >>> looks_random("wikitext-103-raw-v1"), looks_random("/data/alice2/tokenizer_v2.json")
    (False, False)
    """
    if value.startswith("$") or "://" in value:
        return False
    # A path's segments are judged one by one: /data/alice/tokenizer.json is not a key.
    runs = _RANDOM_RUN.findall(value.replace("/", " ") if value[:1] in "/.~" else value)
    for run in runs:
        if len(run) >= 32 or (any(c.isdigit() for c in run) and any(c.isalpha() for c in run)):
            return True
    return False


def _named_secret(name: str, value: str) -> bool:
    """Whether ``value``, given after the flag or variable ``name``, is a credential."""
    kind = secret_name_kind(name)
    value = value.strip().strip("'\"")
    if kind is None or not value or value.startswith("$"):
        return False
    return kind == "always" or looks_random(value)


def _word_secrets(words: Sequence[str]) -> Iterator[tuple[int, str, str]]:
    """Each word of ``words`` that is or holds a credential: ``(index, what, masked word)``.

    A word is one by its shape (:func:`shapes`), as the value after a flag whose name
    says so (``--wandb-key 0123...``) or as the value of ``NAME=value`` or ``--name=value``
    (``WANDB_API_KEY=...``, ``password=...``)."""
    flag = ""
    for index, word in enumerate(words):
        after, flag = flag, ""
        name, sep, value = word.partition("=")
        if after and not word.startswith("-") and _named_secret(after, word):
            yield index, f"a credential after {after}", MASK
        elif sep and _VARIABLE.fullmatch(name) and _named_secret(name, value):
            yield index, f"a credential in {name}=", f"{name}={MASK}"
        elif (what := find_shape(word)) is not None:
            yield index, what, redact(word)
        elif (word.startswith("-") and not sep) or word.lower() in _HEADER_WORDS:
            flag = word


def find_in_words(words: Sequence[str]) -> tuple[int, str] | None:
    """The index of the first word of ``words`` (a command line) that is or holds a
    credential, and what it is (never the value); ``None`` when none is.

    >>> find_in_words(["python", "t.py", "--wandb-key", "0123456789abcdef" * 2 + "01234567"])
    (3, 'a credential after --wandb-key')
    >>> find_in_words(["python", "t.py", "--label-key", "labels", "--max-tokens", "512"])
    """
    for index, what, _ in _word_secrets(words):
        return index, what
    return None


def mask_words(words: Sequence[str]) -> list[str]:
    """``words`` with every credential in them masked, the rest as it was.

    >>> mask_words(["python", "t.py", "--hf-token", "hf_" + "x" * 34, "--lr", "3e-4"])
    ['python', 't.py', '--hf-token', '***', '--lr', '3e-4']
    >>> mask_words(["env", "WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567", "t"])
    ['env', 'WANDB_API_KEY=***', 't']
    """
    shown = [redact(word) for word in words]
    for index, _, masked in _word_secrets(words):
        shown[index] = masked
    return shown


def _mask_named(found: re.Match[str]) -> str:
    name, sep, value = found["name"], found["sep"], found["value"]
    if not sep.strip() and not name.startswith("-"):
        return found[0]  # "the token expired": only a flag takes its value after a space
    if not _named_secret(name, value):
        return found[0]
    quote = value[0] if value[0] in "'\"" else ""
    return f"{found[0][: found.start('value') - found.start()]}{quote}{MASK}{quote}"


#: Environment variable names that hold credentials.
SECRET_NAME = re.compile(
    r"SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|ACCESS_KEY|ACCOUNT_KEY|"
    r"CONNECTION_STRING|SAS|_KEY\s*\Z|\A\s*KEY\s*\Z",
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
    return _NAMED_IN_TEXT.sub(_mask_named, text)


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
        found = find_in_words(listed)
        if found:
            return place, found[1]
    return None
