"""`dex-celery mcp`: serve the deployment's tools to MCP clients (stdio or streamable HTTP).

See `dex_celery.integrations.mcp.server` for what a `tools/call` does. Needs the `mcp` extra.
"""

from __future__ import annotations

import click

from dex_celery.access import Credentials, check_bind
from dex_celery.backend_errors import require_existing_database
from dex_celery.cli.context import EXIT_USAGE, DexContext, pass_context


@click.command("mcp")
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http", "streamable-http"]),
    default="stdio",
    show_default=True,
    help="stdio for a client that starts this command; http (or streamable-http) for "
    "streamable HTTP.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP: address to bind.")
@click.option("--port", type=int, default=8000, show_default=True, help="HTTP: port to bind.")
@click.option("--path", default="/mcp", show_default=True, help="HTTP: the endpoint's path.")
@click.option(
    "--session",
    "session_id",
    default=None,
    help="Session id of calls whose request carries no ids (default: mcp-<user>@localhost, "
    "the same for every server process of the OS user).",
)
@click.option(
    "--wait-timeout",
    type=click.FloatRange(min=0.1),
    default=300.0,
    show_default=True,
    help="Seconds a tools/call waits for its outcome before answering that it is in flight.",
)
@click.option(
    "--task-after",
    type=click.FloatRange(min=0.0),
    default=1.0,
    show_default=True,
    help="Seconds a queued or running call is waited for before a client that speaks the "
    "MCP tasks extension gets a task instead (a call waiting for approval is one at once).",
)
@pass_context
def mcp(
    ctx: DexContext,
    transport: str,
    host: str,
    port: int,
    path: str,
    session_id: str | None,
    wait_timeout: float,
    task_after: float,
) -> None:
    """Serve the registered tools over MCP; every call goes through the ledger."""
    try:
        # Deferred: the `mcp` extra is optional; the rest of the CLI works without it.
        from dex_celery.integrations.mcp.server import serve
    except ImportError as e:
        click.echo(
            f"error: dex-celery mcp needs the mcp extra: pip install 'dex-celery[mcp]' ({e})",
            err=True,
        )
        raise SystemExit(EXIT_USAGE) from None
    dex = ctx.load(check_database=False)
    if transport != "stdio":  # the configuration first: an open bind is refused before all
        check_bind(host, Credentials.from_settings(dex.settings), "the MCP server")
    require_existing_database(dex.settings.database_url)  # serving never creates a file
    serve(
        dex,
        transport=transport,
        host=host,
        port=port,
        path=path,
        session_id=session_id,
        wait_timeout=wait_timeout,
        task_after=task_after,
    )
