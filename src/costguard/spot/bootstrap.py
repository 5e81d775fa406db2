"""The boot script every cloud instance of a job runs: install, then ``costguard run``.

One template, ``infra/bootstrap/user-data.sh`` (shipped in the wheel as
``costguard/_bootstrap``), serves as AWS user-data, the GCP ``startup-script`` metadata
value and Azure ``customData`` (cloud-init runs a ``#!`` script as it is). It installs the
environment (``pixi`` when the code has a ``pixi.toml``, else a venv) with costguard in it -
the wheel ``costguard launch`` put next to the job in the checkpoint store, fetched with
the instance's own identity and installed only if its sha256 matches
(:mod:`costguard.spot.wheel`), never the bare name ``costguard`` from the public index,
which is someone else's project - then runs ``costguard run --checkpoint URL [--sync-dir DIR] --
<command>`` with ``COSTGUARD_JOB_ID`` and ``COSTGUARD_JOB_ATTEMPT`` exported (and a task of
an array's ``COSTGUARD_ARRAY_TASK_ID``).

Every value that reaches the script is one shell word quoted by :mod:`shlex`, so a command
like ``python train.py --note "it's $HOME"`` arrives byte for byte. No secret ever goes
in: the instance reaches the checkpoint store with its own role, service account or
managed identity, :func:`check_options` refuses URLs that carry credentials, and
:func:`render` refuses a script that contains the value of any credential-like variable
of the launching environment.

Options read from :attr:`LaunchSpec.options <costguard.spot.launcher.base.LaunchSpec>`:
``workdir`` (default ``/opt/costguard/work``), ``git_repo`` and ``git_ref`` (code to clone
there; https without credentials), ``wheel`` and ``wheel_sha256`` (the shipped wheel's
file name in the store's ``job/`` folder and its hash; set by ``costguard launch``),
``package`` (what pip installs instead, e.g. ``costguard[train] @ git+https://...``),
``shutdown_minutes`` (guest shutdown that long after the job exits,
the safety net when no controller is left; default 10, ``never`` to keep it up),
``index_url`` (the site's package mirror, http(s) without credentials: exported as
``PIP_INDEX_URL`` and ``UV_DEFAULT_INDEX``, so pip and uv need no public index).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

from costguard.errors import CostguardError, InputError
from costguard.gang import torchrun_args
from costguard.secrets import find_in_words, find_secret
from costguard.spot.launcher.base import LaunchSpec
from costguard.spot.wheel import STORE_DIR

TEMPLATE = "user-data.sh"
#: The most each provider accepts, in bytes of the script before any base64 encoding:
#: AWS user-data 16 KB, a GCP metadata value 256 KB, Azure customData 65535 bytes decoded.
MAX_BYTES = {"aws": 16 * 1024, "gcp": 256 * 1024, "azure": 65535, "local": 1024 * 1024}
DEFAULT_WORKDIR = "/opt/costguard/work"
DEFAULT_SHUTDOWN_MINUTES = "10"
#: The options this module reads; adapters add their own.
OPTIONS = ("workdir", "git_repo", "git_ref", "package", "shutdown_minutes", "wheel",
           "wheel_sha256", "index_url")  # fmt: skip
#: Where the boot script keeps the wheel it fetched.
WHEEL_DIR = "/opt/costguard"
#: What fetches the wheel from the store, per URL scheme: the fsspec backend (the train
#: extra's floors), installed from the index under its own, well-known name.
FETCHERS = {
    "s3": "s3fs>=2026.9", "s3a": "s3fs>=2026.9", "gs": "gcsfs>=2026.9", "gcs": "gcsfs>=2026.9",
    "az": "adlfs>=2026.8", "abfs": "adlfs>=2026.8", "abfss": "adlfs>=2026.8",
}  # fmt: skip
#: Where a gang's nodes meet: torchrun's c10d store on node 0, at torchrun's own default
#: port (each node is a whole instance, so no other job shares it).
RDZV_PORT = 29500
#: The ports the collectives use between a gang's nodes: gloo and NCCL listen on port 0,
#: so the kernel picks one from Linux's default ephemeral range
#: (``net.ipv4.ip_local_port_range``). With :data:`RDZV_PORT`, all a gang's firewall opens,
#: and only between its own nodes.
COLLECTIVE_PORTS = (32768, 60999)
_WHEEL_NAME = re.compile(r"costguard-[0-9A-Za-z.+!_]+-py3-none-any\.whl", re.ASCII)
_SHA256 = re.compile(r"[0-9a-f]{64}", re.ASCII)

_PLACEHOLDER = re.compile(r"\{\{ (\w+) \}\}")
_ABSOLUTE = re.compile(r"/[A-Za-z0-9._/-]*")


def template_dir() -> Path:
    """Where the bootstrap templates are: ``costguard/_bootstrap`` in a wheel, else
    ``infra/bootstrap`` of the source checkout (editable install)."""
    packaged = Path(str(resources.files("costguard"))) / "_bootstrap"
    if (packaged / TEMPLATE).is_file():
        return packaged
    checkout = Path(__file__).resolve().parents[3] / "infra" / "bootstrap"
    if (checkout / TEMPLATE).is_file():
        return checkout
    msg = "the bootstrap templates are missing from this installation of costguard"
    raise CostguardError(msg, hint="reinstall it: pip install --force-reinstall . in its checkout")


def fill(template: str, words: Mapping[str, str]) -> str:
    """``template`` with every ``{{ name }}`` replaced by ``words[name]``, which the caller
    has already quoted; a placeholder without a word, or a word without a placeholder, is
    a bug caught here rather than on the instance.

    >>> fill("echo {{ a }}", {"a": "'x y'"})
    "echo 'x y'"
    >>> fill("echo {{ b }}", {"a": "x"})
    Traceback (most recent call last):
    ...
    costguard.errors.CostguardError: the bootstrap template needs b, which has no value
    """
    used = set(_PLACEHOLDER.findall(template))
    missing = sorted(used - set(words))
    if missing:
        msg = f"the bootstrap template needs {', '.join(missing)}, which has no value"
        raise CostguardError(msg, hint="the template and costguard do not match: reinstall")
    unused = sorted(set(words) - used)
    if unused:
        msg = f"the bootstrap template has no place for {', '.join(unused)}"
        raise CostguardError(msg, hint="the template and costguard do not match: reinstall")
    return _PLACEHOLDER.sub(lambda found: words[found[1]], template)


def url_secret(url: str) -> str | None:
    """Why ``url`` must not go into user-data (it carries a credential), or ``None``.

    >>> url_secret("s3://bucket/runs/1") is None
    True
    >>> url_secret("https://me:hunter2@example.com/x")
    'a user name or password'
    >>> url_secret("az://c/p?sv=2024&sig=abc")
    'a query string (SAS tokens and signed URLs are credentials)'
    """
    parts = urlsplit(url)
    if parts.username or parts.password:
        return "a user name or password"
    if parts.query:
        return "a query string (SAS tokens and signed URLs are credentials)"
    return None


def check_options(spec: LaunchSpec) -> None:
    """Refuse what would make a broken or leaky boot script, before any cloud call.

    >>> from datetime import datetime, UTC
    >>> spec = LaunchSpec("j1", "s3://b/j1", ("python", "t.py"), "me", datetime.now(UTC),
    ...                   options={"workdir": "relative/dir"})
    >>> check_options(spec)
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: the workdir option must be an absolute path, not 'relative/dir'
    """
    if not spec.command:
        msg = "no command to run on the instance"
        raise InputError(msg, hint="put it after --, e.g. -- python train.py")
    if "://" not in spec.checkpoint_url:
        msg = f"the checkpoint URL {spec.checkpoint_url!r} is a local path"
        raise InputError(
            msg, hint="a cloud instance needs a bucket: s3://..., gs://... or az://..."
        )
    for name, value in (
        ("checkpoint URL", spec.checkpoint_url),
        ("git_repo option", spec.options.get("git_repo", "")),
    ):
        why = url_secret(value)
        if why:
            msg = f"the {name} carries {why}, which would be written into the user-data"
            raise InputError(msg, hint="give the instance a role/service account/identity instead")
    repo = spec.options.get("git_repo", "")
    if repo and urlsplit(repo).scheme != "https":
        # http:// and git:// are neither authenticated nor protected from tampering.
        msg = f"the git_repo option must be an https:// URL, not {repo!r}"
        raise InputError(msg, hint="a public repository, or one the instance may read")
    index_url = spec.options.get("index_url", "")
    if index_url and (
        urlsplit(index_url).scheme not in ("http", "https")
        or not urlsplit(index_url).netloc
        or any(c.isspace() or not c.isprintable() for c in index_url)
    ):
        msg = f"the index_url option must be an http(s) URL, not {index_url[:200]!r}"
        raise InputError(
            msg, hint="the mirror's simple index, e.g. https://pypi.example.edu/simple/"
        )
    why = url_secret(index_url) if index_url else None
    if why:
        msg = f"the index_url option carries {why}, which would be written into the user-data"
        raise InputError(msg, hint="a mirror the instance reaches without credentials in the URL")
    workdir = spec.options.get("workdir", DEFAULT_WORKDIR)
    if not _ABSOLUTE.fullmatch(workdir) or "/../" in f"{workdir}/":
        msg = f"the workdir option must be an absolute path, not {workdir!r}"
        raise InputError(msg, hint=f"e.g. workdir={DEFAULT_WORKDIR}")
    wheel, digest = spec.options.get("wheel", ""), spec.options.get("wheel_sha256", "")
    if (wheel or digest) and not (_WHEEL_NAME.fullmatch(wheel) and _SHA256.fullmatch(digest)):
        msg = "the wheel and wheel_sha256 options must name a costguard wheel and its sha256"
        raise InputError(msg, hint="costguard launch sets both itself; or --option package=...")
    shutdown = spec.options.get("shutdown_minutes", DEFAULT_SHUTDOWN_MINUTES)
    if shutdown != "never" and not (shutdown.isdigit() and int(shutdown) <= 24 * 60):
        msg = f"the shutdown_minutes option must be 0..1440 or never, not {shutdown!r}"
        raise InputError(msg, hint="minutes after the job exits before the guest shuts down")


def refuse_secrets(
    command: Sequence[str],
    options: Mapping[str, str],
    checkpoint_url: str,
    environ: Mapping[str, str],
    script: str = "",
    *,
    sync_dir: str | None = None,
) -> None:
    """Refuse a job whose boot script would carry a credential, naming where it is (an
    argument of the command, an option, the checkpoint URL, ``--sync-dir``), never its
    value.

    The values the user gave are searched as they are, before shell quoting (which
    rewrites a ``'``); the rendered ``script``, when given, is searched too. ``costguard
    launch`` calls this before anything is opened or launched.
    """
    places: dict[str, list[str]] = {"the checkpoint URL": [checkpoint_url]}
    if sync_dir:
        places["--sync-dir"] = [sync_dir]
    for number, word in enumerate(command, start=1):
        places[f"argument {number} of the command"] = [word]
    for name, value in sorted(options.items()):
        places[f"the {name} option"] = [f"{name}={value}", value]
    if script:
        places["the boot script"] = [script]
    in_command = find_in_words(command)  # a value after its flag: --wandb-key 0123...
    found = find_secret(places, environ) or (
        in_command and (f"argument {in_command[0] + 1} of the command", in_command[1])
    )
    if found:
        place, what = found
        msg = f"{place} carries {what}, which would be written into the boot script"
        raise InputError(
            msg,
            hint="pass secrets through the instance's role/service account/identity or a "
            "secret manager, never on the command line",
        )


def render(
    spec: LaunchSpec, attempt: int, cloud: str, *, environ: Mapping[str, str] | None = None
) -> str:
    """The boot script of attempt ``attempt`` of ``spec`` on ``cloud``, checked.

    ``environ`` is only searched for secrets that must not be in the script (default: this
    process's environment); nothing is copied from it.
    """
    check_options(spec)
    if cloud not in MAX_BYTES:
        msg = f"no bootstrap for provider {cloud!r}"
        raise InputError(msg, hint=f"one of {', '.join(sorted(MAX_BYTES))}")
    options = spec.options
    words = {
        "job_id": shlex.quote(spec.job_id),
        "attempt": shlex.quote(str(attempt)),
        "stop_check": "''",  # after the search for secrets (a digest looks like one)
        "cloud": shlex.quote(cloud),
        "array_task": shlex.quote("" if spec.array_task is None else str(spec.array_task)),
        "workdir": shlex.quote(options.get("workdir", DEFAULT_WORKDIR)),
        "git_repo": shlex.quote(options.get("git_repo", "")),
        "git_ref": shlex.quote(options.get("git_ref", "")),
        "package": shlex.quote(options.get("package", "")),
        "index_url": shlex.quote(options.get("index_url", "")),
        **_wheel_words(spec),
        "shutdown_minutes": shlex.quote(options.get("shutdown_minutes", DEFAULT_SHUTDOWN_MINUTES)),
        "checkpoint_url": shlex.quote(spec.checkpoint_url),
        "run_options": shlex.join(spec.run_options()),
        "command": shlex.join(spec.command),
        # A gang's nodes: torchrun's words (the node's rank and the rendezvous are read
        # on the instance, from its own metadata: costguard.spot.node).
        "nodes": shlex.quote(str(spec.nodes)),
        # torchrun's own "gpu": one process per GPU when --procs-per-node is not given.
        "torchrun": shlex.join(
            torchrun_args(["torchrun"], spec.nodes, spec.procs_per_node or "gpu")
        ),
        "launcher": '"${LAUNCHER[@]}" ' if spec.nodes > 1 else "",
    }
    text = fill((template_dir() / TEMPLATE).read_text(encoding="utf-8"), words)
    environ = os.environ if environ is None else environ
    refuse_secrets(
        spec.command, spec.options, spec.checkpoint_url, environ, text, sync_dir=spec.sync_dir
    )
    text = text.replace(
        "export COSTGUARD_STOP_CHECK=''",
        f"export COSTGUARD_STOP_CHECK={shlex.quote(spec.stop_check(attempt))}",
    )
    if spec.nodes > 1:  # a public key, after the search for secrets (it looks like one)
        text = text.replace("TOLD_KEY=''", f"TOLD_KEY={shlex.quote(spec.told_public(attempt))}")
    size = len(text.encode("utf-8"))
    if size > MAX_BYTES[cloud]:
        msg = f"the boot script is {size} bytes; {cloud} accepts at most {MAX_BYTES[cloud]}"
        raise InputError(msg, hint="shorten the command: put its arguments in a config file")
    return text


def _wheel_words(spec: LaunchSpec) -> dict[str, str]:
    """The template's words for the wheel shipped with the job (empty when there is none,
    or when the ``package`` option says what to install instead)."""
    name = spec.options.get("wheel", "")
    if not name or spec.options.get("package"):
        return {"wheel_url": "''", "wheel_sha256": "''", "wheel_file": "''", "fetcher": "''"}
    scheme = spec.checkpoint_url.split("://", 1)[0].lower()
    fetcher = FETCHERS.get(scheme)
    if fetcher is None:
        msg = f"the instance cannot fetch the costguard wheel from {scheme}:// storage"
        raise InputError(msg, hint="use s3://, gs:// or az:// (or --option package=...)")
    # One wheel for a whole array, next to the array's record, not one per task.
    home = spec.array_url or spec.checkpoint_url
    return {
        "wheel_url": shlex.quote(f"{home.rstrip('/')}/{STORE_DIR}/{name}"),
        "wheel_sha256": shlex.quote(spec.options["wheel_sha256"]),
        "wheel_file": shlex.quote(f"{WHEEL_DIR}/{name}"),
        "fetcher": shlex.quote(fetcher),
    }


# ----------------------------------------------------------------- options shared by adapters


def max_price(spec: LaunchSpec) -> Decimal | None:
    """The spot price cap in USD/h: ``--max-price`` (``spec.max_usd_per_hour``) or the
    ``max_price`` option; both may be given only if they agree. ``None``: no cap.

    >>> from datetime import datetime, UTC
    >>> spec = LaunchSpec("j", "s3://b/j", ("true",), "me", datetime.now(UTC),
    ...                   max_usd_per_hour=Decimal("0.5"), options={"max_price": "0.50"})
    >>> max_price(spec)
    Decimal('0.5')
    >>> from dataclasses import replace
    >>> max_price(replace(spec, options={"max_price": "0.6"}))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: --max-price 0.5 and the max_price option 0.6 disagree
    """
    text = spec.options.get("max_price", "").strip()
    option_cap = None
    if text:
        try:
            option_cap = Decimal(text)
        except InvalidOperation:
            option_cap = Decimal(-1)
        if not option_cap.is_finite() or option_cap <= 0:
            msg = f"the max_price option must be a positive USD/h amount, not {text!r}"
            raise InputError(msg, hint="e.g. max_price=1.20, or --max-price 1.20")
    cap = spec.max_usd_per_hour
    if option_cap is not None and cap is not None and option_cap != cap:
        msg = f"--max-price {cap} and the max_price option {text} disagree"
        raise InputError(msg, hint="give the spot price cap once: --max-price")
    return cap if cap is not None else option_cap


def resource_name(job_id: str, attempt: int, max_chars: int) -> str:
    """A name for the instance of one attempt, valid on GCP and Azure: lower case letters,
    digits and ``-``, starting with a letter, the attempt always kept.

    >>> resource_name("Run_42/a", 3, 63)
    'costguard-run-42-a-3'
    >>> len(resource_name("x" * 100, 12, 63))
    63
    """
    suffix = f"-{attempt}"
    stem = re.sub(r"[^a-z0-9]+", "-", job_id.lower()).strip("-") or "job"
    stem = f"costguard-{stem}"[: max_chars - len(suffix)].rstrip("-")
    return stem + suffix
