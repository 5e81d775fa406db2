"""The sweep: every option of every command, fed hostile values, refuses them cleanly.

Walks the whole click tree. For every option or argument of a numeric, choice, duration,
URL, name or text type it tries NaN, infinities, 1e400, negatives, zero where the type
forbids it, the empty string, a trailing newline, control characters, 100 KB, and unicode
look-alikes. Each must exit 2 with one ``Error:`` line naming the option and a ``Hint:``
line, no traceback, no more than 200 characters of the value echoed, and no side effect:
no file written, no request to a loopback server every cloud endpoint and proxy points at,
no process left behind (issue 14).

A new option of a plain ``str``/``int``/``float`` type fails
:func:`test_every_option_has_a_checked_type`: give it a type from
:mod:`costguard.cli.params`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import click
import pytest
from click.testing import CliRunner

from costguard.cli import cli
from costguard.cli.params import (
    AzureSubscription,
    DecimalOrWord,
    DecimalRange,
    FiniteFloat,
    Name,
    Text,
    Url,
    WholeNumber,
)
from tests.servers.http import serving

#: Values no option of a kind may take. The 100 KB ones test that errors stay short.
LONG = "9" * 100_000
NUMBERS = ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "", "5\n", "5\x07",
           " 5", LONG, "\uff15", "1O", "0x10", "5%"]  # fmt: skip
NAMES = ["", "a100\n", "a\x1bb", "x" * 100_000, "\uff41\uff11\uff10\uff10", "a b", "a\u200bb",
         "\u0430100"]  # fmt: skip
TEXTS = ["", "a\nb", "x\x00y", "x" * 100_000, "a\u2028b"]
URLS = ["", "s3://", "gs:///path", "s3://b/p\n", "\uff53\uff13://bucket/x",
        "s3://\uff42ucket/x", "x" * 100_000, "s3://b\x1b/x", " s3://b/x"]  # fmt: skip
CHOICES = ["", "json\n", "\uff4aSON", "x" * 100_000, "table\x00"]
#: A trainer's output folder (--sync-dir) is none of these: a URL, a path leaving itself,
#: blank, a file (the sandbox holds one).
SYNC_DIRS = ["s3://bucket/out", "../out", "out/../../x", " ", "a-file"]

#: A valid invocation of each command, into which the hostile value is inserted; the
#: command part (after ``--``) stays last. Paths are relative to a fresh folder per case.
BASES: dict[str, tuple[list[str], list[str]]] = {
    "estimate": (["--gpu", "a10g", "--hours", "1"], []),
    "pricing show": ([], []),
    "pricing gpus": ([], []),
    "pricing check": ([], []),
    "pricing refresh": (["--from", "mirror", "--output", "out"], []),
    "alarm": (["--budget", "200", "--email", "a@example.com", "--dry-run"], []),
    "alarm status": ([], []),
    "alarm delete": ([], []),
    "burn": (["--budget", "100"], []),
    "reap": ([], []),
    "agent": (["--once", "--jobs-dir", "jobs"], []),
    "run": (["--checkpoint", "ckpt"], ["--", "python", "-c", "pass"]),
    "pilot": (["--steps", "20", "--checkpoint", "ckpt"], ["--", "python", "-c", "pass"]),
    "checkpoint ls": (["ckpt"], []),
    "checkpoint verify": (["ckpt"], []),
    "checkpoint export": (["ckpt", "--to", "model.pt"], []),
    "launch": (
        ["--provider", "local", "--gpu", "a10g", "--checkpoint", "ckpt", "--yes"],
        ["--", "python", "-c", "pass"],
    ),
    "jobs status": (["ckpt"], []),
    "jobs stop": (["ckpt"], []),
    "slurm script": (
        ["--time", "08:00:00", "--checkpoint", "s3://bucket/run1"],
        ["--", "python", "train.py"],
    ),
    "slurm submit": (
        ["--time", "08:00:00", "--checkpoint", "s3://bucket/run1"],
        ["--", "python", "train.py"],
    ),
    "spend": (["export.csv"], []),
}

#: Options and arguments left out of the sweep, with the reason.
NOT_SWEPT = {
    ("", "--pricing-dir"): "a folder of the user's own file system (click.Path)",
    ("pricing refresh", "--from"): "a folder of the user's own file system (click.Path)",
    ("pricing refresh", "--output"): "a folder of the user's own file system (click.Path)",
    ("agent", "--jobs-dir"): "a folder of the user's own file system (click.Path)",
    ("checkpoint export", "--to"): "a file of the user's own file system (click.Path)",
    ("burn", "--plot"): "a file of the user's own file system (click.Path)",
    ("jobs status", "--plot"): "a file of the user's own file system (click.Path)",
    ("spend", "--plot"): "a file of the user's own file system (click.Path)",
    ("pricing check", "--pricing-dir"): "a folder of the user's own file system (click.Path)",
}

#: Cases the sweep finds that are not fixed yet: (command, option) -> why.
EXPECTED_FAILURES: dict[tuple[str, str], str] = {}
QUICK_FAILURE = [""]


@dataclass(frozen=True)
class Case:
    command: str
    param: click.Parameter

    @property
    def key(self) -> tuple[str, str]:
        return (self.command, self.flag)

    @property
    def flag(self) -> str:
        if isinstance(self.param, click.Option):
            return max(self.param.opts, key=len)
        return str(self.param.name)


def walk(command: click.Command, path: str = "") -> Iterator[tuple[str, click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        # Through the group's own API: the command table loads a command's module only
        # when asked (its ``commands`` dict is empty until then).
        context = click.Context(command)
        for name in sorted(command.list_commands(context)):
            sub = command.get_command(context, name)
            if sub is not None:
                yield from walk(sub, f"{path} {name}".strip())


def cases() -> list[Case]:
    found = []
    for path, command in walk(cli):
        for param in command.params:
            if isinstance(param, click.Option) and (param.is_flag or param.is_bool_flag):
                continue
            if param.name in ("help", "version"):
                continue
            if isinstance(param.type, click.types.UnprocessedParamType):
                continue  # the command to run, after --
            found.append(Case(path, param))
    return found


def hostile(param: click.Parameter) -> list[str]:
    kind = param.type
    if isinstance(kind, DecimalOrWord):  # the number's cases, and look-alikes of the word
        words = [kind.word + "x", kind.word + "\n", " " + kind.word, kind.word[:-1]]
        return [*hostile(click.Option(["--n"], type=kind.number)), *words]
    if isinstance(kind, (WholeNumber, FiniteFloat, DecimalRange)):
        low: Any
        low_open: bool
        high: Any
        if isinstance(kind, DecimalRange):
            low, low_open, high = kind.minimum, kind.minimum_open, kind.maximum
        else:
            low, low_open, high = kind.min, kind.min_open, kind.max
        values = list(NUMBERS)
        if low is not None and (low > 0 or (low == 0 and low_open)):
            values.append("0")
        if low is not None and low >= 0:
            values += ["-1", "-0.5"]
        if high is not None:
            values.append(str(high * 10 + 1))
        if isinstance(kind, WholeNumber):
            values.append("1.5")
        return values
    if isinstance(kind, click.Choice):
        return CHOICES
    if param.name == "sync_dir":
        return [*TEXTS, *SYNC_DIRS]
    if isinstance(kind, (Name, AzureSubscription)):
        return NAMES
    if isinstance(kind, Text):
        return TEXTS
    if isinstance(kind, Url):
        return URLS
    return []


ALL = cases()


def test_every_option_has_a_checked_type() -> None:
    """Plain str/int/float options accept NaN, newlines and look-alikes: none is left."""
    unchecked = [
        case.key
        for case in ALL
        if not hostile(case.param)
        and case.key not in NOT_SWEPT
        and case.key not in EXPECTED_FAILURES
    ]
    assert unchecked == []
    assert {c.command for c in ALL} - {""} <= set(BASES), "add a valid base invocation"


class Counter(BaseHTTPRequestHandler):
    """Counts every request (and every CONNECT through it as a proxy); answers 503."""

    hits: ClassVar[list[str]] = []

    def _any(self) -> None:
        Counter.hits.append(f"{self.command} {self.path}")
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_CONNECT = do_PATCH = _any

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def counter() -> Iterator[str]:
    with serving(Counter) as url:
        yield url


@pytest.fixture
def sandbox(counter: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A fresh folder as cwd and HOME, every endpoint and proxy at the counting server."""
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "mirror").mkdir()
    (tmp_path / "a-file").write_text("")
    for name in list(os.environ):
        if name.startswith(("COSTGUARD_", "AWS_", "AZURE_", "GOOGLE_")):
            monkeypatch.delenv(name)
    environment = {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "COSTGUARD_CACHE_DIR": str(home / "cache"),
        "COSTGUARD_JOBS_DIR": str(home / "jobs"),
        "AWS_ENDPOINT_URL": counter,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",
        "STORAGE_EMULATOR_HOST": counter,
        "HTTP_PROXY": counter,
        "HTTPS_PROXY": counter,
        "http_proxy": counter,
        "https_proxy": counter,
        "NO_PROXY": "",
        "no_proxy": "",
        "PATH": f"{home}:{os.environ['PATH']}",  # no sbatch on it
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    return tmp_path, counter


def children() -> set[int]:
    """Processes whose parent is this one."""
    mine = str(os.getpid())
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == mine:
            found.add(int(stat.parent.name))
    return found


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def invocation(case: Case, value: str) -> list[str]:
    before, after = BASES[case.command]
    words = case.command.split()
    if isinstance(case.param, click.Argument):
        return [*words, value, *before[1:], *after]
    return [*words, *before, case.flag, value, *after]


def named(case: Case, line: str) -> bool:
    """Whether the error line names the option (any of its spellings) or the argument."""
    if isinstance(case.param, click.Option):
        return any(opt in line for opt in case.param.opts)
    if isinstance(case.param.type, click.Choice):  # click names it by its choices
        return all(str(choice) in line for choice in case.param.type.choices)
    return str(case.param.name).upper() in line or str(case.param.name) in line


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c,
            id=f"{c.command or 'costguard'} {c.flag}",
            marks=[pytest.mark.xfail(reason=EXPECTED_FAILURES[c.key], strict=True)]
            if c.key in EXPECTED_FAILURES
            else [],
        )
        for c in ALL
        if c.key not in NOT_SWEPT and (hostile(c.param) or c.key in EXPECTED_FAILURES)
    ],
)
def test_hostile_values_exit_2_with_one_clean_error_and_no_side_effect(
    case: Case, sandbox: tuple[Path, str]
) -> None:
    root, _ = sandbox
    values = QUICK_FAILURE if case.key in EXPECTED_FAILURES else hostile(case.param)
    before_files, before_children = tree(root), children()
    Counter.hits.clear()
    problems = []
    for value in values:
        args = invocation(case, value)
        result = CliRunner().invoke(cli, args, catch_exceptions=True)
        lines = result.stderr.splitlines()
        shown = repr(value[:30])
        if result.exit_code != 2:
            problems.append(f"{shown}: exit {result.exit_code} {result.stderr[-300:]!r}")
            continue
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            problems.append(f"{shown}: raised {result.exception!r}")
        if len(lines) != 2 or not lines[0].startswith("Error: "):
            problems.append(f"{shown}: not one Error line and one Hint: {lines[:4]!r}")
            continue
        if not lines[1].startswith("Hint: "):
            problems.append(f"{shown}: no Hint line: {lines!r}")
        if not named(case, lines[0]):
            problems.append(f"{shown}: the error does not name {case.flag}: {lines[0]!r}")
        if "Traceback" in result.output + result.stderr:
            problems.append(f"{shown}: a traceback")
        if len(value) > 200 and value[:201] in result.output + result.stderr:
            problems.append(f"{shown}: more than 200 characters of the value echoed")
        if result.stdout:
            problems.append(f"{shown}: wrote to stdout: {result.stdout[:200]!r}")
    assert problems == []
    assert Counter.hits == [], "a network call was made"
    assert tree(root) == before_files, "a file was written"
    assert children() <= before_children, "a process was left running"


#: Job ids a writable store may hold in job.json (issue 28): filter wildcards, paths,
#: control characters, look-alikes, other JSON types, and 100 KB.
HOSTILE_JOB_IDS: list[object] = ["*", "?", "cg-*", "%", "../other", "/etc", "a/b", "run-1\n",
                                 "Run-1", "", "-run", "x" * 100_000, "\uff52un-1", "a\x00b",
                                 "a b", 5, None, ["run-1"]]  # fmt: skip


@pytest.mark.parametrize("command", [["jobs", "status"], ["launch", "--force", "--attach"]])
def test_a_hostile_job_id_in_job_json_is_refused_by_every_reader(
    command: list[str], sandbox: tuple[Path, str]
) -> None:
    import json
    import time

    from costguard.checkpoint.store import Store
    from costguard.spot.job import JOB_FILE, Job, JobSpec, save_job

    root, _ = sandbox
    store = Store.open(str(root / "ckpt"))
    spec = JobSpec("cg-me-20261202-201512-a1b2c3", "local", "T4", 1, (), True, store.url,
                   ("true",), "me", time.time(), datetime.now(UTC))  # fmt: skip
    save_job(store, Job(spec))
    before_files, before_children = tree(root), children()
    Counter.hits.clear()
    problems = []
    for job_id in HOSTILE_JOB_IDS:
        doc = json.loads(store.get(JOB_FILE))
        doc["spec"]["job_id"] = job_id
        store.put(JOB_FILE, json.dumps(doc).encode())
        result = CliRunner().invoke(cli, [*command, store.url], catch_exceptions=True)
        lines = result.stderr.splitlines()
        shown = repr(job_id)[:30]
        if result.exit_code != 2 or len(lines) != 2 or "Traceback" in result.output:
            problems.append(f"{shown}: exit {result.exit_code} {result.stderr[-300:]!r}")
        elif not (lines[0].startswith("Error: ") and "not a costguard job id" in lines[0]):
            problems.append(f"{shown}: {lines[0]!r}")
        elif not lines[1].startswith("Hint: ") or len(result.stderr) > 500:
            problems.append(f"{shown}: {lines!r}")
    assert problems == []
    assert Counter.hits == [], "a network call was made"
    assert tree(root) == before_files, "a file was written"
    assert children() <= before_children, "a process was left running"


#: Credentials a researcher's command line carries (issue 28; the table in docs/secrets.md),
#: each with the part that must never be shown: shapes SLURM's and the clouds' name rules
#: let through, and ones known only by the flag before them.
SECRET_VALUES = [
    ("ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8", "a1B2c3D4e5F6g7H8"),
    ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "AbCdEfGhIjKlMnOp"),
    ("docker://alice:Tr0ub4dor3x@ghcr.io/x/y", "Tr0ub4dor3x"),
]
SECRET_COMMAND = ["--wandb-key", "0123456789abcdef0123456789abcdef01234567", "--key",
                  "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"]  # fmt: skip
SECRET_CORES = [core for _, core in SECRET_VALUES] + ["0123456789abcdef01234", "wJalrXUtnFEMI"]


#: Commands that still show a credential given as an option: command -> why.
SECRET_ECHOES: dict[str, str] = {}


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(
            c,
            marks=[pytest.mark.xfail(reason=SECRET_ECHOES[c], strict=True)]
            if c in SECRET_ECHOES
            else [],
        )
        for c in sorted({case.command for case in ALL} - {"", "agent"})
    ],
)
def test_no_option_or_command_word_echoes_a_secret(command: str, sandbox: tuple[Path, str]) -> None:
    """Every text, name and URL option of ``command``, and its command after ``--``, given
    a credential: whatever the command answers (a token is a valid name, so some go on to
    the counting server), no output and no file it writes shows it."""
    root, _ = sandbox
    leaks = []
    runs = [(case, value) for case in ALL if case.command == command and hostile(case.param)
            and not isinstance(case.param.type, (WholeNumber, FiniteFloat, DecimalRange))
            and case.key not in NOT_SWEPT for value, _ in SECRET_VALUES]  # fmt: skip
    before, after = BASES[command]
    invocations = [invocation(case, value) for case, value in runs]
    if after:  # the command the job runs carries them too
        invocations.append([*command.split(), *before, *after, *SECRET_COMMAND])
    for args in invocations:
        result = CliRunner().invoke(cli, args, catch_exceptions=True)
        written = [p.read_text(errors="replace") for p in root.rglob("*") if p.is_file()]
        shown = "\n".join([result.stdout, result.stderr, str(result.exception), *written])
        leaks += [f"{args[2:][-3:]}: {core}" for core in SECRET_CORES if core in shown]
    assert leaks == []


@pytest.mark.parametrize(
    "url",
    ["http://user:hunter2@host/x", "https://host.invalid/k?X-Amz-Signature=SIGSECRET"],
)
def test_debug_shows_the_traceback_with_secrets_masked_and_keeps_the_exit_code(
    run_cli: Callable[..., Any], url: str
) -> None:
    """--debug re-raised the error: Python printed its message raw (the password, the
    signature) and exited 1 for bad input. Now the traceback is masked as the error line
    is, and the exit code stays 2."""
    result = run_cli("--debug", "estimate", "--gpu", "a10g", "--hours", "1", "--data", url)
    assert result.exit_code == 2, result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert "InputError" in result.stderr
    said = result.stdout + result.stderr
    assert "hunter2" not in said
    assert "SIGSECRET" not in said
    assert "Error: cannot tell where" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("jobs", "status", "s3://bucket/../x"),
        ("checkpoint", "ls", "s3://bucket/runs/../x"),
        ("checkpoint", "verify", "gs://bucket/./x"),
        ("spend", "s3://bucket/../exports"),
        ("estimate", "--from-run", "az://container/../x", "--steps", "10", "--gpu", "a10g"),
        ("run", "--checkpoint", "s3://bucket/../x", "--", "true"),
    ],
    ids=["jobs", "ls", "verify", "spend", "from-run", "run"],
)
def test_a_store_url_with_a_dot_part_is_refused_before_any_call(
    run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    """`s3://bucket/../x` went out as a request for `bucket/../x` (a key named `../x`, or
    another path once an HTTP client resolves it); `run` wrote a probe object there. Now
    it is bad input, exit 2, before any call (the endpoint here answers nothing)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    result = run_cli(*args)
    assert result.exit_code == 2, result.stderr
    assert "part, which a store keeps as a name" in result.stderr
    assert "retry" not in result.stderr
    assert "Hint: write the prefix without . and .. parts" in result.stderr


def test_a_local_store_that_is_missing_or_a_file_is_bad_input_said_plainly(
    run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    """`checkpoint ls` of a missing folder exited 1 (`jobs status` 2); of a regular file it
    said "the folder does not exist"; `run --checkpoint FILE` retried a FileExistsError
    four times. Each is now exit 2 at once, in words that fit the case."""
    missing = tmp_path / "no" / "such"
    afile = tmp_path / "afile"
    afile.write_text("x")
    gone = run_cli("checkpoint", "ls", str(missing))
    assert gone.exit_code == 2, gone.stderr
    assert "the folder does not exist" in gone.stderr
    for args in (
        ("checkpoint", "ls", str(afile)),
        ("run", "--checkpoint", str(afile), "--", "true"),
    ):
        result = run_cli(*args)
        assert result.exit_code == 2, result.stderr
        assert f"{afile} is a file, not a folder" in result.stderr
        assert "retry" not in result.stderr
    assert afile.read_text() == "x"


def test_a_store_that_does_not_answer_gets_a_hint(
    run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error after a store's retries had no Hint line (a store that does not answer
    takes its retries' seconds: here the store's open fails as it would after them)."""
    from costguard.checkpoint.store import Store
    from costguard.errors import StoreError

    def unreachable(*args: object, **kwargs: object) -> Store:
        msg = "looking for the bucket on s3://bucket/run1 failed: EndpointConnectionError"
        raise StoreError(msg)

    monkeypatch.setattr(Store, "open", unreachable)
    result = run_cli("checkpoint", "ls", "s3://bucket/run1")
    assert result.exit_code == 1, result.stderr
    assert result.stderr.startswith("Error: looking for the bucket")
    assert "Hint: the store did not answer after the retries" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("alarm", "--budget", "200", "--provider", "azure", "--email", "a@b.edu", "--dry-run"),
        ("reap", "--provider", "azure"),
        ("burn", "--provider", "azure", "--budget", "10"),
    ],
    ids=["alarm", "reap", "burn"],
)
def test_an_azure_subscription_that_is_no_guid_is_refused_before_any_call(
    run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    """`--subscription x` went on to credentials and the first API call, whose error
    named neither the option nor what a subscription id looks like."""
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
    result = run_cli(*args, "--subscription", "my-subscription")
    assert result.exit_code == 2, result.stderr
    assert "is not an Azure subscription id" in result.stderr
    assert "credentials" not in result.stderr
