"""Every command, at every level, answers --help with an example."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click
import pytest

from costguard.cli import COMMANDS, cli


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    ctx = click.Context(group)
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        assert command is not None, name
        yield (*prefix, name)
        if isinstance(command, click.Group):
            yield from command_paths(command, (*prefix, name))


PATHS = [(), *command_paths(cli)]


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command | None = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.get_command(click.Context(command), name)
    assert command is not None
    return command


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "costguard")
def test_help_shows_an_example(run_cli: Callable[..., Any], path: tuple[str, ...]) -> None:
    result = run_cli(*path, "--help")
    assert result.exit_code == 0, result.stderr
    assert "Usage:" in result.stdout
    assert "costguard " in result.stdout
    assert "Example" in result.stdout or "costguard estimate --gpu" in result.stdout


def test_every_registered_command_is_covered() -> None:
    expected = {"estimate", "pricing", "alarm", "burn", "reap", "agent", "run", "checkpoint"}
    assert expected <= {p[0] for p in PATHS if p}


@pytest.mark.parametrize("path", [(), ("pricing",), ("jobs",), ("slurm",)])
def test_nothing_after_a_group_prints_its_help_alone(
    run_cli: Callable[..., Any], path: tuple[str, ...]
) -> None:
    result = run_cli(*path)
    assert result.exit_code == 0
    first = result.stdout.splitlines()[0]
    assert first.startswith("Usage: ")
    assert first.endswith(" ".join((*path, "[OPTIONS] COMMAND [ARGS]...")))
    assert "Commands:" in result.stdout
    assert "Error" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("typed", "intended"),
    [
        (("estimate", "--hour", "8"), "--hours"),
        (("estimate", "--hours", "8", "--gpus", "4"), "--gpu"),
        (("estimate", "--hours", "8", "--counts", "4"), "--count"),
        (("reap", "--idle-minute", "30"), "--idle-minutes"),
    ],
)
def test_a_close_name_suggests_the_intended_option_first(
    run_cli: Callable[..., Any], typed: tuple[str, ...], intended: str
) -> None:
    result = run_cli(*typed)
    assert result.exit_code == 2
    first_line = result.stderr.splitlines()[0]
    assert first_line.startswith("Error: no such option"), first_line
    suggested = first_line.split("did you mean ", 1)[1]
    assert suggested.startswith(f"'{intended}'"), first_line


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_lazy_table_shows_each_commands_own_short_help(name: str) -> None:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    assert command.name == name
    assert COMMANDS[name][2] == command.short_help


def run_fresh(argv: list[str]) -> tuple[str, list[str]]:
    """``costguard ARGV`` in a new interpreter: what it printed, and which command modules
    (``costguard.cli.*``) it loaded."""
    code = (
        "import io, contextlib, json, sys\n"
        "from costguard.cli import cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    cli.main({argv!r}, standalone_mode=False)\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('costguard.cli.'))\n"
        "print(json.dumps([out.getvalue(), loaded]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    printed, loaded = json.loads(done.stdout.splitlines()[-1])
    return printed, loaded


def test_the_group_help_lists_every_command_without_importing_one() -> None:
    help_text, loaded = run_fresh(["--help"])
    for name, (module, _, short_help) in COMMANDS.items():
        assert f"  {name}  " in help_text
        assert short_help.split()[0] in help_text
        assert module not in loaded
    assert loaded == ["costguard.cli.helpformat"]  # the layout of --help, no command


def test_a_command_loads_its_own_module_only() -> None:
    printed, modules = run_fresh(["estimate", "--gpu", "a10g", "--hours", "1"])
    assert "A10G" in printed
    loaded = set(modules)
    assert "costguard.cli.estimate" in loaded
    others = {module for module, *_ in COMMANDS.values()} - {"costguard.cli.estimate"}
    assert loaded.isdisjoint(others)


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "costguard")
def test_help_fits_the_terminal(
    run_cli: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    path: tuple[str, ...],
    columns: int,
) -> None:
    """Every --help, lazy subcommands included, at COLUMNS=80 and 120: no line wider than
    the terminal (click wraps prose; an example in a ``\\b`` block must fit by itself, a
    long one continued with a backslash), and an example in each."""
    monkeypatch.setenv("COLUMNS", str(columns))
    result = run_cli(*path, "--help")
    assert result.exit_code == 0, result.stderr
    wide = [line for line in result.stdout.splitlines() if len(line) > columns]
    assert not wide, f"{len(wide)} line(s) wider than {columns}: {wide}"
    assert "\b" not in result.stdout, "a \\b marker shown as text (not after a blank line)"
    assert "Example" in result.stdout or "costguard estimate --gpu" in result.stdout
    examples = [line.strip() for line in result.stdout.splitlines()]
    assert any(line.startswith("costguard ") for line in examples), "no example command"
    lines = result.stdout.splitlines()
    broken = [
        f"{line.strip()}|{after.strip()}"
        for line, after in itertools.pairwise(lines)
        if re.search(r"[\w$/]-$", line) and re.match(r"\s*\w", after)
    ]  # issue 49 item 6: `--idle-|minutes`, `us-|central1`, `$/GPU-|hour` (click broke them)
    assert not broken, f"a line broken inside a hyphenated word: {broken}"


GROUPS = [path for path in PATHS if isinstance(_command(path), click.Group)]


@pytest.mark.parametrize("path", GROUPS, ids=lambda p: " ".join(p) or "costguard")
def test_a_group_shows_each_commands_summary_whole(
    run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, path: tuple[str, ...]
) -> None:
    """Issue 49 item 6: a group's command list cut summaries with "..." at 80 columns."""
    monkeypatch.setenv("COLUMNS", "80")
    listing = run_cli(*path, "--help").stdout.split("Commands:", 1)[1]
    group = _command(path)
    assert isinstance(group, click.Group)
    for name in group.list_commands(click.Context(group)):
        summary = " ".join(_command((*path, name)).get_short_help_str(10**6).split())
        assert summary in " ".join(listing.split()), (name, summary)
    assert "..." not in listing


#: What a placeholder may be for an option that takes a name (a region, a project, ...).
NAMED = re.compile(
    r"--(\w+-)*(name|region|zone|project|subscription|resource-group|provider|gpu|gpu-type|"
    r"instance-type|partition|account|billing-account|pubsub-topic|currency|part)"
)


@pytest.mark.parametrize("path", [p for p in PATHS if p], ids=" ".join)
def test_a_placeholder_says_what_the_option_takes(path: tuple[str, ...]) -> None:
    """Issue 49 item 6: ``--budget NAME``, ``--email NAME``, ``--time NAME``: NAME only where
    a name is taken, never click's bare TEXT."""
    command = _command(path)
    ctx = click.Context(command)
    for param in command.params:
        if not isinstance(param, click.Option) or param.is_flag:
            continue
        metavar = param.make_metavar(ctx)
        assert metavar != "TEXT", param.opts
        if metavar == "NAME":
            assert NAMED.fullmatch(param.opts[-1]), f"{param.opts[-1]} NAME"


def _runs_a_command(path: tuple[str, ...]) -> bool:
    """Whether ``costguard PATH`` ends in a COMMAND of its own to run (``-- python ...``)."""
    return any(
        isinstance(p, click.Argument) and p.nargs == -1 and p.type is click.UNPROCESSED
        for p in _command(path).params
    )


TRAILING = [path for path in PATHS if path and _runs_a_command(path)]


def test_the_commands_that_run_a_command_are_found() -> None:
    assert {("run",), ("launch",), ("pilot",), ("slurm", "script")} <= set(TRAILING)


@pytest.mark.parametrize("path", TRAILING, ids=" ".join)
@pytest.mark.parametrize("typo", ["--chekpoint", "--checkpont"])
def test_an_option_typo_before_the_command_is_no_such_option(
    run_cli: Callable[..., Any], path: tuple[str, ...], typo: str
) -> None:
    """Issue 49 item 12: a mistyped option before ``--`` is named with the close name,
    never taken as the first word of the command to run (nor the rest of the line)."""
    result = run_cli(*path, typo, "s3://my-bucket/run1", "--", "python", "train.py")
    assert result.exit_code == 2, result.stdout + result.stderr
    first_line = result.stderr.splitlines()[0]
    assert first_line.startswith(f"Error: no such option '{typo}'; did you mean '--checkpoint'")


@pytest.mark.parametrize(
    ("typed", "intended"),
    [
        (("launch", "--arry", "0-3", "--", "python", "train.py"), None),
        (("slurm", "script", "--arry", "0-3", "--", "python", "train.py"), "--array"),
        (("launch", "--max-totl", "9", "--gpu", "a10g", "python", "train.py"), "--max-total"),
        (("slurm", "submit", "--tme", "1:00:00", "--", "python", "train.py"), "--time"),
        (("pilot", "--step", "100", "--", "python", "train.py"), "--steps"),
    ],
)
def test_any_option_typo_before_the_command_is_named(
    run_cli: Callable[..., Any], typed: tuple[str, ...], intended: str | None
) -> None:
    """Also where no name is close (``launch`` has no ``--array``): never the command."""
    result = run_cli(*typed)
    assert result.exit_code == 2, result.stdout + result.stderr
    first_line = result.stderr.splitlines()[0]
    typo = next(word for word in typed if word.startswith("--") and word in str(first_line))
    assert first_line.startswith(f"Error: no such option '{typo}'"), first_line
    if intended is not None:
        assert f"'{intended}'" in first_line


@pytest.mark.parametrize(
    "argv",
    [
        ("run", "--checkpoint", "{tmp}", "-q", "python", "-c", "print('ran', '--x')"),
        ("run", "--checkpoint", "{tmp}", "-q", "--", "python", "-c", "print('ran', '--x')"),
    ],
    ids=["without --", "with --"],
)
def test_the_command_after_the_options_keeps_its_own_options(
    run_cli: Callable[..., Any], tmp_path: Any, argv: tuple[str, ...]
) -> None:
    """The options end at ``--`` or at the first word that is not an option: the command's
    own ``-c`` and ``--x`` are its, not costguard's."""
    done = subprocess.run(
        [sys.executable, "-m", "costguard", *(a.format(tmp=tmp_path / "ckpt") for a in argv)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "ran --x" in done.stdout


@pytest.mark.parametrize("path", [("estimate",), ("pricing", "show"), ("launch",)], ids=" ".join)
def test_costguards_own_option_after_the_command_says_where_it_goes(
    run_cli: Callable[..., Any], path: tuple[str, ...]
) -> None:
    """Issue 49 item 9: `costguard estimate --pricing-dir DIR` said "did you mean
    --provider"; it is costguard's own option, which goes before the command."""
    result = run_cli(*path, "--pricing-dir", "/tmp", "--hours", "1")
    assert result.exit_code == 2
    error, hint = result.stderr.splitlines()
    assert error == "Error: --pricing-dir is costguard's own option: it goes before the command"
    assert hint == f"Hint: costguard --pricing-dir ... {' '.join(path)} ..."


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_a_pricing_dir_that_does_not_exist_is_bad_input(
    run_cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Issue 49 item 9: `costguard --pricing-dir /nonexistent estimate` exited 1."""
    args = ["estimate", "--gpu", "a10g", "--hours", "1"]
    if how == "flag":
        result = run_cli("--pricing-dir", "/nonexistent-costguard-dir", *args)
    else:
        monkeypatch.setenv("COSTGUARD_PRICING_DIR", "/nonexistent-costguard-dir")
        result = run_cli(*args)
    assert result.exit_code == 2, result.stderr
    assert "'/nonexistent-costguard-dir' does not exist" in result.stderr
