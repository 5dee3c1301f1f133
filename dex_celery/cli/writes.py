"""`dex-celery writes`: stop every write of the deployment in one move, and resume (S13.2).

    dex-celery -A APP writes freeze --reason TEXT [--tool T ...] [--reject] [--by NAME]
    dex-celery -A APP writes thaw [--tool T ...] [--by NAME]
    dex-celery -A APP writes status [--json]

Who acts is `--by`, else the operating-system user running the command. `freeze` returns once
the ledger holds the freeze: from then on no write is claimed (reads go on); each write a worker
meets is held for a person with the freeze's reason, or rejected with `--reject`. `thaw` lets the
held calls run, in request order. docs/guardrails.md, "Write freeze".

Exit codes (see `cli/main.py`): 0 done, 1 refused (no reason, unknown tool, a backend away; one
line `error: ...` on stderr, nothing written), 2 bad usage.
"""

from __future__ import annotations

import getpass
import json

import click

from dex_celery.cli.context import DexContext, pass_context
from dex_celery.model.freeze import WriteFreeze


def operator(by: str | None) -> str:
    """`--by`, else the operating-system user running the command."""
    if by is not None:
        return by
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container): say which uid it is
        return "uid-unknown"


_TOOL = click.option(
    "--tool",
    "tools",
    multiple=True,
    help="Only this tool (repeat for more); default every tool.",
)
_BY = click.option("--by", default=None, help="Who acts (recorded); default the OS user.")


@click.group()
def writes() -> None:
    """Freeze and thaw every write of the deployment (reads go on)."""


@writes.command("freeze")
@click.option("--reason", required=True, help="Why; shown everywhere and to each held call.")
@_TOOL
@click.option(
    "--reject",
    is_flag=True,
    help="Reject new writes (the model reads why) instead of holding them for a person.",
)
@_BY
@pass_context
def freeze(
    ctx: DexContext, reason: str, tools: tuple[str, ...], reject: bool, by: str | None
) -> None:
    """Freeze writes: no write is claimed once this returns; writes met are held or rejected."""
    made = ctx.dex.writes.freeze(reason=reason, by=operator(by), tools=tools, reject=reject)
    for f in made:
        click.echo(f.line())


@writes.command("thaw")
@_TOOL
@_BY
@pass_context
def thaw(ctx: DexContext, tools: tuple[str, ...], by: str | None) -> None:
    """Thaw writes (of TOOLs, or all) and let the calls the freeze held run, in request order."""
    done = ctx.dex.writes.thaw(by=operator(by), tools=list(tools) or None)
    if not done.thawed:
        click.echo("writes were not frozen" + (f" for {', '.join(tools)}" if tools else ""))
    for f in done.thawed:
        click.echo(f"thawed: writes of {f.scope_text} (frozen by {f.frozen_by}: {f.reason})")
    click.echo(f"released {len(done.released)} held call(s), in request order")
    for f in done.still_frozen:
        click.echo(f"still in force: {f.line()}")


@writes.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the freezes in force as JSON.")
@pass_context
def status(ctx: DexContext, as_json: bool) -> None:
    """Are writes frozen: by whom, since when, why."""
    active = ctx.dex.writes.status()
    if as_json:
        click.echo(json.dumps({"frozen": [f.as_dict() for f in active]}, indent=2))
        return
    click.echo(status_text(active))


def status_text(active: list[WriteFreeze]) -> str:
    if not active:
        return "writes are not frozen"
    return "\n".join(f.line() for f in active)
