"""``costguard checkpoint ls/verify/export``: what a store holds, is it intact, get it out."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from costguard.cli import render
from costguard.cli.helpformat import HelpGroup
from costguard.cli.params import Name, StoreUrl, WholeNumber, table_or_json
from costguard.errors import EXIT_FAILURE
from costguard.text import visible


def _open(url: str) -> Any:
    # fsspec and the storage backends load only when a checkpoint command runs.
    from costguard.checkpoint.export import open_store

    return open_store(url)


def _when(unix: float | None) -> str:
    if unix is None:
        return "-"
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M")


def _size(n: int) -> str:
    from costguard.checkpoint.saving import human_size

    return human_size(n)


@click.group(
    "checkpoint",
    cls=HelpGroup,
    short_help="List, verify and export checkpoints in a store.",
    epilog="""\b
Examples:
  costguard checkpoint ls s3://my-bucket/run1
  costguard checkpoint verify checkpoints/
  costguard checkpoint export s3://my-bucket/run1 --to model.safetensors""",
)
def checkpoint_group() -> None:
    """List, verify and export the checkpoints written by `costguard run` or a Checkpointer."""


@checkpoint_group.command(
    "ls",
    epilog="""\b
Examples:
  costguard checkpoint ls checkpoints/
  costguard checkpoint ls s3://my-bucket/run1 --format json""",
)
@click.argument("url", type=StoreUrl())
@table_or_json()
def ls_command(url: str, output_format: str) -> None:
    """List the checkpoints at URL, newest first; * marks the one a resume starts from.

    The marked one is verified (every object's sha256), exactly as a resume would check
    it. A missing store is an error; nothing is created. On the parent folder of a job
    array (`costguard slurm script --array`: task-<index> folders, no checkpoints of its
    own), each task's latest checkpoint.
    """
    from costguard.checkpoint.inventory import inventory, task_inventory

    store = _open(url)
    tasks = task_inventory(store)
    if tasks:
        _ls_tasks(store.url, tasks, output_format)
        return
    entries = inventory(store)
    if output_format == "json":
        render.print_json(
            {
                "url": store.url,
                "checkpoints": [
                    {
                        "name": e.name,
                        "step": e.step,
                        "status": e.status,
                        "size_bytes": e.size_bytes,
                        "created_unix": e.created_unix,
                        "reason": e.reason,
                        "latest": e.latest,
                        "problem": e.problem,
                    }
                    for e in entries
                ],
            }
        )
        return
    if not entries:
        click.echo(f"No checkpoints at {visible(store.url)}.")
        return
    # 80 columns: the date without the year, the reason's kind (the JSON has it whole).
    click.echo(f"  {'CHECKPOINT':<27} {'STEP':>8} {'STATUS':<10} {'SIZE':>9} {'CREATED UTC':<11}")
    for e in entries:
        mark = "*" if e.latest else " "
        reason = "" if e.reason == "schedule" else visible(e.reason.split(":", 1)[0])
        line = (
            f"{mark} {e.name:<27} {e.step:>8} {e.status:<10} {_size(e.size_bytes):>9} "
            f"{_when(e.created_unix)[5:]:<11} {reason}"
        )
        click.echo(line.rstrip())
        if e.problem:
            click.echo(f"    {visible(e.problem[:200])}")
    latest = next((e for e in entries if e.latest), None)
    if latest is None:
        click.echo("No checkpoint verifies: a resume would start from step 0.")
    else:
        click.echo(f"* = the checkpoint a resume starts from (step {latest.step}, verified)")


def _ls_tasks(url: str, tasks: list[Any], output_format: str) -> None:
    """A job array's tasks, one line each: the latest checkpoint a resume would use."""
    if output_format == "json":
        render.print_json(
            {
                "url": url,
                "tasks": [
                    {
                        "task": t.task,
                        "index": t.index,
                        "checkpoints": t.checkpoints,
                        "latest": None
                        if t.latest is None
                        else {
                            "name": t.latest.name,
                            "step": t.latest.step,
                            "size_bytes": t.latest.size_bytes,
                            "created_unix": t.latest.created_unix,
                            "reason": t.latest.reason,
                        },
                    }
                    for t in tasks
                ],
            }
        )
        return
    # 80 columns, as for one run's checkpoints.
    click.echo(
        f"{'TASK':<12} {'LATEST CHECKPOINT':<27} {'STEP':>8} {'SIZE':>9} {'CREATED UTC':<11} N"
    )
    for t in tasks:
        if t.latest is None:
            none = "- (none verifies)"
            click.echo(f"{t.task[:12]:<12} {none:<27} {'-':>8} {'-':>9} {'-':<11} {t.checkpoints}")
            continue
        e = t.latest
        click.echo(
            f"{t.task[:12]:<12} {e.name:<27} {e.step:>8} {_size(e.size_bytes):>9} "
            f"{_when(e.created_unix)[5:]:<11} {t.checkpoints}"
        )
    click.echo(f"{len(tasks)} array task(s); N = checkpoints in each task's folder.")


@checkpoint_group.command(
    "verify",
    epilog="""\b
Examples:
  costguard checkpoint verify checkpoints/
  costguard checkpoint verify s3://my-bucket/run1 --latest""",
)
@click.argument("url", type=StoreUrl())
@click.option("--latest", is_flag=True, help="Check only the checkpoint a resume would use.")
@table_or_json()
@click.pass_context
def verify_command(ctx: click.Context, url: str, latest: bool, output_format: str) -> None:
    """Read each checkpoint at URL, newest first, and check every object's size and sha256.

    Exits 1 when any checked checkpoint is damaged (a resume then falls back to an older
    one), and when there is nothing to check.
    """
    from costguard.checkpoint.inventory import verify

    store = _open(url)
    results = verify(store, latest_only=latest)
    if output_format == "json":
        render.print_json(
            {
                "url": store.url,
                "ok": bool(results) and all(r.ok for r in results),
                "checkpoints": [
                    {"name": r.name, "step": r.step, "ok": r.ok, "problem": r.problem}
                    for r in results
                ],
            }
        )
    else:
        for r in results:
            click.echo(f"{'ok ' if r.ok else 'BAD'}  {r.name}  step {r.step}")
            if r.problem:
                click.echo(f"     {visible(r.problem[:200])}")
        if not results:
            click.echo(f"No checkpoint with a manifest at {visible(store.url)}.")
    if not results or not all(r.ok for r in results):
        ctx.exit(EXIT_FAILURE)


@checkpoint_group.command(
    "export",
    epilog="""\b
Examples:
  costguard checkpoint export s3://my-bucket/run1 --to model.safetensors
  costguard checkpoint export checkpoints/ --step 500 --to model.pt
  costguard checkpoint export checkpoints/ --part optimizer --to optimizer.pt

\b
In Python:
  from costguard.checkpoint import load_state
  model.load_state_dict(load_state("s3://my-bucket/run1")["model"])""",
)
@click.argument("url", type=StoreUrl())
@click.option(
    "--to",
    "target",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The file to write: NAME.safetensors or NAME.pt.",
)
@click.option("--step", type=WholeNumber(min=0), help="Export this step [default: the newest].")
@click.option(
    "--part", type=Name(), default="model", show_default=True, help="Which part of the state."
)
def export_command(url: str, target: Path, step: int | None, part: str) -> None:
    """Write the weights (or another part) of a verified checkpoint at URL as a plain file.

    The newest checkpoint that verifies is used unless --step says otherwise. The file
    appears complete or not at all.
    """
    from costguard.checkpoint.export import export

    with render.progress_bar(f"exporting to {target.name}") as progress:
        manifest = export(url, target, step=step, part=part, progress=progress)
    click.echo(
        f"Wrote {target} ({_size(target.stat().st_size)}): {part} of {manifest.name} "
        f"(step {manifest.step})."
    )
