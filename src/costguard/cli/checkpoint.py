"""``costguard checkpoint ls/verify``: what a checkpoint store holds, and is it intact."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

import click

from costguard.cli import render
from costguard.errors import EXIT_FAILURE, InputError


def _open(url: str) -> Any:
    # fsspec and the storage backends load only when a checkpoint command runs.
    from costguard.checkpoint.store import Store

    text = os.environ.get("COSTGUARD_STORAGE_OPTIONS", "").strip()
    options = json.loads(text) if text else None
    if options is not None and not isinstance(options, dict):
        msg = "COSTGUARD_STORAGE_OPTIONS must be a JSON object"
        raise InputError(msg)
    return Store.open(url, options)


def _when(unix: float | None) -> str:
    if unix is None:
        return "-"
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


FORMAT = click.Choice(["table", "json"])


@click.group(
    "checkpoint",
    short_help="List and verify checkpoints in a store.",
    epilog="""\b
Examples:
  costguard checkpoint ls s3://my-bucket/run1
  costguard checkpoint verify checkpoints/""",
)
def checkpoint_group() -> None:
    """List and verify the checkpoints written by `costguard run` or a Checkpointer."""


@checkpoint_group.command(
    "ls",
    epilog="""\b
Examples:
  costguard checkpoint ls checkpoints/
  costguard checkpoint ls s3://my-bucket/run1 --format json""",
)
@click.argument("url")
@click.option("--format", "output_format", type=FORMAT, default="table", show_default=True)
def ls_command(url: str, output_format: str) -> None:
    """List the checkpoints at URL, oldest first; the one a resume would use is marked."""
    from costguard.checkpoint.inventory import inventory

    entries = inventory(_open(url))
    if output_format == "json":
        render.print_json(
            {
                "url": url,
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
        click.echo(f"No checkpoints at {url}.")
        return
    for e in entries:
        mark = "*" if e.latest else " "
        line = f"{mark} {e.name}  step {e.step:>9}  {e.status:<10} {e.size_bytes:>12} B  "
        line += f"{_when(e.created_unix)}  {e.reason}"
        click.echo(line.rstrip() + (f"  ({e.problem})" if e.problem else ""))
    click.echo("* = the checkpoint a resume starts from")


@checkpoint_group.command(
    "verify",
    epilog="""\b
Examples:
  costguard checkpoint verify checkpoints/
  costguard checkpoint verify s3://my-bucket/run1 --latest""",
)
@click.argument("url")
@click.option("--latest", is_flag=True, help="Check only the checkpoint a resume would use.")
@click.option("--format", "output_format", type=FORMAT, default="table", show_default=True)
@click.pass_context
def verify_command(ctx: click.Context, url: str, latest: bool, output_format: str) -> None:
    """Read each checkpoint at URL and check every object's size and sha256.

    Exits 1 when any checked checkpoint is damaged (a resume then falls back to an older
    one), and when there is nothing to check.
    """
    from costguard.checkpoint.inventory import verify

    results = verify(_open(url), latest_only=latest)
    if output_format == "json":
        render.print_json(
            {
                "url": url,
                "ok": bool(results) and all(r.ok for r in results),
                "checkpoints": [
                    {"name": r.name, "step": r.step, "ok": r.ok, "problem": r.problem}
                    for r in results
                ],
            }
        )
    else:
        for r in results:
            click.echo(
                f"{'ok  ' if r.ok else 'BAD '} {r.name}  step {r.step}  {r.problem}".rstrip()
            )
        if not results:
            click.echo(f"No complete checkpoint at {url}.")
    if not results or not all(r.ok for r in results):
        ctx.exit(EXIT_FAILURE)
