"""Who is asking: signed session cookies, HTTP Basic, bearer tokens; and cross-site defences.

- People sign in on `/login` with a name and password from `Settings.web_users`; the app sets a
  session cookie (`HttpOnly`, `SameSite=Strict`) holding the name, an expiry and a random nonce,
  signed with HMAC-SHA256 under `Settings.web_secret_key` (random per process when unset).
- Signing out revokes the cookie's nonce (in the process and in Redis), so the cookie is refused
  afterwards even if it was copied; a restart with a random `web_secret_key` ends every sign-in.
- Scripts and Prometheus send `Authorization: Basic ...` (a `web_users` pair) or
  `Authorization: Bearer <token>` (a `web_tokens` entry; its name is the user, its scopes what
  it may do). Credentials, scopes and the `Host` check live in `dex_celery.access`, shared with
  the MCP HTTP server.
- Every POST must carry the form field `csrf`, an HMAC of the user and the session's nonce that
  only pages of this app show, and must not come with an `Origin` (or `Referer`) of another
  site. A forged cross-site form therefore fails three ways: no cookie (SameSite), no token, a
  foreign Origin.

With no credentials configured the app serves only loopback (`web.server`), and everyone who can
reach it is the operating-system user running it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, Protocol

from dex_celery.access import (
    Credentials,
    Identity,
    header_identity,
    local_identity,
)

__all__ = [
    "COOKIE",
    "SESSION_SECONDS",
    "Credentials",
    "Identity",
    "RedisRevocations",
    "SharedRevocations",
    "Signer",
    "header_identity",
    "local_identity",
    "safe_next",
    "same_origin",
]

log = logging.getLogger("dex_celery.web")

COOKIE = "dex_session"
#: How long a sign-in lasts.
SESSION_SECONDS = 12 * 3600


class SharedRevocations(Protocol):
    """Where signed-out nonces are kept beyond this process: every web app of a deployment reads
    them, so a cookie signed out at one replica is refused by the others, and after a restart
    with a fixed `web_secret_key`. Either method may raise; the process's own list still holds.
    """

    def add(self, nonce: str, ttl: float) -> None: ...

    def contains(self, nonce: str) -> bool: ...


class RedisRevocations:
    """`SharedRevocations` in the deployment's Redis: `<prefix>:web:signed-out:<nonce>`, kept
    until the cookie would have expired anyway."""

    def __init__(self, client: Callable[[], Any], prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def _key(self, nonce: str) -> str:
        return f"{self.prefix}:web:signed-out:{nonce}"

    def add(self, nonce: str, ttl: float) -> None:
        self.client().set(self._key(nonce), "1", ex=max(1, int(ttl) + 1))

    def contains(self, nonce: str) -> bool:
        return bool(self.client().exists(self._key(nonce)))


class Signer:
    """Signs and checks session cookies and CSRF tokens, and remembers signed-out cookies.

    A cookie carries a random nonce; signing out (`revoke`) records the nonce until the cookie
    would have expired, and `read_cookie` refuses a revoked nonce, so a copied or replayed
    cookie is dead after sign-out. Revocations live in this process, and in `shared` (Redis)
    when the web app gives one.
    """

    def __init__(self, secret_key: str | None, shared: SharedRevocations | None = None) -> None:
        self.key = (secret_key or secrets.token_hex(32)).encode()
        self.shared = shared
        self._revoked: dict[str, float] = {}  # nonce -> when the cookie expires
        self._lock = threading.Lock()

    def revoke(self, identity: Identity, *, now: float | None = None) -> None:
        """Sign-out: the cookie of `identity` (its nonce) is refused from now on."""
        if not identity.nonce:
            return
        now = now or time.time()
        expires = identity.expires or now + SESSION_SECONDS
        with self._lock:
            for nonce in [n for n, until in self._revoked.items() if until < now]:
                del self._revoked[nonce]
            self._revoked[identity.nonce] = expires
        if self.shared is not None:
            try:
                self.shared.add(identity.nonce, max(1.0, expires - now))
            except Exception as e:  # the process's list still refuses it here
                log.warning("could not share the sign-out of a session: %s", e)

    def revoked(self, nonce: str) -> bool:
        with self._lock:
            if nonce in self._revoked:
                return True
        if self.shared is None:
            return False
        try:
            return self.shared.contains(nonce)
        except Exception as e:
            log.warning("could not read shared sign-outs: %s", e)
            return False

    def _mac(self, text: str) -> str:
        return hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()

    def session_cookie(self, name: str, *, now: float | None = None) -> str:
        expires = int((now or time.time()) + SESSION_SECONDS)
        nonce = secrets.token_hex(8)
        user = base64.urlsafe_b64encode(name.encode()).decode()
        payload = f"{user}|{expires}|{nonce}"
        return f"{payload}|{self._mac(payload)}"

    def read_cookie(self, value: str | None, *, now: float | None = None) -> Identity | None:
        if not value:
            return None
        parts = value.split("|")
        if len(parts) != 4:
            return None
        user, expires, nonce, mac = parts
        if not hmac.compare_digest(self._mac(f"{user}|{expires}|{nonce}"), mac):
            return None
        try:
            if int(expires) < (now or time.time()):
                return None
            name = base64.urlsafe_b64decode(user.encode()).decode()
        except (ValueError, binascii.Error, UnicodeDecodeError):
            return None
        if self.revoked(nonce):
            return None
        return Identity(name, nonce, "session", expires=float(expires))

    def csrf_token(self, identity: Identity) -> str:
        return self._mac(f"csrf|{identity.name}|{identity.nonce}")

    def check_csrf(self, identity: Identity, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf_token(identity), str(token))


def same_origin(origin: str | None, host: str | None, scheme: str) -> bool:
    """True if an `Origin`/`Referer` value names this app (scheme and host:port)."""
    if not origin or not host:
        return False
    parts = urllib.parse.urlsplit(origin)
    return parts.scheme == scheme and parts.netloc.lower() == host.lower()


def safe_next(target: str | None) -> str:
    """Only local paths after sign-in (no open redirect to another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
