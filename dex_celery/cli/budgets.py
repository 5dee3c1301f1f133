"""`dex-celery budgets show`: every write budget scope's used, held and left (S13.1).

Scopes are read from the charges SQL holds (`store/budgets.py`), their totals from the ledger
(or counted from SQL where the ledger holds none now); limits are the budgets as declared now.
"""

from __future__ import annotations

import click

from dex_celery.backend_errors import require_existing_database
from dex_celery.cli.calls import database_errors, emit_json
from dex_celery.cli.context import DexContext, pass_context
from dex_celery.ops.budgets import BUDGET_COLUMNS, declared_budgets, render_views, scope_views
from dex_celery.ops.present import render_table


@click.group("budgets")
def budgets() -> None:
    """Write budgets: what is used, held and left."""


@budgets.command("show")
@click.option("--budget", "name", default=None, help="Only this budget.")
@click.option(
    "--scope",
    default=None,
    help="Only this scope: session:<id>, principal:<name> or deployment.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def budgets_show(ctx: DexContext, name: str | None, scope: str | None, as_json: bool) -> None:
    """Each budget scope calls drew on: limit, used (reserved and spent), held, left."""
    require_existing_database(ctx.dex.settings.database_url)
    with database_errors(ctx.dex):
        declared = declared_budgets(ctx.dex, ctx.dex.tools.values())
        views = scope_views(ctx.dex, declared, budget=name, scope=scope)
    if as_json:
        emit_json(
            {
                "declared": [b.name for b in declared.values()],
                "scopes": [v.as_dict() for v in views],
            }
        )
        return
    if not declared:
        click.echo("no budgets are declared")
        return
    if not views:
        click.echo("no call has drawn on a budget" + (" in that scope" if scope or name else ""))
        return
    click.echo(render_table(BUDGET_COLUMNS, render_views(views)))
