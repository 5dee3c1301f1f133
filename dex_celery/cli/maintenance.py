"""`dex-celery sweep` and `dex-celery reconcile`: the two maintenance passes beat runs, by hand.

Grouped apart from `calls` (which only reads records): these act on the ledger and the system
of record, the sweep on what stopped moving, the reconcile pass on `outcome_unknown` calls (S8).
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import click

from dex_celery.app import Dex
from dex_celery.cli.calls import emit_json
from dex_celery.cli.context import DexContext, pass_context
from dex_celery.engine import ReconcileReport, reconcile_once, run_forever
from dex_celery.processes.checks import check_redis
from dex_celery.store.unknowns import UnknownOutcomes


@click.command("sweep")
@click.option("--loop", is_flag=True, help="Keep sweeping every sweep_interval until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@pass_context
def sweep(ctx: DexContext, loop: bool, as_json: bool) -> None:
    """Run the sweeper now: lost, expired and timed-out attempts, unrecorded outcomes, approvals
    past their deadline. Beat runs the same sweep every sweep_interval."""
    dex = ctx.dex
    check_redis(dex, "sweep")  # one warning, or UnsafeRedis: `error:` and exit 1
    if not loop:
        report = dex.sweeper.sweep_once()
        if as_json:
            emit_json(report.as_dict())
        else:
            moved = ", ".join(f"{k}={v}" for k, v in report.as_dict().items() if v) or "nothing due"
            click.echo(f"sweep: {moved}")
        return
    stop = threading.Event()
    # Explicit handlers, as `dev` has: a shell may start us with SIGINT ignored (`sweep --loop &`).
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    click.echo(f"sweeping every {dex.settings.sweep_interval}s; Ctrl-C stops", err=True)
    try:
        run_forever(dex.sweeper, stop=stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --- reconcile ---------------------------------------------------------------------------------


@click.command("reconcile")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@pass_context
def reconcile(ctx: DexContext, as_json: bool) -> None:
    """One reconciliation pass now: surface new outcome_unknown calls, ask each tool's outcome
    check, and report what really happened to the session (S8). Beat runs it periodically."""
    report = reconcile_once(ctx.dex)
    value = reconcile_details(ctx.dex, report)
    if as_json:
        emit_json(value)
    else:
        click.echo(render_reconcile(value))


def reconcile_details(dex: Dex, report: ReconcileReport) -> dict[str, Any]:
    """The run's counts, the keys it touched, and the text of each report it sent."""
    repo = UnknownOutcomes(dex.store)
    reports = []
    for key in report.reported_keys:
        row = repo.get(key)
        reports.append({"key": key, "report": row.report if row else None})
    return {
        **report.as_dict(),
        "surfaced_keys": list(report.surfaced_keys),
        "error_keys": list(report.error_keys),
        "reports": reports,
    }


def render_reconcile(value: dict[str, Any]) -> str:
    counts = ", ".join(f"{k}={v}" for k, v in value.items() if isinstance(v, int))
    lines = [f"reconcile: {counts}"]
    lines.extend(f"  surfaced {k}" for k in value["surfaced_keys"])
    lines.extend(f"  reported {r['key']}: {r['report']}" for r in value["reports"])
    lines.extend(f"  check failed for {k} (asked again next run)" for k in value["error_keys"])
    return "\n".join(lines)
