"""Serving the web app with uvicorn, and the one rule about where: never open without auth.

Without `web_users` or `web_tokens` the app would let anyone who reaches it approve writes, so
it listens only on a loopback address then; asked for any other address it refuses to start
with a `ConfigurationError` naming the settings to set (`dex_celery.access.check_bind`, the same
rule as `dex-celery mcp --transport http`). Whatever the address, a request naming a `Host` that
is not loopback or in `DEX_ALLOWED_HOSTS` is refused (`access.HostGuard`, DNS rebinding).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

# defers an optional dependency: uvicorn (the `web` extra)
import uvicorn

from dex_celery.access import Credentials, HostAllowlist, check_bind, is_loopback
from dex_celery.web.app import create_app

__all__ = ["check_bind", "is_loopback", "serve"]

if TYPE_CHECKING:
    from dex_celery.app import Dex

log = logging.getLogger("dex_celery.web")


def serve(
    dex: Dex,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
) -> None:
    """Run the web app until interrupted; over https when given a certificate and its key."""
    credentials = Credentials.from_settings(dex.settings)
    check_bind(host, credentials)
    hosts = HostAllowlist.from_settings(dex.settings).with_bind(host)
    app = create_app(dex, credentials, bind=host)
    if not credentials.required:
        log.warning("no DEX_WEB_USERS / DEX_WEB_TOKENS: serving %s without sign-in", host)
    log.info("answering requests for the hosts %s", ", ".join(hosts.names))
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        proxy_headers=False,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )
    uvicorn.Server(config).run()
