"""What every `dex-celery` command receives: the app named by `-A/--app`, loaded on first use.

Kept apart from `cli.py` so the command modules can import it while `cli.py` imports them to
register them (as `celery/bin/celery.py` registers its commands).
"""

from __future__ import annotations

from typing import Any

import click

from dex_celery.app import Dex
from dex_celery.backend_errors import require_existing_database
from dex_celery.cli.appfinder import find_dex

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2

#: The environment variable naming the app when `-A/--app` is not given.
APP_ENV = "DEX_APP"


class DexContext:
    """The app path, and the `Dex` it names once a command asks for it.

    Loading the app refuses a SQLite database file that does not exist (`SchemaMissing`, one
    `error:` line): SQLite would create an empty file on the first connection, so a mistyped
    URL would leave one behind (S9.4). Only the commands meant to create the database (`db upgrade`,
    `dev`) or that report a missing one themselves (`status`) set `database_may_be_missing`.
    """

    def __init__(self, app_path: str | None) -> None:
        self.app_path = app_path
        self._dex: Dex | None = None
        #: Set by a command that may create the database, or reports a missing one itself.
        self.database_may_be_missing = False

    @property
    def dex(self) -> Dex:
        return self.load()

    def load(self, *, check_database: bool = True) -> Dex:
        """The app; `check_database=False` for a command that checks its own configuration
        first (a server's bind) and the database after (`require_existing_database`)."""
        if self._dex is None:
            self._dex = find_dex(self.app_path)
            if check_database and not self.database_may_be_missing:
                require_existing_database(self._dex.settings.database_url)
        return self._dex

    @property
    def loaded(self) -> Dex | None:
        """The `Dex` if a command loaded it already (for naming URLs in error messages)."""
        return self._dex


pass_context = click.make_pass_decorator(DexContext)


def set_app_after_subcommand(ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
    """`dex-celery calls list -A proj`: the option given after the subcommand wins, as in Celery."""
    if value is not None:
        holder = ctx.find_object(DexContext)
        if holder is not None:
            holder.app_path = value
    return value


def app_option() -> click.Option:
    """The `-A/--app` option every subcommand accepts too."""
    return click.Option(
        ["-A", "--app", "late_app_path"],
        default=None,
        expose_value=False,
        callback=set_app_after_subcommand,
        help="The app: module, module:celery_app or module:dex (as celery -A).",
    )
