"""The `dex-celery` command.

Like `celery`, every command finds the deployment through `-A/--app` (or `$DEX_APP`), given
before or after the subcommand: a module, `module:celery_app` or `module:dex`
(`dex_celery.cli.appfinder`). There is no default app; the bundled example runs only under
`dex-celery demo`. Command groups live in the modules of `cli/` and are registered explicitly below.

Exit codes: 0 success; 1 a refused or failed operation (one line `error: ...` on stderr: a
typed `DexError`, Redis or the database unreachable, no schema, a bad URL, a missing driver);
2 bad usage.
"""

from __future__ import annotations

import re
import shlex
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version
from typing import Any

import celery
import click

from dex_celery.backend_errors import translate
from dex_celery.cli.approvals import approvals
from dex_celery.cli.audit import audit
from dex_celery.cli.budgets import budgets
from dex_celery.cli.calls import calls
from dex_celery.cli.context import (
    APP_ENV,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    DexContext,
    app_option,
    pass_context,
)
from dex_celery.cli.history import history
from dex_celery.cli.maintenance import reconcile, sweep
from dex_celery.cli.mcp import mcp
from dex_celery.cli.mcp_servers import mcp_servers
from dex_celery.cli.ops import db, demo, dev
from dex_celery.cli.probe import probe
from dex_celery.cli.sessions import sessions
from dex_celery.cli.status import status
from dex_celery.cli.web import web, webhooks
from dex_celery.cli.writes import writes
from dex_celery.errors import DexError
from dex_celery.settings import Settings

__all__ = ["EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE", "DexContext", "main", "pass_context"]


def package_version() -> str:
    try:
        return distribution_version("dex-celery")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class DexGroup(click.Group):
    """Turns every failure a command can meet into one `error:` line and exit code 1."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        _add_app_option(cmd)
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DexError as e:
            _fail(ctx, e)
        except Exception as e:
            error = translate(e, **_urls(ctx))
            if error is None:
                raise
            _fail(ctx, error)


def _fail(ctx: click.Context, error: DexError) -> None:
    message = " ".join(str(error).split()) or type(error).__name__
    holder = ctx.find_object(DexContext)
    click.echo(f"error: {_name_the_app(message, holder.app_path if holder else None)}", err=True)
    ctx.exit(EXIT_REFUSED)


#: A command quoted (in backticks or parentheses) in an error's hint that does not name its app.
_HINTED_COMMAND = re.compile(r"(?<=[`(])dex-celery (?!-A )")


def _name_the_app(message: str, app: str | None) -> str:
    """The library's hints quote commands without knowing the app (`dex-celery db upgrade`);
    on the command line they name it as the person did, so they run as pasted."""
    if not app:
        return message
    return _HINTED_COMMAND.sub(lambda _m: shlex.join(["dex-celery", "-A", app]) + " ", message)


def _urls(ctx: click.Context) -> dict[str, str]:
    holder = ctx.find_object(DexContext)
    dex = holder.loaded if holder is not None else None
    if dex is not None:
        return {"redis_url": dex.settings.redis_url, "database_url": dex.settings.database_url}
    try:
        settings = Settings.from_env()
    except DexError:
        settings = Settings()
    return {"redis_url": settings.redis_url, "database_url": settings.database_url}


def _add_app_option(cmd: click.Command) -> None:
    """Give `cmd` (and, for a group, each of its commands) its own `-A/--app`."""
    if not any(p.name == "late_app_path" for p in cmd.params):
        cmd.params.append(app_option())
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _add_app_option(sub)


@click.group(cls=DexGroup)
@click.option(
    "-A",
    "--app",
    "app_path",
    envvar=APP_ENV,
    default=None,
    help="The app: module, module:celery_app or module:dex, as for celery -A (or $DEX_APP).",
)
@click.version_option(
    package_version(),
    "--version",
    prog_name="dex-celery",
    message=f"%(prog)s %(version)s (celery {celery.__version__})",
)
@click.pass_context
def main(ctx: click.Context, app_path: str | None) -> None:
    """Run AI-agent tool calls on Celery with honest outcomes."""
    ctx.obj = DexContext(app_path)


for _command in (
    calls,
    sessions,
    approvals,
    sweep,
    reconcile,
    history,
    audit,
    status,
    dev,
    demo,
    db,
    web,
    webhooks,
    mcp,
    mcp_servers,
    budgets,
    writes,
    probe,
):
    main.add_command(_command)
