"""`dex_celery.access` in isolation: token scopes, the Host allowlist, trusted proxies, the
sign-in throttle (the doors themselves are tested with real servers in tests/integration)."""

from __future__ import annotations

import pytest

from dex_celery import Settings
from dex_celery.access import (
    PERSON_SCOPES,
    TOKEN_DEFAULT_SCOPES,
    Credentials,
    HostAllowlist,
    LoginThrottle,
    Scope,
    TrustedProxies,
    header_identity,
    split_host,
)
from dex_celery.errors import ConfigurationError


def test_token_scopes_default_to_reading() -> None:
    creds = Credentials.from_settings(
        Settings(web_tokens="prom:t1,ops:t2:approvals:decide+calls:read,agent:t3:tools:call")
    )
    prom, ops, agent = (header_identity(creds, f"Bearer t{i}") for i in (1, 2, 3))
    assert prom is not None and prom.scopes == TOKEN_DEFAULT_SCOPES
    assert not prom.may(Scope.APPROVALS_DECIDE) and not prom.may(Scope.TOOLS_CALL)
    assert ops is not None and ops.scopes == {Scope.APPROVALS_DECIDE, Scope.CALLS_READ}
    assert agent is not None and agent.scopes == {Scope.TOOLS_CALL}
    person = Credentials.from_settings(Settings(web_users="alice:pw")).person("alice")
    assert person.scopes == PERSON_SCOPES == frozenset(Scope)


@pytest.mark.parametrize(
    ("entry", "named"),
    [("prom:t:metrics+admin", "'admin'"), ("prom:t:", "''"), ("prom:t:Metrics", "'Metrics'")],
)
def test_a_bad_scope_is_a_configuration_error_naming_it(entry: str, named: str) -> None:
    with pytest.raises(ConfigurationError, match=f"web_tokens: unknown scope {named}"):
        Credentials.from_settings(Settings(web_tokens=entry))


@pytest.mark.parametrize(
    "bad", ["prom", "prom:", ":tok", "a|b:tok", "a:b:metrics:x", "prom:t1,prom:t2"]
)
def test_malformed_tokens_are_a_configuration_error(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="web_tokens"):
        Credentials.from_settings(Settings(web_tokens=bad))


def test_host_allowlist() -> None:
    default = HostAllowlist.from_settings(Settings())
    for host in ("localhost", "localhost:8000", "127.0.0.1:1", "[::1]:8000", "LOCALHOST."):
        assert default.allows(host), host
    for host in (None, "", "rebind.attacker.example", "rebind.attacker.example:8000",
                 "127.0.0.1.attacker.example", "localhost.attacker.example", "[::1", "a:b"):  # fmt: skip
        assert not default.allows(host), host
    custom = HostAllowlist.from_settings(
        Settings(allowed_hosts="dex.example.com, ops.example:8443")
    )
    assert custom.allows("dex.example.com:9000") and custom.allows("localhost:1")
    assert custom.allows("ops.example:8443") and not custom.allows("ops.example:8000")
    assert not custom.allows("evil.dex.example.com")
    assert split_host("[::1]:80") == ("::1", 80)
    bound = default.with_bind("10.1.2.3")
    assert bound.allows("10.1.2.3:8000") and not default.allows("10.1.2.3:8000")
    assert default.with_bind("0.0.0.0") == default == default.with_bind("dex.example.com")
    assert not default.with_bind("::").allows("[::]:80")
    for bad in ("*.example.com", "a/b", "x:y"):
        with pytest.raises(ConfigurationError, match="allowed_hosts"):
            HostAllowlist.from_settings(Settings(allowed_hosts=bad))


def test_forwarded_headers_only_from_trusted_proxies() -> None:
    proxies = TrustedProxies.from_settings(Settings(web_trusted_proxies="10.0.0.1,192.168.0.0/24"))
    assert proxies.scheme("10.0.0.1", "http", "https") == "https"
    assert proxies.scheme("192.168.0.7", "http", "https, http") == "https"
    assert proxies.scheme("10.0.0.2", "http", "https") == "http"
    assert proxies.client("10.0.0.1", "1.2.3.4, 5.6.7.8") == "5.6.7.8"
    assert proxies.client("10.0.0.9", "1.2.3.4") == "10.0.0.9"
    assert TrustedProxies.from_settings(Settings()).scheme("127.0.0.1", "http", "https") == "http"
    with pytest.raises(ConfigurationError, match="web_trusted_proxies"):
        TrustedProxies.from_settings(Settings(web_trusted_proxies="proxy.local"))


def test_throttle_per_name_and_per_address() -> None:
    now = [1000.0]
    throttle = LoginThrottle(limit=5, window=60, clock=lambda: now[0])
    for _ in range(5):
        assert throttle.retry_after("alice", "10.0.0.1") == 0
        throttle.failed("alice", "10.0.0.1")
    # The address, for any name; a name is not locked for the others who use it (one
    # caller's wrong guesses must not lock a person out from where they sign in).
    assert throttle.retry_after("bob", "10.0.0.1") == 60
    assert throttle.retry_after("alice", "10.0.0.2") == 0
    assert throttle.retry_after("bob", "10.0.0.2") == 0
    now[0] += 60.5
    assert throttle.retry_after("alice", "10.0.0.1") == 0


def test_a_name_guessed_from_many_addresses_is_throttled_too() -> None:
    """Guessing one name from many addresses (5 each) still stops: past `name_limit` failures
    of a name in the window, the name is refused from every address."""
    now = [1000.0]
    throttle = LoginThrottle(limit=5, window=60, name_limit=20, clock=lambda: now[0])
    for n in range(20):
        assert throttle.retry_after("alice", f"10.0.1.{n // 5}") == 0
        throttle.failed("alice", f"10.0.1.{n // 5}")
    assert throttle.retry_after("alice", "10.0.2.1") == 60
    assert throttle.retry_after("bob", "10.0.2.1") == 0


def test_a_token_may_not_be_named_like_a_person() -> None:
    with pytest.raises(ConfigurationError, match="'alice' is used twice"):
        Credentials.from_settings(Settings(web_users="alice:pw", web_tokens="alice:tok"))
