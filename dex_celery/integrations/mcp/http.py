"""The door of `dex-celery mcp --transport http`: who may call tools over streamable HTTP.

The same rules as the web app (`dex_celery.access`, docs/security.md):

- it refuses to listen beyond loopback unless `web_users` or `web_tokens` are set
  (`access.check_bind`);
- every request must name an allowed `Host` (loopback names, `DEX_ALLOWED_HOSTS`), else 421,
  and an `Origin`, if sent, must be that same host (a browser page of another site is refused);
- with credentials configured, every request authenticates: `Authorization: Bearer <token>` of
  a `web_tokens` entry with the scope `tools:call`, or HTTP Basic of a `web_users` person; wrong
  ones are throttled per name and address like sign-ins;
- the identity travels in the ASGI scope (`IDENTITY_SCOPE_KEY`) to `DexMcpServer`, which lets a
  caller request or follow only calls of sessions its identity owns (`store/owners.py`).

The SDK's own DNS-rebinding check is left off (it only covers loopback binds): this one applies
to every bind.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from mcp.server.transport_security import TransportSecuritySettings

from dex_celery.access import (
    Credentials,
    HostAllowlist,
    HostGuard,
    Identity,
    LoginThrottle,
    Scope,
    local_identity,
    read_authorization,
)

#: Where the caller's `Identity` is put in the ASGI scope of each request.
IDENTITY_SCOPE_KEY = "dex.identity"

_Asgi = Any


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _refuse(
    send: _Asgi, status: int, text: str, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    # A JSON-RPC error body, so an MCP client shows the reason; the status says the rest.
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": text}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class McpGate:
    """ASGI middleware after the `Host` check: Origin, authentication, the `tools:call` scope."""

    def __init__(
        self,
        app: _Asgi,
        credentials: Credentials,
        allowlist: HostAllowlist,
        throttle: LoginThrottle | None = None,
    ) -> None:
        self.app = app
        self.credentials = credentials
        self.allowlist = allowlist
        self.throttle = throttle or LoginThrottle()

    def authenticate(self, scope: dict[str, Any]) -> Identity | tuple[int, str, float]:
        if not self.credentials.required:
            return local_identity()
        client = scope.get("client")
        address = str(client[0]) if client else None
        auth = read_authorization(self.credentials, _header(scope, b"authorization"))
        wait = self.throttle.retry_after(auth.name, address) if auth.attempted else 0.0
        if wait > 0:
            return (429, "too many failed authentications; try again later", wait)
        if auth.identity is None:
            if auth.attempted:
                self.throttle.failed(auth.name, address)
            return (401, "authentication required: Authorization: Bearer <token>", 0.0)
        if not auth.identity.may(Scope.TOOLS_CALL):
            return (
                403,
                f"{auth.identity.name} may not call tools (needs the scope tools:call)",
                0.0,
            )
        return auth.identity

    async def __call__(self, scope: dict[str, Any], receive: _Asgi, send: _Asgi) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = _header(scope, b"origin")
        if origin is not None and not self.origin_ok(origin, _header(scope, b"host")):
            await _refuse(send, 403, "cross-site request refused (Origin is not this server)")
            return
        found = self.authenticate(scope)
        if isinstance(found, tuple):
            status, text, wait = found
            headers: tuple[tuple[bytes, bytes], ...] = ()
            if status == 401:
                headers = ((b"www-authenticate", b'Bearer realm="dex-celery"'),)
            if status == 429:
                headers = ((b"retry-after", str(max(1, int(wait + 0.999))).encode()),)
            await _refuse(send, status, text, headers)
            return
        await self.app({**scope, IDENTITY_SCOPE_KEY: found}, receive, send)

    def origin_ok(self, origin: str, host: str | None) -> bool:
        parts = urllib.parse.urlsplit(origin)
        return (
            parts.scheme in ("http", "https")
            and bool(host)
            and parts.netloc.lower() == (host or "").lower()
            and self.allowlist.allows(parts.netloc)
        )


def guarded(app: _Asgi, credentials: Credentials, allowlist: HostAllowlist) -> _Asgi:
    """`app` behind the Host check and the gate."""
    return HostGuard(McpGate(app, credentials, allowlist), allowlist)


#: Given to the SDK's app: its Host/Origin check off (`McpGate` and `HostGuard` do it, for
#: every bind address); it still insists on a JSON `Content-Type` for POSTs.
SDK_TRANSPORT_SECURITY = TransportSecuritySettings(enable_dns_rebinding_protection=False)
