"""The ``costguard`` command line: a thin layer that parses, calls a feature, renders.

One module per command. Errors from the features are shown as ``Error:`` and ``Hint:``
lines with the error's exit code (2 for bad input); a traceback only with ``--debug``.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from costguard._version import __version__
from costguard.cli.helpformat import HelpGroup, use_help_format
from costguard.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    CostguardError,
    StoreError,
)
from costguard.settings import Settings
from costguard.text import visible


class _StartUp:
    """The console script's start-up, with the cyclic garbage collector paused.

    Parsing the command line and importing the command's modules make tens of thousands
    of objects (classes, functions, tables) that all live until the process ends; the
    collections they set off walk them again and again for nothing (a tenth of a
    `costguard estimate`). :func:`main` pauses the collector; once the command is found
    (:meth:`CostguardGroup.get_command`), what start-up made is frozen out of the collector's
    sight (``gc.freeze``) and the collector runs again, as usual, for the command itself.
    ``cli`` called in a process of its own making (tests, a notebook) is left alone.
    """

    paused = False

    @classmethod
    def begin(cls) -> None:
        if gc.isenabled():
            gc.disable()
            cls.paused = True

    @classmethod
    def end(cls) -> None:
        if cls.paused:
            cls.paused = False
            gc.freeze()
            gc.enable()


class _Console:
    """Whether this process is the console script (:func:`main`): it ends with its command.
    ``cli`` called in a process of its own making (tests, a notebook) goes on after it."""

    script = False


def console_script() -> bool:
    """Whether the process ends once the command returns (see :class:`_Console`): a command
    may then leave the process in a state its caller could not live with (``costguard
    run`` ignores a late SIGTERM)."""
    return _Console.script


CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


#: Each command: the module that defines it, the command's name there, and the one line
#: ``costguard --help`` shows for it. The module is imported only when its command runs
#: (click's lazy-group pattern), so ``costguard estimate`` loads no alarm, reaper or launch
#: code; tests/cli/test_help.py checks each line against the command's own ``short_help``.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "agent": (
        "costguard.cli.agent",
        "agent_command",
        "On-instance autostop: shut down after the GPU has been idle (dry run unless --execute).",
    ),
    "alarm": (
        "costguard.cli.alarm",
        "alarm_group",
        "Set a monthly budget with alerts (run it on day one).",
    ),
    "burn": (
        "costguard.cli.burn",
        "burn_command",
        "Live burn rate of running instances and the month's projection.",
    ),
    "checkpoint": (
        "costguard.cli.checkpoint",
        "checkpoint_group",
        "List, verify and export checkpoints in a store.",
    ),
    "estimate": (
        "costguard.cli.estimate",
        "estimate_command",
        "Estimate what a GPU run costs, across providers, regions and markets.",
    ),
    "jobs": ("costguard.cli.launch", "jobs_group", "Jobs started by costguard launch."),
    "launch": (
        "costguard.cli.launch",
        "launch_command",
        "Run a job on a spot GPU and relaunch it after each preemption.",
    ),
    "pilot": (
        "costguard.cli.pilot",
        "pilot_command",
        "Time a script's first steps here and price the whole run from them.",
    ),
    "pricing": (
        "costguard.cli.pricing",
        "pricing_group",
        "Inspect the price tables, or refresh them.",
    ),
    "reap": (
        "costguard.cli.reap",
        "reap_command",
        "Stop or terminate idle GPU instances (dry run unless --execute).",
    ),
    "run": (
        "costguard.cli.run",
        "run_command",
        "Run a training script with checkpointing and preemption notices.",
    ),
    "slurm": (
        "costguard.cli.slurm",
        "slurm_group",
        "Preempt-safe SLURM batch jobs that save and requeue themselves.",
    ),
    "spend": (
        "costguard.cli.spend",
        "spend_command",
        "What was billed, per job, owner, project, day or service (billing exports).",
    ),
}


class CostguardGroup(HelpGroup):
    """A click group that turns every failure into ``Error:``/``Hint:`` and an exit code.

    Its subcommands come from :data:`COMMANDS`, each imported on first use; their
    ``--help``, as its own, breaks lines between words only (:class:`HelpGroup`).
    """

    def _takes(self, name: str) -> bool:
        """Whether ``name`` is one of this group's own options (``--pricing-dir``)."""
        return any(name in param.opts for param in self.params if isinstance(param, click.Option))

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module_name, attribute, _ = COMMANDS[cmd_name]
            command: click.Command = getattr(importlib.import_module(module_name), attribute)
            self.add_command(use_help_format(command), cmd_name)
        _StartUp.end()
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from the table's lines: ``--help`` imports no command."""
        listed = {
            name: click.Command(name, short_help=line) for name, (*_, line) in COMMANDS.items()
        }
        listed.update(
            (name, command) for name, command in self.commands.items() if not command.hidden
        )
        rows = [(name, listed[name].get_short_help_str()) for name in sorted(listed)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command. Ctrl-C ends it with one line, ``Aborted.`` (click's own answer
        wrote an empty line before it, also into a log; only a terminal, where ``^C`` was
        echoed, needs the line ended first)."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            end = "\n" if _is_terminal(sys.stderr) else ""
            click.echo(f"{end}Aborted.", err=True)
            raise Interrupted(EXIT_INTERRUPTED) from None

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            code = super().main(
                argv, prog_name or "costguard", complete_var, standalone_mode=False, **extra
            )
        except click.exceptions.NoArgsIsHelpError as exc:
            # `costguard` (or a group) with nothing after it: the help, alone, and success.
            click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message())
            code = 0
        except click.NoSuchOption as exc:
            command = exc.ctx.command_path if exc.ctx else "costguard"
            name = exc.option_name
            message = _no_such_option(name, exc.possibilities or ())
            hint = f"'{command} --help' shows the options and an example"
            if exc.ctx is not None and exc.ctx.parent is not None and self._takes(name):
                # costguard's own option (--pricing-dir, --debug) after the command's name
                message = f"{name} is costguard's own option: it goes before the command"
                hint = f"costguard {name} ... {command.split(' ', 1)[1]} ..."
            _fail(message, hint, EXIT_BAD_INPUT)
        except click.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else "costguard"
            _fail(
                exc.format_message(),
                f"'{command} --help' shows the options and an example",
                EXIT_BAD_INPUT,
            )
        except click.Abort:  # Ctrl-C, as click reports it
            click.echo("Aborted.", err=True)
            raise Interrupted(EXIT_INTERRUPTED) from None
        except click.ClickException as exc:
            _fail(exc.format_message(), None, exc.exit_code)
        except CostguardError as exc:
            if _debug_requested(argv):
                _traceback(exc)
            _fail(exc.message, exc.hint or _hint_for(exc), exc.exit_code)
        except KeyboardInterrupt:
            raise Interrupted(EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            sys.exit(EXIT_INTERRUPTED)
        except Exception as exc:
            if _debug_requested(argv):
                _traceback(exc)
            _fail(
                f"unexpected {type(exc).__name__}: {exc}",
                "run again with --debug for a traceback, and report it",
                EXIT_FAILURE,
            )
        if standalone_mode:
            sys.exit(code if isinstance(code, int) else 0)
        return code


def _no_such_option(name: str, possibilities: Sequence[str]) -> str:
    """The unknown option and the close names, the closest first (click sorts them A-Z).

    >>> _no_such_option("--hour", ["--count", "--hours"])
    "no such option '--hour'; did you mean '--hours'? (or '--count')"
    """
    import difflib  # on error paths only: not worth its import on every run

    ranked = sorted(
        possibilities, key=lambda p: (-difflib.SequenceMatcher(None, name, p).ratio(), p)
    )
    if not ranked:
        return f"no such option '{name}'"
    message = f"no such option '{name}'; did you mean '{ranked[0]}'?"
    if len(ranked) > 1:
        message += " (or " + ", ".join(f"'{p}'" for p in ranked[1:]) + ")"
    return message


def _hint_for(exc: CostguardError) -> str | None:
    """The hint of an error raised without one: what to check when a store could not be
    read or written after its retries."""
    if isinstance(exc, StoreError):
        return (
            "the store did not answer after the retries: check the URL, the network and "
            "the credentials (AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS, "
            "AZURE_STORAGE_CONNECTION_STRING); what is there may be fine"
        )
    return None


def _traceback(exc: BaseException) -> None:
    """``--debug``'s traceback of ``exc`` on stderr, every URL's credentials and every
    secret shape in it masked as in the error line (:func:`costguard.secrets.redact`); the
    error and its exit code follow as without ``--debug``."""
    import traceback

    from costguard.secrets import redact

    click.echo(redact("".join(traceback.format_exception(exc))), err=True, nl=False)


def _fail(message: str, hint: str | None, code: int) -> NoReturn:
    # At a terminal, wrapped to its width; to a pipe or a log, one line each (grep-able).
    width = terminal_columns(sys.stderr)
    for line in wrap_words("Error: ", one_line(message), width):
        click.secho(line, err=True, fg="red")
    if hint:
        for line in wrap_words("Hint: ", one_line(hint), width):
            click.echo(line, err=True)
    sys.exit(code)


def terminal_columns(stream: Any) -> int | None:
    """The width of the terminal ``stream`` is, or ``None`` for a pipe, a file or a log."""
    if not stream.isatty():
        return None
    import shutil  # at a terminal only: with its archive modules, not worth it in a pipe

    return shutil.get_terminal_size().columns


def echo_prose(label: str, text: str, *, err: bool = False, fg: str | None = None) -> None:
    """``label + text`` as :func:`wrap_words` lays it out at a terminal (stdout, or stderr
    with ``err``), in colour ``fg``; to a pipe, one line."""
    stream = sys.stderr if err else sys.stdout
    width = terminal_columns(stream)
    for line in wrap_words(label, text, width):
        click.secho(line, err=err, fg=fg)


#: A word, or a `command` in backticks with what sticks to it (kept whole when wrapped).
_WORD = re.compile(r"`[^`]*`\S*|\S+")


def wrap_words(label: str, text: str, width: int | None, indent: str | None = None) -> list[str]:
    """``label + text`` in lines of at most ``width`` columns, broken between words,
    later lines starting with ``indent`` (default: under the text); ``None``: one line.
    A `command` in backticks is never broken: one longer than a line stands alone on
    its own, whole, so that it can be copied.

    >>> wrap_words("Hint: ", "run `aws sso login --profile NAME` and set AWS_PROFILE", 30)
    ['Hint: run', '      `aws sso login --profile NAME`', '      and set AWS_PROFILE']
    """
    if width is None:
        return [label + text]
    indent = " " * len(label) if indent is None else indent
    lines: list[str] = []
    line = label
    for word in _WORD.findall(text):
        if line.strip() and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = indent
        line += word if line in (label, indent) else f" {word}"
    lines.append(line)
    return lines


#: The longest run without a space an error line shows whole (a long path fits), the part
#: of a longer one it keeps, and the longest line.
_MAX_RUN_CHARS = 200
_KEPT_RUN_CHARS = 160
_MAX_LINE_CHARS = 600
_LONG_RUN = re.compile(rf"\S{{{_MAX_RUN_CHARS + 1},}}")


def one_line(text: str) -> str:
    """``text`` made safe for one ``Error:``/``Hint:`` line: credentials masked
    (:func:`costguard.secrets.redact`), control characters shown escaped
    (:func:`costguard.text.visible`: a newline in a value cannot start a line of its
    own), runs longer than 200 characters and lines longer than 600 cut, saying how long
    they were.

    >>> one_line("bad value 'a\\nb'")
    "bad value 'a\\\\nb'"
    >>> one_line("y" + "x" * 1000 + " is too long")[-44:]
    'xxxxxxxxxxxx...(1001 characters) is too long'
    """
    from costguard.secrets import redact  # error and warning lines only: not every run

    text = visible(redact(text))
    text = _LONG_RUN.sub(
        lambda found: f"{found[0][:_KEPT_RUN_CHARS]}...({len(found[0])} characters)", text
    )
    if len(text) > _MAX_LINE_CHARS:
        text = f"{text[: _MAX_LINE_CHARS - 40]}...({len(text)} characters in all)"
    return text


def _debug_requested(argv: Sequence[str]) -> bool:
    try:
        return "--debug" in argv or Settings.load().debug
    except CostguardError:
        return False


@click.group(cls=CostguardGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version", prog_name="costguard")
@click.option(
    "--pricing-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    envvar="COSTGUARD_PRICING_DIR",
    help="Use price tables from this folder instead of the bundled ones (before the "
    "command: costguard --pricing-dir DIR estimate ...).",
)
@click.option("--debug", is_flag=True, default=None, help="Show tracebacks for unexpected errors.")
@click.pass_context
def cli(ctx: click.Context, pricing_dir: Path | None, debug: bool | None) -> None:
    """Keep ML and science work on cloud GPUs within budget.

    \b
    Start with an estimate, offline, from the bundled price tables:
      costguard estimate --gpu a10g --hours 8 --count 4
    """
    ctx.obj = Settings.load({"pricing_dir": pricing_dir, "debug": debug})


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Interrupted(SystemExit):
    """Exit after Ctrl-C (130), once the main thread has unwound (its clean-up done)."""


def main() -> None:
    """Console-script entry point.

    After Ctrl-C the process ends at once: worker threads still reading (price pages,
    billing files) are not waited for (the interpreter would join them on its way out,
    for as long as they take), and nothing they hold is half-written (they only read,
    or write objects that nothing refers to until the main thread commits them).
    """
    _StartUp.begin()
    _Console.script = True
    try:
        cli.main()
    except Interrupted:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(EXIT_INTERRUPTED)
