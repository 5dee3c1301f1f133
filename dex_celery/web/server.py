"""Serving the web app with uvicorn, and the one rule about where: never open without auth.

Without `web_users` or `web_tokens` the app would let anyone who reaches it approve writes, so
it listens only on a loopback address then; asked for any other address it refuses to start
with a `ConfigurationError` naming the settings to set.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING

# defers an optional dependency: uvicorn (the `web` extra)
import uvicorn

from dex_celery.errors import ConfigurationError
from dex_celery.web.app import create_app
from dex_celery.web.auth import Credentials

if TYPE_CHECKING:
    from dex_celery.app import Dex

log = logging.getLogger("dex_celery.web")


def is_loopback(host: str) -> bool:
    """`localhost`, 127.0.0.0/8 and ::1 are loopback; `0.0.0.0`, `::` and names are not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, credentials: Credentials) -> None:
    if not credentials.required and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to serve the web app on {host} without authentication: set "
            "DEX_WEB_USERS (name:password,...) or DEX_WEB_TOKENS (name:token,...), "
            "or listen on 127.0.0.1"
        )


def serve(dex: Dex, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Run the web app until interrupted."""
    credentials = Credentials.from_settings(dex.settings)
    check_bind(host, credentials)
    app = create_app(dex, credentials)
    if not credentials.required:
        log.warning("no DEX_WEB_USERS / DEX_WEB_TOKENS: serving %s without sign-in", host)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, proxy_headers=False)
    uvicorn.Server(config).run()
