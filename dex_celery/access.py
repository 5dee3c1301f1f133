"""Who may come in through a network door, and what they may do there (docs/security.md).

One module for every door that listens on a socket (the web app, its `/metrics`, the MCP HTTP
server), so the rules cannot drift apart:

- **Host.** A request is answered only if its `Host` header names this service: a loopback name
  (`localhost`, `127.0.0.1`, `::1`) or one of `Settings.allowed_hosts`. A page of another site
  whose name an attacker re-points at 127.0.0.1 (DNS rebinding) makes the browser send that
  site's name, so it is refused before any page or token is shown.
- **Credentials.** People (`Settings.web_users`, `name:password`) and tokens
  (`Settings.web_tokens`, `name:token` or `name:token:scope+scope`). Without any, a door serves
  loopback only (`check_bind`) and everyone who reaches it acts as the OS user running it.
- **Scopes.** What an identity may do: read metrics, read calls, decide approvals (and other
  operator actions), call tools. People get all four; a token gets the read-only pair unless
  its entry names others, so a scrape token cannot approve a write.
- **Throttling.** Wrong passwords and tokens are counted per name and per address; past
  `LoginThrottle.limit` failures in `window` seconds the door answers 429 until the window
  has passed, for the right password too.

Nothing here imports a web framework: the web app and the MCP server adapt it to theirs.
"""

from __future__ import annotations

import base64
import binascii
import enum
import getpass
import hmac
import ipaddress
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dex_celery.errors import ConfigurationError
from dex_celery.settings import Settings


class Scope(enum.StrEnum):
    """One thing an identity may do at a door."""

    #: Scrape `/metrics`.
    METRICS = "metrics"
    #: Read calls, approvals waiting and unknown outcomes (web pages).
    CALLS_READ = "calls:read"
    #: Approve or reject a call, reconcile a session's unknown outcomes (web POSTs; MCP
    #: `tasks/update`, docs/mcp.md).
    APPROVALS_DECIDE = "approvals:decide"
    #: List and call tools through `dex-celery mcp`.
    TOOLS_CALL = "tools:call"
    #: Freeze and thaw every write of the deployment (S13.2; web POSTs).
    WRITES_FREEZE = "writes:freeze"


#: A token entry without scopes: it may read, never act.
TOKEN_DEFAULT_SCOPES = frozenset({Scope.METRICS, Scope.CALLS_READ})
#: People who sign in with a password, and the OS user on an unauthenticated loopback door.
PERSON_SCOPES = frozenset(Scope)

#: Host names every door answers to: nobody can make a browser send these for another site.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is asking, and what they may do.

    `nonce` ties a CSRF token to one sign-in (empty for header auth); `via` says how the
    identity was proven: `session` (cookie), `basic`, `token` or `loopback` (no credentials
    configured).
    """

    name: str
    nonce: str = ""
    via: str = "session"
    scopes: frozenset[Scope] = PERSON_SCOPES
    #: When a session cookie's sign-in ends (Unix seconds); 0 for other identities.
    expires: float = 0.0

    def may(self, scope: Scope) -> bool:
        return scope in self.scopes


@dataclass(frozen=True, slots=True)
class Token:
    """One `web_tokens` entry."""

    name: str
    secret: str = field(repr=False)
    scopes: frozenset[Scope]


def parse_scopes(text: str, setting: str = "web_tokens") -> frozenset[Scope]:
    """`metrics+calls:read` -> the scopes; an unknown name is a `ConfigurationError` naming it."""
    names = [n.strip() for n in text.split("+")]
    found: set[Scope] = set()
    for name in names:
        try:
            found.add(Scope(name))
        except ValueError:
            known = ", ".join(s.value for s in Scope)
            raise ConfigurationError(
                f"setting {setting}: unknown scope {name!r} (known: {known})"
            ) from None
    return frozenset(found)


def _entries(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def _check_name(name: str, setting: str) -> str:
    name = name.strip()
    if not name:
        raise ConfigurationError(
            f"setting {setting}: each entry must start with a name, got one without"
        )
    if "|" in name:
        raise ConfigurationError(f"setting {setting}: names may not contain '|'")
    return name


def parse_users(text: str | None, setting: str = "web_users") -> dict[str, str]:
    """`name:password,...` -> {name: password} (a password may contain ':')."""
    users: dict[str, str] = {}
    for item in _entries(text):
        name, sep, password = item.partition(":")
        if not sep or not password:
            raise ConfigurationError(
                f"setting {setting}: each entry must be name:password, got one without "
                "a name or a password"
            )
        users[_check_name(name, setting)] = password
    return users


def parse_tokens(text: str | None, setting: str = "web_tokens") -> tuple[Token, ...]:
    """`name:token` or `name:token:scope+scope`, comma-separated; a token may not hold ':' or
    ',' (what follows its second ':' is read as scopes)."""
    tokens: list[Token] = []
    for item in _entries(text):
        parts = item.split(":", 2)  # scope names hold ':' themselves (`calls:read`)
        if len(parts) == 2:
            name, secret = parts
            scopes = TOKEN_DEFAULT_SCOPES
        elif len(parts) == 3:
            name, secret, scope_text = parts
            scopes = parse_scopes(scope_text, setting)
        else:
            raise ConfigurationError(
                f"setting {setting}: each entry must be name:token or name:token:scope+scope"
            )
        if not secret:
            raise ConfigurationError(f"setting {setting}: an entry has an empty token")
        tokens.append(Token(_check_name(name, setting), secret, scopes))
    return tuple(tokens)


@dataclass(frozen=True, slots=True)
class Credentials:
    """Who may use a network door, from the settings (`web_users`, `web_tokens`)."""

    users: Mapping[str, str]
    token_list: tuple[Token, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> Credentials:
        """Both settings read; a name given twice (two tokens, or a token named like a person)
        is a `ConfigurationError`: the name is what a decision and a session's owner record, so
        it must say who it was."""
        users = parse_users(settings.web_users)
        tokens = parse_tokens(settings.web_tokens)
        seen = set(users)
        for token in tokens:
            if token.name in seen:
                raise ConfigurationError(
                    f"setting web_tokens: the name {token.name!r} is used twice (by another "
                    "token or a person in web_users); give every token its own name"
                )
            seen.add(token.name)
        return cls(MappingProxyType(users), tokens)

    @property
    def tokens(self) -> Mapping[str, str]:
        """token -> name (kept for callers of the earlier, scope-less form)."""
        return MappingProxyType({t.secret: t.name for t in self.token_list})

    @property
    def required(self) -> bool:
        return bool(self.users or self.token_list)

    def check_password(self, name: str, password: str) -> bool:
        expected = self.users.get(name)
        # Compare even for an unknown name, so timing does not tell which names exist.
        ok = hmac.compare_digest((expected or "\0").encode(), password.encode())
        return expected is not None and ok

    def token(self, secret: str) -> Token | None:
        found = None
        for token in self.token_list:  # every entry compared: timing does not tell which
            if hmac.compare_digest(token.secret.encode(), secret.encode()):
                found = token
        return found

    def person(self, name: str, nonce: str = "", via: str = "session") -> Identity:
        return Identity(name, nonce, via, PERSON_SCOPES)


@dataclass(frozen=True, slots=True)
class HeaderAuth:
    """What an `Authorization` header said: an identity, or which name failed (for throttling).

    `name` is the user a wrong Basic password was given for; `None` when no header was sent.
    """

    identity: Identity | None
    attempted: bool = False
    name: str | None = None


def read_authorization(credentials: Credentials, authorization: str | None) -> HeaderAuth:
    """`Authorization: Basic ...` (a person) or `Bearer ...` (a token), checked."""
    if not authorization:
        return HeaderAuth(None)
    scheme, _, value = authorization.partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer":
        token = credentials.token(value.strip())
        if token is None:
            return HeaderAuth(None, True)
        return HeaderAuth(Identity(token.name, "", "token", token.scopes), True)
    if scheme == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode()
        except (ValueError, binascii.Error, UnicodeDecodeError):
            return HeaderAuth(None, True)
        name, sep, password = decoded.partition(":")
        if sep and credentials.check_password(name, password):
            return HeaderAuth(credentials.person(name, via="basic"), True, name)
        return HeaderAuth(None, True, name or None)
    return HeaderAuth(None, True)


def header_identity(credentials: Credentials, authorization: str | None) -> Identity | None:
    """The identity an `Authorization` header proves, if any."""
    return read_authorization(credentials, authorization).identity


def local_identity() -> Identity:
    """Who asks when no credentials are configured (loopback only): the server's OS user."""
    try:
        user = getpass.getuser()
    except Exception:  # no name for this uid (a container): still say it was local
        user = "unknown"
    return Identity(f"{user}@localhost", "", "loopback", PERSON_SCOPES)


# --- where a door listens --------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """`localhost`, 127.0.0.0/8 and ::1 are loopback; `0.0.0.0`, `::` and names are not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, credentials: Credentials, what: str = "the web app") -> None:
    """Refuse to listen beyond loopback while nobody has to authenticate."""
    if not credentials.required and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to serve {what} on {host} without authentication: set "
            "DEX_WEB_USERS (name:password,...) or DEX_WEB_TOKENS (name:token,...), "
            "or listen on 127.0.0.1"
        )


# --- which Host a request may name -----------------------------------------------------------


def split_host(value: str) -> tuple[str, int | None]:
    """`Host` header (or allowlist entry) -> (lower-case name, port or None).

    `[::1]:8000` -> ("::1", 8000); a bare IPv6 address `::1` is a name without a port.
    Raises `ValueError` for a port that is not a number.
    """
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"not a host: {value!r}")
    elif value.count(":") == 1:
        name, _, port = value.partition(":")
    else:
        name, port = value, ""
    name = name.rstrip(".")
    return name, (int(port) if port else None)


@dataclass(frozen=True, slots=True)
class HostAllowlist:
    """The `Host` names a door answers to: loopback names plus `Settings.allowed_hosts`.

    An entry without a port allows every port of that name; `name:port` only that port.
    """

    entries: tuple[tuple[str, int | None], ...]

    @classmethod
    def from_settings(cls, settings: Settings) -> HostAllowlist:
        return cls.of(_entries(settings.allowed_hosts))

    @classmethod
    def of(cls, extra: Iterable[str] = ()) -> HostAllowlist:
        entries: list[tuple[str, int | None]] = [(n, None) for n in LOOPBACK_NAMES]
        for item in extra:
            try:
                name, port = split_host(item)
            except ValueError:
                raise ConfigurationError(
                    f"setting allowed_hosts: {item!r} is not a host name or name:port"
                ) from None
            if not name or "/" in name or "*" in name:
                raise ConfigurationError(
                    f"setting allowed_hosts: {item!r} is not a host name or name:port "
                    "(no wildcards)"
                )
            entries.append((name, port))
        return cls(tuple(entries))

    def with_bind(self, bind: str) -> HostAllowlist:
        """Also the address the door listens on, if it is one IP address (not `0.0.0.0`/`::`).

        An IP literal in `Host` is no rebinding risk: a rebinding page always sends its own
        name, and a page served from this address is this server's own.
        """
        try:
            address = ipaddress.ip_address(bind.strip("[]"))
        except ValueError:
            return self
        if address.is_unspecified:
            return self
        return HostAllowlist((*self.entries, (str(address), None)))

    def allows(self, host: str | None) -> bool:
        if not host:
            return False
        try:
            name, port = split_host(host)
        except ValueError:
            return False
        return any(name == n and (p is None or p == port) for n, p in self.entries)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n if p is None else f"{n}:{p}" for n, p in self.entries)


#: What a refused `Host` is answered with (HTTP 421 Misdirected Request).
HOST_REFUSED_STATUS = 421


def host_refusal(host: str | None) -> str:
    return (
        f"refused: this server does not answer to the host {host or '(none)'!r}; "
        "add it to DEX_ALLOWED_HOSTS if it is really this server's name\n"
    )


# --- trusted proxies -------------------------------------------------------------------------


def parse_networks(
    text: str | None, setting: str = "web_trusted_proxies"
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    networks = []
    for item in _entries(text):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ConfigurationError(
                f"setting {setting}: {item!r} is not an address or network"
            ) from None
    return tuple(networks)


@dataclass(frozen=True, slots=True)
class TrustedProxies:
    """Reverse proxies whose `X-Forwarded-Proto` / `X-Forwarded-For` are believed."""

    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> TrustedProxies:
        return cls(parse_networks(settings.web_trusted_proxies))

    def trusts(self, peer: str | None) -> bool:
        if not peer or not self.networks:
            return False
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in n for n in self.networks)

    def scheme(self, peer: str | None, scheme: str, forwarded_proto: str | None) -> str:
        """The scheme the client used: the proxy's word for it if the peer is trusted."""
        if forwarded_proto and self.trusts(peer):
            return forwarded_proto.split(",")[0].strip().lower() or scheme
        return scheme

    def client(self, peer: str | None, forwarded_for: str | None) -> str:
        """The client's address: the last hop the trusted proxy added, else the peer."""
        if forwarded_for and self.trusts(peer):
            hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
            if hops:
                return hops[-1]
        return peer or "unknown"


# --- throttling ------------------------------------------------------------------------------


class LoginThrottle:
    """Failed sign-ins counted per address, per name from that address, and per name, in a
    sliding window.

    Kept in the process: a password guesser is slowed at the door it talks to. `check` before
    verifying a password, `failed` after a wrong one; a key that reached its limit within
    `window` seconds is refused (`retry_after` > 0) until its oldest failure leaves the window.

    A name alone is locked only past `name_limit` failures (many addresses guessing it): at
    `limit` it would let anyone who types a person's name five times lock that person out from
    everywhere, an identifier one caller chooses blocking another.
    """

    def __init__(
        self,
        limit: int = 5,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        name_limit: int = 50,
    ) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self.name_limit = name_limit
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def keys(self, name: str | None, address: str | None) -> tuple[tuple[str, int], ...]:
        """The counters one failure adds to, each with its limit."""
        out = []
        if name:
            out.append((f"user:{name}", self.name_limit))
            if address:
                out.append((f"user-at:{name}|{address}", self.limit))
        if address:
            out.append((f"addr:{address}", self.limit))
        return tuple(out)

    def _recent(self, key: str, now: float) -> deque[float]:
        times = self._failures.setdefault(key, deque())
        while times and times[0] <= now - self.window:
            times.popleft()
        return times

    def retry_after(self, name: str | None, address: str | None) -> float:
        """Seconds until these may try again (0: now)."""
        now = self.clock()
        wait = 0.0
        with self._lock:
            for key, limit in self.keys(name, address):
                times = self._recent(key, now)
                if len(times) >= limit:
                    wait = max(wait, times[0] + self.window - now)
                if not times:
                    self._failures.pop(key, None)
        return wait

    def failed(self, name: str | None, address: str | None) -> None:
        now = self.clock()
        with self._lock:
            for key, _limit in self.keys(name, address):
                self._recent(key, now).append(now)
            if len(self._failures) > 100_000:  # a flood of names: forget the idle ones
                for key in [
                    k for k, v in self._failures.items() if not v or v[-1] <= now - self.window
                ]:
                    del self._failures[key]


# --- the Host check as ASGI middleware ------------------------------------------------------

#: Headers every answer of the web app carries: no framing (clickjacking), no inline script or
#: style, no sniffing a plain-text answer into HTML, no paths leaked to other sites.
SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    ("x-frame-options", "DENY"),
    (
        "content-security-policy",
        "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; "
        "object-src 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "same-origin"),
)

_Asgi = Callable[..., Any]


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class HostGuard:
    """ASGI middleware: refuse (421) a request whose `Host` is not in the allowlist, before the
    app sees it; optionally add `headers` to every answer.

    Runs before routing, authentication and any page, so a DNS-rebinding page never reads a
    byte of the app (not even the sign-in form or a CSRF token).
    """

    def __init__(
        self,
        app: _Asgi,
        allowlist: HostAllowlist,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.app = app
        self.allowlist = allowlist
        self.headers = [(k.encode(), v.encode()) for k, v in headers]

    async def __call__(self, scope: dict[str, Any], receive: _Asgi, send: _Asgi) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host")
        if not self.allowlist.allows(host):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            body = host_refusal(host).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": HOST_REFUSED_STATUS,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(body)).encode()),
                        *self.headers,
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        if not self.headers:
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers") or ()}
                extra = [(k, v) for k, v in self.headers if k not in present]
                message = {**message, "headers": [*(message.get("headers") or ()), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


# --- the same door for a WSGI app (a worker's metrics port) ---------------------------------


def guarded_wsgi(
    app: Callable[..., Any],
    credentials: Credentials,
    allowlist: HostAllowlist,
    scope: Scope,
    throttle: LoginThrottle | None = None,
    open_paths: Mapping[str, Callable[..., Any]] | None = None,
) -> Callable[..., Any]:
    """`app` behind the `Host` check, authentication (when credentials are configured) and
    `scope`: the worker's own `/metrics` port answers like the web app's `/metrics`.

    `open_paths`: paths answered after the `Host` check without credentials, by their own app
    (the worker's `/readyz` and `/livez`, which a kubelet asks): they must show no data."""
    throttle = throttle or LoginThrottle()
    public = dict(open_paths or {})

    def refuse(start_response: Callable[..., Any], status: str, text: str,
               extra: tuple[tuple[str, str], ...] = ()) -> list[bytes]:  # fmt: skip
        body = text.encode()
        start_response(
            status,
            [("Content-Type", "text/plain; charset=utf-8"),
             ("Content-Length", str(len(body))), *SECURITY_HEADERS, *extra],
        )  # fmt: skip
        return [body]

    def door(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        host = environ.get("HTTP_HOST")
        if not allowlist.allows(host):
            return refuse(start_response, "421 Misdirected Request", host_refusal(host))
        if environ.get("PATH_INFO") in public:
            return public[environ["PATH_INFO"]](environ, start_response)
        if credentials.required:
            address = environ.get("REMOTE_ADDR")
            auth = read_authorization(credentials, environ.get("HTTP_AUTHORIZATION"))
            wait = throttle.retry_after(auth.name, address) if auth.attempted else 0.0
            if wait > 0:
                return refuse(start_response, "429 Too Many Requests",
                              "refused: too many failed authentications\n",
                              (("Retry-After", str(max(1, int(wait + 0.999)))),))  # fmt: skip
            if auth.identity is None:
                if auth.attempted:
                    throttle.failed(auth.name, address)
                return refuse(start_response, "401 Unauthorized",
                              "refused: authentication required\n",
                              (("WWW-Authenticate", 'Basic realm="dex-celery"'),))  # fmt: skip
            if not auth.identity.may(scope):
                return refuse(start_response, "403 Forbidden",
                              f"refused: {auth.identity.name} lacks the scope {scope.value}\n")  # fmt: skip
        return app(environ, start_response)

    return door
