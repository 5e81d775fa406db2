"""``costguard agent``: on-instance autostop once the GPU (and the rest) has been idle.

A dry run unless ``--execute``, like every command that can stop something.
"""

from __future__ import annotations

import os
import shlex
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from costguard.cli.options import idle_options
from costguard.cli.params import Text, WholeNumber
from costguard.errors import InputError
from costguard.settings import Settings
from costguard.text import visible

EXAMPLES = """
\b
Examples:
  costguard agent --once                       # one reading: what it sees
  costguard agent --idle-minutes 5             # dry run: watch and log only
  costguard agent --idle-minutes 60 --execute  # infra/systemd/ runs this
  # Azure: a VM that is only powered off still bills; deallocate it
  costguard agent --action azure-deallocate --execute

Busy: GPU, CPU or network at or above the thresholds, a job started with `costguard run`
(a pid file in $COSTGUARD_JOBS_DIR, default /run/costguard/jobs), or an SSH session.
"""


@click.command(
    "agent",
    epilog=EXAMPLES,
    short_help="On-instance autostop: shut down after the GPU has been idle (dry run unless "
    "--execute).",
)
@idle_options(
    idle="Shut down after this long with every reading idle.",
    gpu="GPU %.",
    cpu="CPU %.",
    network="Network in + out, Mbit/s.",
)
@click.option(
    "--interval-seconds",
    type=WholeNumber(1, 3600),
    default=60,
    show_default=True,
    help="Time between readings.",
)
@click.option("--ignore-jobs", is_flag=True, help="`costguard run` jobs do not keep it up.")
@click.option("--ignore-ssh", is_flag=True, help="SSH sessions do not keep it up.")
@click.option("--gpu-missing-ok", is_flag=True, help="Judge by CPU and network without a GPU.")
@click.option(
    "--action",
    type=click.Choice(["poweroff", "azure-deallocate"], case_sensitive=False),
    default="poweroff",
    show_default=True,
    help="poweroff runs --shutdown-command; azure-deallocate calls the Azure API.",
)
@click.option(
    "--shutdown-command",
    metavar="COMMAND",
    type=Text(),
    default="systemctl poweroff",
    show_default=True,
    help="The command --action poweroff runs.",
)
@click.option(
    "--jobs-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where `costguard run` registers jobs. Default: $COSTGUARD_JOBS_DIR, else "
    "/run/costguard/jobs.",
)
@click.option(
    "--execute/--dry-run",
    default=False,
    help="Shut down when idle. Without --execute (the default, or with --dry-run) it only "
    "logs what it would do.",
)
@click.option("--once", is_flag=True, help="Take one reading, print it and the decision, exit.")
@click.pass_context
def agent_command(ctx: click.Context, /, **options: Any) -> None:
    """Watch this machine and shut it down once it has been idle for --idle-minutes.

    Every --interval-seconds it reads the GPUs (nvidia-smi), CPU and network (/proc),
    `costguard run` jobs and SSH sessions, and logs one line. A dry run unless --execute:
    it logs "would shut down" and goes on watching. Shutting down needs root.
    """
    from costguard import contract
    from costguard.reaper import agent
    from costguard.reaper.autostop import AgentPolicy, decide_shutdown

    command = shutdown_command(options["shutdown_command"])
    settings = ctx.find_object(Settings) or Settings.load()
    policy = AgentPolicy(
        idle_minutes=options["idle_minutes"],
        gpu_threshold_percent=float(options["gpu_threshold"]),
        cpu_threshold_percent=float(options["cpu_threshold"]),
        network_threshold_mbps=float(options["network_threshold_mbps"]),
        interval_seconds=options["interval_seconds"],
        jobs_keep_awake=not options["ignore_jobs"],
        ssh_keeps_awake=not options["ignore_ssh"],
        gpu_missing_ok=options["gpu_missing_ok"],
    )
    shutdown: agent.Shutdown = (
        agent.AzureDeallocate(settings)
        if options["action"].lower() == "azure-deallocate"
        else agent.PowerOff(command)
    )
    sampler = agent.SystemSampler(options["jobs_dir"] or contract.jobs_dir(os.environ))

    def log(tick: agent.Tick) -> None:
        verdict = tick.decision.reason
        if tick.decision.shutdown:
            verdict = ("shutting down: " if tick.acted else "would shut down (dry run): ") + verdict
        click.echo(visible(f"{tick.reading} -> {verdict}"))

    if not options["execute"] and not options["once"]:
        click.echo("dry run: logging decisions only; add --execute to shut down when idle")
    if options["once"]:
        # One reading cannot cover a window, so this never shuts down: it shows what the
        # agent sees (is nvidia-smi found? are jobs and SSH sessions detected?).
        time.sleep(1)  # rates need two looks at the counters, a moment apart
        reading = sampler.read()
        decision = decide_shutdown([reading], policy, reading.at)
        log(agent.Tick(reading, decision, acted=False))
        return
    agent.run_agent(
        sampler,
        shutdown,
        policy,
        clock=lambda: datetime.now(UTC),
        sleep=time.sleep,
        execute=options["execute"],
        on_tick=log,
    )


def shutdown_command(text: str) -> list[str]:
    """``--shutdown-command`` split like a shell would; bad input exits 2 before anything runs.

    >>> shutdown_command("systemctl poweroff")
    ['systemctl', 'poweroff']
    >>> shutdown_command('sh -c "poweroff')
    Traceback (most recent call last):
    ...
    costguard.errors.InputError: --shutdown-command cannot be parsed: No closing quotation
    """
    hint = "quote it as in a shell, e.g. --shutdown-command 'shutdown -h now'"
    try:
        command = shlex.split(text)
    except ValueError as exc:
        msg = f"--shutdown-command cannot be parsed: {exc}"
        raise InputError(msg, hint=hint) from None
    if not command:
        msg = "--shutdown-command is empty"
        raise InputError(msg, hint=hint)
    return command
