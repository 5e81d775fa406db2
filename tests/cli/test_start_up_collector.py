"""The console script's start-up runs with the cyclic garbage collector paused, and the
command itself with it running again, what start-up made frozen out of its sight
(costguard/cli/__init__.py, ``_StartUp``); ``cli`` called in-process is left alone."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

from click.testing import CliRunner

from costguard.cli import cli

#: A command registered as the lazy group registers its own, that says how the collector
#: stands while it runs and while its module was imported.
PROBE = """
import gc, json, sys
import click
from costguard import cli

IMPORTED = gc.isenabled()

@click.command()
def probe():
    print(json.dumps([IMPORTED, gc.isenabled(), gc.get_freeze_count() > 0]))

if __name__ == "__main__":
    cli.COMMANDS["probe"] = ("__main__", "probe", "Says how the collector stands.")
    sys.argv = ["costguard", "probe"]
    cli.main()
"""


def test_the_command_runs_with_the_collector_on_and_start_up_frozen() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    imported, running, frozen = json.loads(done.stdout)
    assert running is True
    assert frozen is True
    assert imported is True  # the script's own module was imported before main()


def test_cli_called_in_process_leaves_the_collector_alone() -> None:
    frozen = gc.get_freeze_count()
    result = CliRunner().invoke(cli, ["estimate", "--help"])
    assert result.exit_code == 0, result.output
    assert gc.isenabled()
    assert gc.get_freeze_count() <= frozen  # nothing frozen (frozen objects may be freed)
