"""`dex-celery web` and `dex-celery webhooks status`: the operators' tools."""

from __future__ import annotations

import click

from dex_celery.access import Credentials, check_bind
from dex_celery.backend_errors import require_existing_database
from dex_celery.cli.calls import emit_json
from dex_celery.cli.context import DexContext, pass_context
from dex_celery.ops.webhooks import delivery_status, render_status


@click.command("web")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--ssl-certfile",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Serve https with this certificate (PEM); cookies are then Secure.",
)
@click.option(
    "--ssl-keyfile",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="The certificate's private key (PEM).",
)
@pass_context
def web(
    ctx: DexContext,
    host: str,
    port: int,
    log_level: str,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
) -> None:
    """Approvals, calls and unknown outcomes in a browser, and /metrics for Prometheus.

    Sign-in from DEX_WEB_USERS / DEX_WEB_TOKENS; without them only a loopback address is served.
    Only requests naming a loopback Host, the bind address or DEX_ALLOWED_HOSTS are answered
    (docs/security.md).
    """
    if (ssl_certfile is None) != (ssl_keyfile is None):
        raise click.UsageError("give both --ssl-certfile and --ssl-keyfile, or neither")
    try:
        # deferred: the web app's packages are an optional extra
        from dex_celery.web.server import serve
    except ImportError as e:
        raise click.UsageError(
            f"the web app needs the web extra: pip install 'dex-celery[web]' ({e})"
        ) from e
    dex = ctx.load(check_database=False)
    check_bind(host, Credentials.from_settings(dex.settings))  # the configuration first
    require_existing_database(dex.settings.database_url)  # serving never creates a file
    serve(
        dex,
        host=host,
        port=port,
        log_level=log_level,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )


@click.group("webhooks")
def webhooks() -> None:
    """Webhooks that beat sends (awaiting approval, outcome unknown, reconciliation reports)."""


@webhooks.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def webhooks_status(ctx: DexContext, as_json: bool) -> None:
    """Delivery state per receiver: delivered, waiting, retries, given up, last error."""
    status = delivery_status(ctx.dex)
    if as_json:
        emit_json(status.as_dict())
    else:
        click.echo(render_status(status))
