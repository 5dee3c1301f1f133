"""Who is asking: signed session cookies, HTTP Basic, bearer tokens; and cross-site defences.

- People sign in on `/login` with a name and password from `Settings.web_users`; the app sets a
  session cookie (`HttpOnly`, `SameSite=Strict`) holding the name, an expiry and a random nonce,
  signed with HMAC-SHA256 under `Settings.web_secret_key` (random per process when unset).
- Scripts and Prometheus send `Authorization: Basic ...` (a `web_users` pair) or
  `Authorization: Bearer <token>` (a `web_tokens` pair; the pair's name is the user).
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
import getpass
import hashlib
import hmac
import secrets
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dex_celery.errors import ConfigurationError
from dex_celery.settings import Settings

COOKIE = "dex_session"
#: How long a sign-in lasts.
SESSION_SECONDS = 12 * 3600


def _pairs(text: str | None, setting: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (p.strip() for p in (text or "").split(",")):
        if not item:
            continue
        name, sep, value = item.partition(":")
        if not sep or not name.strip() or not value:
            raise ConfigurationError(
                f"setting {setting}: each entry must be name:value, got one without "
                "a name or a value"
            )
        if "|" in name:
            raise ConfigurationError(f"setting {setting}: names may not contain '|'")
        out[name.strip()] = value
    return out


@dataclass(frozen=True, slots=True)
class Credentials:
    """Who may use the web app, from the settings."""

    users: Mapping[str, str]
    tokens: Mapping[str, str]  # token -> name

    @classmethod
    def from_settings(cls, settings: Settings) -> Credentials:
        users = _pairs(settings.web_users, "web_users")
        tokens = {token: name for name, token in _pairs(settings.web_tokens, "web_tokens").items()}
        return cls(MappingProxyType(users), MappingProxyType(tokens))

    @property
    def required(self) -> bool:
        return bool(self.users or self.tokens)

    def check_password(self, name: str, password: str) -> bool:
        expected = self.users.get(name)
        # Compare even for an unknown name, so timing does not tell which names exist.
        ok = hmac.compare_digest((expected or "\0").encode(), password.encode())
        return expected is not None and ok

    def user_for_token(self, token: str) -> str | None:
        for known, name in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return name
        return None


@dataclass(frozen=True, slots=True)
class Identity:
    """A signed-in user. `nonce` ties the CSRF token to one sign-in (empty for header auth)."""

    name: str
    nonce: str = ""
    via: str = "session"


class Signer:
    """Signs and checks session cookies and CSRF tokens."""

    def __init__(self, secret_key: str | None) -> None:
        self.key = (secret_key or secrets.token_hex(32)).encode()

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
        return Identity(name, nonce, "session")

    def csrf_token(self, identity: Identity) -> str:
        return self._mac(f"csrf|{identity.name}|{identity.nonce}")

    def check_csrf(self, identity: Identity, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf_token(identity), str(token))


def header_identity(credentials: Credentials, authorization: str | None) -> Identity | None:
    """`Authorization: Basic ...` or `Bearer ...`, checked against the settings."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer":
        name = credentials.user_for_token(value.strip())
        return Identity(name, "", "token") if name else None
    if scheme == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode()
        except (ValueError, binascii.Error, UnicodeDecodeError):
            return None
        name, sep, password = decoded.partition(":")
        if sep and credentials.check_password(name, password):
            return Identity(name, "", "basic")
    return None


def local_identity() -> Identity:
    """The user when no credentials are configured (loopback only): the server's OS user."""
    try:
        user = getpass.getuser()
    except Exception:  # no name for this uid (a container): still say it was local
        user = "unknown"
    return Identity(f"{user}@localhost", "", "loopback")


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
