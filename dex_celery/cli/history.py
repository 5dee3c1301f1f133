"""`dex-celery history prune`: remove old history by hand, archived first (S12.4).

Beat does the same on a schedule when `retention` is set (`engine/upkeep/retention.py`). Progress goes
to stderr (about once a second on a long run); the one summary line, or `--json`, to stdout.

What it may write, and what it needs: the archive only when it is new or an archive an earlier
prune wrote (`store/archive.is_archive`: appended to; anything else is refused before anything
is deleted); never a database (a SQLite file that is not there is refused, not created). A dry
run reads SQL only, with this machine's clock; a prune also asks the ledger (Redis) for its
clock and whether a failed repeat-guard holder's attempt may still run (S5.4).
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from dex_celery.cli.calls import emit_json
from dex_celery.cli.context import DexContext, pass_context
from dex_celery.engine import PruneReport, archive_path, prune
from dex_celery.errors import InvalidRequest
from dex_celery.model.times import format_utc, parse_since
from dex_celery.store.archive import check_archive_target
from dex_celery.store.retention import StillRunning

#: Seconds between two progress lines.
PROGRESS_EVERY = 1.0


@click.group("history")
def history() -> None:
    """The SQL history of calls and sessions: bounded by a retention (see docs/operations.md)."""


@history.command("prune")
@click.option(
    "--before",
    required=True,
    help="Remove calls that ended before this: a duration ago (30d, 12h) or an ISO 8601 time.",
)
@click.option(
    "--archive",
    "archive",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append what is removed to this gzip JSON-lines file: a new file, or an archive an "
    "earlier prune wrote (anything else is refused; default: a new file in the "
    "retention_archive directory).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Count what would go; write and delete nothing (reads SQL only: Redis may be down).",
)
@click.option(
    "--batch",
    type=int,
    default=None,
    help="Calls per transaction (default: the prune_batch setting).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@pass_context
def prune_command(
    ctx: DexContext,
    before: str,
    archive: Path | None,
    dry_run: bool,
    batch: int | None,
    as_json: bool,
) -> None:
    """Remove the calls that ended before --before and can never matter again (open calls,
    waiting approvals, unreconciled unknown outcomes and repeat-guard windows stay), with the
    sessions and messages only they hold; archived, and fsynced, before anything is deleted."""
    if batch is not None and batch <= 0:
        raise InvalidRequest(f"--batch must be positive, got {batch}")
    parse_since(before, now=0.0, option="--before")  # bad input fails before any connection
    if archive is not None and not dry_run:
        check_archive_target(archive)  # before the app loads: nothing connected, nothing gone
    dex = ctx.dex  # a SQLite file that is not there is refused here, not created
    still_running: StillRunning
    if dry_run:
        # SQL only: this machine's clock, and a failed repeat-guard holder counted as kept (a
        # real prune asks the ledger whether its attempt may still run).
        now, still_running = time.time(), _may_still_run
    else:
        now, still_running = dex.store.clock(), dex.ledger.still_running
    cutoff = parse_since(before, now=now, option="--before")
    if cutoff > now:
        raise InvalidRequest(f"--before {before!r} is in the future ({format_utc(cutoff)})")
    target = archive or archive_path(dex.settings.retention_archive, now)
    if not dry_run:
        check_archive_target(target)
    last = [time.monotonic() - PROGRESS_EVERY]

    def progress(report: PruneReport) -> None:
        if time.monotonic() - last[0] >= PROGRESS_EVERY:
            last[0] = time.monotonic()
            click.echo(f"{report.summary()} so far", err=True)

    if not dry_run:
        click.echo(
            f"history prune: removing what ended before {format_utc(cutoff)}, archived to {target}",
            err=True,
        )
    result = prune(
        dex.store,
        cutoff=cutoff,
        now=now,
        archive=None if dry_run else target,
        batch=batch or dex.settings.prune_batch,
        still_running=still_running,
        dry_run=dry_run,
        progress=progress,
    )
    if as_json:
        emit_json(result.as_dict())
    else:
        click.echo(result.summary())


def _may_still_run(_key: str) -> bool:
    """A dry run's answer for a failed repeat-guard holder: it may (the ledger is not asked)."""
    return True
