"""`dex-celery status [--json]`: is this deployment working, section by section.

Redis, the database and its schema revision, the workers that answer (their Celery node names,
as Flower shows them, main pids, uptimes and restarts under the same name, and the nodes that
were started but no longer answer), the last sweep, and the calls in flight, waiting for
approval and ended `outcome_unknown` but not reported yet, and whether writes are frozen (by
whom, since when, why: S13.2). Exit code 0 when nothing failed
(warnings included), 1 when a section failed (one `error:` line names them).
"""

from __future__ import annotations

import json

import click

from dex_celery.cli.context import EXIT_REFUSED, DexContext, pass_context
from dex_celery.ops.status import HealthReport, State, health_report

MARK = {State.OK: "ok  ", State.WARN: "WARN", State.FAIL: "FAIL"}


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@pass_context
def status(ctx: DexContext, as_json: bool) -> None:
    """Redis, database, schema revision, workers, last sweep, calls in flight, approvals
    waiting, unknown outcomes unreported, the write freeze."""
    ctx.database_may_be_missing = True  # its database section says so (and creates nothing)
    report = health_report(
        ctx.dex, mcp_servers=[s.name for s in ctx.dex.tool_sources], app=ctx.app_path
    )
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(render_status(report))
    if report.failed:
        names = ", ".join(s.name for s in report.failed)
        click.echo(f"error: {names} failed (see above)", err=True)
        raise click.exceptions.Exit(EXIT_REFUSED)


def render_status(report: HealthReport) -> str:
    width = max(len(s.name) for s in report.sections)
    return "\n".join(f"{MARK[s.state]}  {s.name.ljust(width)}  {s.detail}" for s in report.sections)
