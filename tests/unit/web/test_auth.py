"""The web app's gatekeeping in isolation: where it may listen, credentials, cookies, CSRF."""

from __future__ import annotations

import base64

import pytest
from click.testing import CliRunner

from dex_celery import Settings
from dex_celery.access import TOKEN_DEFAULT_SCOPES
from dex_celery.cli.main import EXIT_REFUSED, main
from dex_celery.errors import ConfigurationError
from dex_celery.web.auth import (
    Credentials,
    Identity,
    Signer,
    header_identity,
    safe_next,
    same_origin,
)
from dex_celery.web.server import check_bind, is_loopback

OPEN = Credentials.from_settings(Settings())
USERS = Credentials.from_settings(Settings(web_users="alice:pw1,bob:pw2", web_tokens="prom:tok"))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "example.com"])
def test_refuses_a_non_loopback_address_without_authentication(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(ConfigurationError, match="without authentication"):
        check_bind(host, OPEN)
    check_bind(host, USERS)  # with credentials it may


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_may_be_served_without_authentication(host: str) -> None:
    assert is_loopback(host)
    check_bind(host, OPEN)


def test_the_command_refuses_with_one_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DEX_WEB_USERS", "DEX_WEB_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(
        main, ["--app", "devtools.toolapp:dex", "web", "--host", "0.0.0.0", "--port", "8"]
    )
    assert result.exit_code == EXIT_REFUSED
    assert result.stderr.startswith("error: refusing to serve the web app on 0.0.0.0")
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.parametrize("bad", ["alice", "alice:", ":pw", "a|b:pw"])
def test_malformed_credentials_are_a_configuration_error(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="web_users"):
        Credentials.from_settings(Settings(web_users=bad))


def test_passwords_and_tokens() -> None:
    assert USERS.check_password("alice", "pw1")
    assert not USERS.check_password("alice", "pw2")
    assert not USERS.check_password("carol", "pw1")

    def basic(text: str) -> str:
        return "Basic " + base64.b64encode(text.encode()).decode()

    assert header_identity(USERS, basic("bob:pw2")) == Identity("bob", "", "basic")
    assert header_identity(USERS, basic("bob:nope")) is None
    assert header_identity(USERS, "Bearer tok") == Identity(
        "prom", "", "token", TOKEN_DEFAULT_SCOPES
    )
    assert header_identity(USERS, "Bearer tok2") is None
    assert header_identity(USERS, "Basic !!!") is None
    assert header_identity(USERS, None) is None


def test_session_cookies_cannot_be_forged_or_outlive_their_expiry() -> None:
    signer = Signer("k")
    cookie = signer.session_cookie("alice", now=1000.0)
    me = signer.read_cookie(cookie, now=1001.0)
    assert me is not None and me.name == "alice"
    assert signer.read_cookie(cookie, now=1000.0 + 13 * 3600) is None  # expired
    assert Signer("other-key").read_cookie(cookie, now=1001.0) is None
    _user, expires, nonce, mac = cookie.split("|")
    forged_user = base64.urlsafe_b64encode(b"bob").decode()
    assert signer.read_cookie(f"{forged_user}|{expires}|{nonce}|{mac}", now=1001.0) is None
    assert signer.read_cookie("garbage", now=1001.0) is None
    # The CSRF token belongs to one sign-in: another session of the same user has another.
    other = signer.read_cookie(signer.session_cookie("alice", now=1000.0), now=1001.0)
    assert other is not None
    assert signer.check_csrf(me, signer.csrf_token(me))
    assert not signer.check_csrf(other, signer.csrf_token(me))
    assert not signer.check_csrf(me, None)


def test_origins_and_redirect_targets() -> None:
    assert same_origin("http://127.0.0.1:8000", "127.0.0.1:8000", "http")
    assert same_origin("http://127.0.0.1:8000/approvals", "127.0.0.1:8000", "http")
    assert not same_origin("http://localhost:8000", "127.0.0.1:8000", "http")
    assert not same_origin("https://127.0.0.1:8000", "127.0.0.1:8000", "http")
    assert not same_origin("null", "127.0.0.1:8000", "http")
    assert safe_next("/calls?session=s") == "/calls?session=s"
    for bad in ("https://evil.example/", "//evil.example", "/\\evil", None, ""):
        assert safe_next(bad) == "/"
