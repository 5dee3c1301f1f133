"""`dex-celery dev`, `dex-celery demo`, `dex-celery db upgrade|downgrade|current`.

`dev` is the whole local stack in one command; `demo` runs a scripted agent session against it
and prints one call of each outcome; `db` runs the Alembic migrations with the database URL
from the settings (production never uses `create_all`).
"""

from __future__ import annotations

import shlex
import signal
import sys
import time
from types import FrameType

import click
from celery import Celery
from sqlalchemy import Engine

from dex_celery.app import Dex
from dex_celery.backend_errors import require_existing_database, safe_url
from dex_celery.cli.appfinder import NO_APP_HINT
from dex_celery.cli.context import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, DexContext, pass_context
from dex_celery.engine import LedgerEpoch
from dex_celery.errors import AppNotFound, LedgerMismatch, RebindNotConfirmed
from dex_celery.examples.orderdesk.demo import DemoResult, run_demo
from dex_celery.ops.present import command_line
from dex_celery.processes.localstack import (
    LocalStack,
    PrerequisiteMissing,
    expanded_node_name,
    ping_app,
    prepare_database,
    worker_answers,
)
from dex_celery.processes.supervise import Supervisor
from dex_celery.settings import Settings
from dex_celery.store.bindings import Binding, read_binding, release_binding
from dex_celery.store.sql_engine import make_engine

#: Exit code of `dex-celery demo` for each way the demo ends.
DEMO_EXIT_CODES = {
    DemoResult.OK: EXIT_OK,
    DemoResult.PREREQUISITE_MISSING: EXIT_USAGE,
    DemoResult.FAILED: EXIT_REFUSED,
}


#: Seconds between two looks of `dev` at the processes it started.
SUPERVISE_INTERVAL = 0.5


def _raise_keyboard_interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


# --- dev -----------------------------------------------------------------------------------------


@click.command("dev")
@click.option("--flower", is_flag=True, help="Start Flower too.")
@click.option("--flower-port", type=int, default=5555, show_default=True)
@click.option("--concurrency", "-c", type=click.IntRange(min=1), default=2, show_default=True)
@pass_context
def dev(ctx: DexContext, flower: bool, flower_port: int, concurrency: int) -> None:
    """The whole local stack: Redis (the configured one, or a private redis-server), a prefork
    worker and beat, and with --flower, Flower. A worker, beat or Flower that exits is started
    again after a short, bounded delay. Ctrl-C stops everything it started."""
    echo = click.echo
    ctx.database_may_be_missing = True  # the embedded default: `prepare_database` makes it
    if not ctx.app_path:
        raise AppNotFound(NO_APP_HINT)
    stack = LocalStack(
        # The module only: `celery -A` finds its Celery app, as it would `-A proj`; the stack's
        # processes get DEX_REDIS_URL naming its Redis in their environment.
        ctx.app_path.partition(":")[0],
        concurrency=concurrency,
        flower_port=flower_port if flower else None,
        echo=echo,
    )
    line_buffered()
    # Explicit handlers: a shell may start us with SIGINT ignored (`dex-celery dev &`).
    previous = {
        sig: signal.signal(sig, _raise_keyboard_interrupt)
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        try:
            stack.start_redis()
            settings = stack.settings(Settings.from_env())
            prepare_database(settings, echo)
            # Before the worker and beat start: a database that is another ledger's is refused
            # here in one `error:` line that says how to recover (the stack is stopped below),
            # not in their logs while `dev` says it is ready.
            check_ledger(stack.settings(ctx.dex.settings))  # as the app's worker will look
            stack.start_celery()
            node = expanded_node_name(stack.worker_name)
            pinger = ping_app(settings)
            stack.wait_for_worker(lambda: worker_answers(pinger, node))
        except PrerequisiteMissing as e:
            stack.stop()
            click.echo(f"error: {e}", err=True)
            ctx_exit(EXIT_USAGE)
        echo(f"worker {node} is ready; tools: {', '.join(sorted(ctx.dex.tools))}")
        try_it = command_line(ctx.app_path, "calls", "list")
        echo(f"try:    DEX_REDIS_URL={shlex.quote(stack.redis_url)} {try_it}")
        echo("Press Ctrl-C to stop.")
        # A worker, beat or Flower that exits is started again (with a bounded backoff); the
        # private Redis is not (dex_celery.processes.supervise).
        supervisor = Supervisor(stack, echo=echo)
        supervisor.watch()
        while True:
            dead = supervisor.poll()
            if dead:
                click.echo(
                    f"error: {dead[0].name} exited with code {dead[0].process.returncode}; "
                    "stopping the stack",
                    err=True,
                )
                stack.stop()
                ctx_exit(EXIT_REFUSED)
            time.sleep(SUPERVISE_INTERVAL)
    except KeyboardInterrupt:
        echo("\nstopping...")
        stack.stop()
        echo("stopped; nothing left running")
    finally:
        stack.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def check_ledger(settings: Settings) -> None:
    """The look every process of the stack makes first (docs/ledger.md, "One database, one
    ledger"): raises `LedgerMismatch`; binds a database bound to nothing, or to a private
    ledger that is gone, to the stack's."""
    dex = Dex(Celery("dex-dev-ledger-check"), settings)
    try:
        dex.runtime.epoch.current()
    finally:
        dex.runtime.redis.close()
        dex.store.engine.dispose()


def line_buffered() -> None:
    """Print each line as it is written, also into a pipe (a test, `tee`, a CI log)."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(line_buffering=True)


def ctx_exit(code: int) -> None:
    raise click.exceptions.Exit(code)


# --- demo ----------------------------------------------------------------------------------------


@click.command("demo")
@click.option("--timeout", type=float, default=45.0, show_default=True, help="Seconds to wait.")
@pass_context
def demo(ctx: DexContext, timeout: float) -> None:
    """A scripted agent session on the bundled order desk example (it ignores -A): one call ends succeeded, one failed (did not
    run), one rejected and one outcome_unknown (its worker is SIGKILLed mid-call); then the
    reconciliation report. Starts the local stack itself, like `dev`, and stops it after."""
    line_buffered()
    result = run_demo(Settings.from_env(), timeout=timeout)
    ctx_exit(DEMO_EXIT_CODES[result])


# --- db ------------------------------------------------------------------------------------------


@click.group("db")
def db() -> None:
    """Schema migrations (Alembic) of the database the app's settings name (with -A: its
    dex_database_url, DEX_DATABASE_URL over it; without: DEX_DATABASE_URL)."""


def _db_settings(ctx: DexContext) -> Settings:
    """The app's settings when one is named (a Django project keeps its database URL in its
    settings, docs/django.md), else the environment's: `db` works before any app exists too."""
    return ctx.dex.settings if ctx.app_path else Settings.from_env()


@db.command("upgrade")
@click.argument("revision", default="head")
@pass_context
def db_upgrade(ctx: DexContext, revision: str) -> None:
    """Migrate up to REVISION (default: head)."""
    from dex_celery.store.migrate import upgrade  # deferred: Alembic is slow to import

    ctx.database_may_be_missing = True  # the one command that creates the database
    settings = _db_settings(ctx)
    at = upgrade(settings.database_url, revision, schema=settings.database_schema)
    click.echo(f"{_where(settings)}: at revision {at}")


@db.command("downgrade")
@click.argument("revision")
@pass_context
def db_downgrade(ctx: DexContext, revision: str) -> None:
    """Migrate down to REVISION (`-1` one step, `base` drops every dex-celery table)."""
    from dex_celery.store.migrate import downgrade  # deferred: Alembic is slow to import

    settings = _db_settings(ctx)
    require_existing_database(settings.database_url)
    at = downgrade(settings.database_url, revision, schema=settings.database_schema)
    click.echo(f"{_where(settings)}: at revision {at or 'base (no tables)'}")


@db.command("current")
@pass_context
def db_current(ctx: DexContext) -> None:
    """Print the revision the database is at, and the newest one."""
    from dex_celery.store.migrate import current, head  # deferred: Alembic is slow to import

    settings = _db_settings(ctx)
    require_existing_database(settings.database_url)
    at = current(settings.database_url, settings.database_schema)
    click.echo(f"{_where(settings)}: at revision {at or 'none'} (newest: {head()})")


@db.command("rebind-ledger")
@click.option(
    "--yes",
    is_flag=True,
    help="Rebind: the old ledger is gone for good and no process uses it any more.",
)
@click.option(
    "--release",
    is_flag=True,
    help="Forget the old ledger instead (no Redis needed): the next process to look binds the "
    "database to the ledger of its own Redis, e.g. the next `dev` or `demo`.",
)
@pass_context
def db_rebind_ledger(ctx: DexContext, yes: bool, release: bool) -> None:
    """Bind the database to the ledger in the app's Redis, after the ledger it was bound to
    is gone for good (docs/ledger.md, "One database, one ledger"): the calls in flight are
    judged from the database, as after a Redis rollback. Without --yes, says what it would do."""
    if release:
        _release_ledger(ctx, yes)
        return
    dex = ctx.dex
    epoch = dex.runtime.epoch
    if _belongs_to_the_app(epoch):
        binding = read_binding(dex.store.engine)
        assert binding is not None  # the look above binds a database bound to nothing
        click.echo(
            f"{_where(dex.settings)}: bound to the ledger at {binding.location} (ledger "
            f"{binding.ledger_id}), the app's: nothing to rebind"
        )
        return
    before = read_binding(dex.store.engine)
    assert before is not None  # a mismatch needs a binding
    target = epoch.location
    click.echo(f"{_where(dex.settings)}: {_bound_to(before)}; the app's Redis is {target}")
    if not yes:
        raise RebindNotConfirmed(
            f"nothing was changed: rerun with --yes to bind the database to the ledger at "
            f"{target}, once the old ledger is gone for good and no process uses it (a process "
            "still on it could run a read or an idempotent write again; writes never run twice)"
        )
    _old, now = epoch.rebind()
    click.echo(
        f"{_where(dex.settings)}: bound to the ledger at {now.location} (ledger "
        f"{now.ledger_id}); the calls in flight are judged from the database at the next sweep"
    )


def _release_ledger(ctx: DexContext, yes: bool) -> None:
    """`rebind-ledger --release`: SQL work only, so it works while no Redis of the old ledger
    or of the next stack runs (a `dev` or `demo` stack's private Redis lives only as it does)."""
    settings = _db_settings(ctx)
    require_existing_database(settings.database_url)
    engine = make_engine(settings.database_url, settings.database_schema)
    try:
        _release(settings, engine, yes)
    finally:
        engine.dispose()


def _release(settings: Settings, engine: Engine, yes: bool) -> None:
    before = read_binding(engine)
    if before is None:
        click.echo(f"{_where(settings)}: bound to no ledger: nothing to release")
        return
    click.echo(f"{_where(settings)}: {_bound_to(before)}")
    if not yes:
        raise RebindNotConfirmed(
            "nothing was changed: rerun with --yes to release the database, once that ledger "
            "is gone for good and no process uses it (a process still on it could run a read "
            "or an idempotent write again; writes never run twice)"
        )
    if not release_binding(engine, expected=before.ledger_id):
        raise LedgerMismatch(
            "another process bound this database to another ledger meanwhile: nothing was "
            "released by this command"
        )
    click.echo(
        f"{_where(settings)}: released; the next process to look binds it to the ledger of its "
        "Redis, and the calls in flight that ledger does not hold are judged from the database"
    )


def _bound_to(binding: Binding) -> str:
    return (
        f"bound to the ledger at {binding.location} (ledger {binding.ledger_id}, "
        f"{binding.origin.value} Redis)"
    )


def _belongs_to_the_app(epoch: LedgerEpoch) -> bool:
    """Is the database the ledger's of the app's Redis (the look any process makes first)?"""
    try:
        epoch.current(refresh=True)
    except LedgerMismatch:
        return False
    return True


def _where(settings: Settings) -> str:
    url = safe_url(settings.database_url)
    return f"{url} schema {settings.database_schema}" if settings.database_schema else url
