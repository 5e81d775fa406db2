"""The ``costguard`` command line: a thin layer that parses, calls a feature, renders.

One module per command. Errors from the features are shown as ``Error:`` and ``Hint:``
lines with the error's exit code (2 for bad input); a traceback only with ``--debug``.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from costguard import __version__
from costguard.cli.agent import agent_command
from costguard.cli.alarm import alarm_group
from costguard.cli.burn import burn_command
from costguard.cli.checkpoint import checkpoint_group
from costguard.cli.estimate import estimate_command
from costguard.cli.launch import jobs_group, launch_command
from costguard.cli.pricing import pricing_group
from costguard.cli.reap import reap_command
from costguard.cli.run import run_command
from costguard.cli.slurm import slurm_group
from costguard.errors import EXIT_BAD_INPUT, EXIT_FAILURE, CostguardError
from costguard.secrets import redact
from costguard.settings import Settings

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class CostguardGroup(click.Group):
    """A click group that turns every failure into ``Error:``/``Hint:`` and an exit code."""

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
            _fail(
                _no_such_option(exc.option_name, exc.possibilities or ()),
                f"'{command} --help' shows the options and an example",
                EXIT_BAD_INPUT,
            )
        except click.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx else "costguard"
            _fail(
                exc.format_message(),
                f"'{command} --help' shows the options and an example",
                EXIT_BAD_INPUT,
            )
        except click.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(130)
        except click.ClickException as exc:
            _fail(exc.format_message(), None, exc.exit_code)
        except CostguardError as exc:
            if _debug_requested(argv):
                raise
            _fail(exc.message, exc.hint, exc.exit_code)
        except (KeyboardInterrupt, BrokenPipeError):
            sys.exit(130)
        except Exception as exc:
            if _debug_requested(argv):
                raise
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
    ranked = sorted(
        possibilities, key=lambda p: (-difflib.SequenceMatcher(None, name, p).ratio(), p)
    )
    if not ranked:
        return f"no such option '{name}'"
    message = f"no such option '{name}'; did you mean '{ranked[0]}'?"
    if len(ranked) > 1:
        message += " (or " + ", ".join(f"'{p}'" for p in ranked[1:]) + ")"
    return message


def _fail(message: str, hint: str | None, code: int) -> NoReturn:
    click.secho(f"Error: {one_line(message)}", err=True, fg="red")
    if hint:
        click.echo(f"Hint: {one_line(hint)}", err=True)
    sys.exit(code)


#: The longest run without a space an error line shows whole (a long path fits), the part
#: of a longer one it keeps, and the longest line.
_MAX_RUN_CHARS = 200
_KEPT_RUN_CHARS = 160
_MAX_LINE_CHARS = 600
_LONG_RUN = re.compile(rf"\S{{{_MAX_RUN_CHARS + 1},}}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` made safe for one ``Error:``/``Hint:`` line: credentials masked
    (:func:`costguard.secrets.redact`), control characters shown escaped (a newline in a
    value cannot start a line of its own), runs longer than 200 characters and lines longer
    than 600 cut, saying how long they were.

    >>> one_line("bad value 'a\\nb'")
    "bad value 'a\\\\nb'"
    >>> one_line("y" + "x" * 1000 + " is too long")[-44:]
    'xxxxxxxxxxxx...(1001 characters) is too long'
    """
    text = redact(text)
    text = _CONTROL.sub(lambda found: ascii(found[0])[1:-1], text)
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
    type=click.Path(file_okay=False, path_type=Path),
    envvar="COSTGUARD_PRICING_DIR",
    help="Use price tables from this folder instead of the bundled ones.",
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


cli.add_command(estimate_command)
cli.add_command(pricing_group)
cli.add_command(alarm_group)
cli.add_command(burn_command)
cli.add_command(reap_command)
cli.add_command(agent_command)
cli.add_command(run_command)
cli.add_command(checkpoint_group)
cli.add_command(launch_command)
cli.add_command(jobs_group)
cli.add_command(slurm_group)


def main() -> None:
    """Console-script entry point."""
    cli.main()
