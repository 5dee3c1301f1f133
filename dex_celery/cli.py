"""The `dex-celery` command.

Each command group lives in its own module (`cli_*.py`) and is attached to `main` here. Every
command finds the deployment through `--app module:attribute` (default `config.celery_app:dex`,
or `$DEX_APP`), the same object the Celery worker imports.

Exit codes: 0 success, 1 a refused operation (typed `DexError`, message on stderr), 2 bad usage
or a missing prerequisite.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from dex_celery.app import Dex
from dex_celery.errors import DexError

DEFAULT_APP = "config.celery_app:dex"

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2


def load_dex(path: str) -> Dex:
    """Import `module:attribute` and return the `Dex` it names."""
    module_name, _, attribute = path.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise click.UsageError(f"cannot import {module_name!r} (from --app {path!r}): {e}") from e
    value: Any = getattr(module, attribute or "dex", None)
    if not isinstance(value, Dex):
        raise click.UsageError(f"--app {path!r} does not name a dex_celery.Dex object")
    return value


class DexContext:
    """What every command receives: the app path, loaded on first use."""

    def __init__(self, app_path: str) -> None:
        self.app_path = app_path
        self._dex: Dex | None = None

    @property
    def dex(self) -> Dex:
        if self._dex is None:
            self._dex = load_dex(self.app_path)
        return self._dex


pass_context = click.make_pass_decorator(DexContext)


class DexGroup(click.Group):
    """Turns a `DexError` into a one-line message and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DexError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(EXIT_REFUSED)


@click.group(cls=DexGroup)
@click.option(
    "--app",
    "app_path",
    envvar="DEX_APP",
    default=DEFAULT_APP,
    show_default=True,
    help="The Dex object to use, as module:attribute.",
)
@click.pass_context
def main(ctx: click.Context, app_path: str) -> None:
    """Run AI-agent tool calls on Celery with honest outcomes."""
    ctx.obj = DexContext(app_path)


def _attach_command_groups() -> None:
    """Attach the command modules that exist; each defines `commands: list[click.Command]`."""
    for name in ("cli_calls", "cli_approvals", "cli_ops", "cli_web", "cli_mcp"):
        try:
            module = importlib.import_module(f"dex_celery.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"dex_celery.{name}":
                raise
            continue
        for command in module.commands:
            main.add_command(command)


_attach_command_groups()
