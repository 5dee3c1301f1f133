"""Issue 19, findings 1 and 3, against a real `dex-celery web` process (uvicorn) over real HTTP:
DNS rebinding (a forged `Host` with a matching `Origin`), token scopes (a scrape token cannot
decide), server-side sign-out (a copied cookie is dead, at another replica too), `Secure`
cookies behind a trusted proxy, sign-in throttling, and the security headers (docs/security.md).
"""

from __future__ import annotations

import base64
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from dex_celery import CallStatus, Dex
from tests.support.web.web_process import WebServer

ATTACKER = "rebind.attacker.example"


@pytest.fixture
def start_web(env: dict[str, str], dex: Dex, tmp_path: Path) -> Iterator[Callable[..., WebServer]]:
    servers: list[WebServer] = []

    def start(**extra: str) -> WebServer:
        log = tmp_path / f"web-{len(servers)}.log"
        server = WebServer({**env, **extra}, log).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, html[:2000]
    return found.group(1)


def awaiting(dex: Dex, key: str) -> bool:
    return dex.client().get_call(key).status is CallStatus.AWAITING_APPROVAL


def test_dns_rebinding_cannot_read_or_decide(dex: Dex, start_web: Callable[..., WebServer]) -> None:
    """Finding 1: a page on rebind.attacker.example resolving to 127.0.0.1 reads /approvals,
    takes the CSRF token and POSTs an approval with a matching Origin. Now the first request is
    refused (421) and the call stays waiting; the same holds for every path, with or without
    users configured."""
    key = dex.client().request_call("rb", "t1", "c1", "guarded_write", {"value": 1}).key
    web = start_web()  # no users: loopback only, and (until now) any Host
    forged = f"{ATTACKER}:{web.port}"
    with httpx.Client(base_url=web.url, headers={"Host": forged}, timeout=10) as browser:
        page = browser.get("/approvals")
        assert page.status_code in (400, 421), page.text[:500]
        assert key not in page.text and 'name="csrf"' not in page.text
        token = csrf_of(page.text) if page.status_code == 200 else "0" * 64
        decided = browser.post(
            "/approvals/decide",
            data={"key": key, "action": "approve", "csrf": token},
            headers={"Origin": f"http://{forged}", "Referer": f"http://{forged}/approvals"},
        )
        assert decided.status_code in (400, 421)
        for path in (
            "/",
            "/calls",
            f"/calls/{key}",
            "/unknowns",
            "/budgets",
            "/metrics",
            "/healthz",
            "/login",
        ):
            assert browser.get(path).status_code in (400, 421), path
    assert awaiting(dex, key)
    # The real names still work: loopback by address and by name.
    assert httpx.get(f"{web.url}/approvals", timeout=10).status_code == 200
    assert (
        httpx.get(f"{web.url}/healthz", headers={"Host": f"localhost:{web.port}"}).status_code
        == 200
    )

    named = start_web(DEX_WEB_USERS="alice:pw-a", DEX_ALLOWED_HOSTS="dex.example.com")
    assert httpx.get(f"{named.url}/login", headers={"Host": ATTACKER}).status_code in (400, 421)
    assert httpx.get(f"{named.url}/login", headers={"Host": "dex.example.com"}).status_code == 200
    assert httpx.get(f"{named.url}/login", headers={"Host": "localhost"}).status_code == 200


def test_a_scrape_token_cannot_decide_and_decisions_name_the_token(
    dex: Dex, start_web: Callable[..., WebServer]
) -> None:
    """Finding 3 (`prom`): the bearer token meant for Prometheus rejected a call. Now a
    `name:token` entry may only read (`metrics`, `calls:read`); deciding needs
    `approvals:decide`, and the decision records the token's name."""
    client = dex.client()
    key = client.request_call("tk", "t1", "c1", "guarded_write", {"value": 1}).key
    other = client.request_call("tk", "t1", "c2", "guarded_write", {"value": 2}).key
    web = start_web(
        DEX_WEB_USERS="alice:pw-a",
        DEX_WEB_TOKENS="prom:prom-token,ops:ops-token:approvals:decide+calls:read,agent:agent-token:tools:call",
    )

    def as_token(token: str) -> httpx.Client:
        return httpx.Client(
            base_url=web.url, headers={"Authorization": f"Bearer {token}"}, timeout=10
        )

    with as_token("prom-token") as prom:
        assert prom.get("/metrics").status_code == 200
        page = prom.get("/approvals")
        assert page.status_code == 200 and key in page.text
        for action in ("reject", "approve"):
            refused = prom.post(
                "/approvals/decide", data={"key": key, "action": action, "csrf": csrf_of(page.text)}
            )
            assert refused.status_code == 403, refused.text
            assert "approvals:decide" in refused.text
        refused = prom.post(
            "/unknowns/reconcile", data={"session": "tk", "csrf": csrf_of(page.text)}
        )
        assert refused.status_code == 403
    assert awaiting(dex, key)

    with as_token("agent-token") as agent:  # may call tools over MCP, not read the web app
        assert agent.get("/metrics").status_code == 403
        assert agent.get("/approvals").status_code == 403
        assert agent.get(f"/calls/{key}").status_code == 403

    with as_token("ops-token") as ops:
        assert ops.get("/metrics").status_code == 403  # not in its scopes
        page = ops.get("/approvals")
        done = ops.post(
            "/approvals/decide",
            data={"key": key, "action": "reject", "csrf": csrf_of(page.text)},
            follow_redirects=False,
        )
        assert done.status_code == 303, done.text
    record = client.get_call(key)
    assert record.status is CallStatus.REJECTED
    assert record.approval is not None and record.approval.decided_by == "ops"

    # A person may decide, by Basic auth too; the decision names the person.
    basic = "Basic " + base64.b64encode(b"alice:pw-a").decode()
    with httpx.Client(base_url=web.url, headers={"Authorization": basic}, timeout=10) as alice:
        page = alice.get("/approvals")
        done = alice.post(
            "/approvals/decide",
            data={"key": other, "action": "reject", "csrf": csrf_of(page.text)},
            follow_redirects=False,
        )
        assert done.status_code == 303
    decided = client.get_call(other).approval
    assert decided is not None and decided.decided_by == "alice"


def sign_in(web: WebServer, name: str, password: str, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{web.url}/login",
        data={"name": name, "password": password, "next": "/"},
        headers=headers,
        timeout=10,
    )


def test_sign_out_revokes_the_cookie_everywhere(
    dex: Dex, start_web: Callable[..., WebServer]
) -> None:
    """Finding 3: the cookie stayed valid for 12 h after sign-out. Now its nonce is revoked on
    the server: a copy of the cookie is refused, by this process and by another web app of the
    same deployment (same `web_secret_key`, same Redis)."""
    settings = {"DEX_WEB_USERS": "alice:pw-a", "DEX_WEB_SECRET_KEY": "shared-key-for-two"}
    web, replica = start_web(**settings), start_web(**settings)
    signed = sign_in(web, "alice", "pw-a")
    assert signed.status_code == 303
    cookie = signed.cookies["dex_session"]
    copied = {"dex_session": cookie}

    def page(server: WebServer) -> httpx.Response:
        return httpx.get(f"{server.url}/approvals", cookies=copied, timeout=10)

    assert page(web).status_code == 200 and page(replica).status_code == 200
    out = httpx.post(
        f"{web.url}/logout", data={"csrf": csrf_of(page(web).text)}, cookies=copied, timeout=10
    )
    assert out.status_code == 303
    for server in (web, replica):
        replayed = page(server)
        assert replayed.status_code == 303 and replayed.headers["location"].startswith("/login")
        assert httpx.get(f"{server.url}/metrics", cookies=copied, timeout=10).status_code == 401
    # A fresh sign-in works again.
    again = sign_in(web, "alice", "pw-a").cookies["dex_session"]
    assert again != cookie
    assert httpx.get(f"{web.url}/approvals", cookies={"dex_session": again}).status_code == 200


def test_cookies_are_secure_over_tls_at_a_trusted_proxy(
    dex: Dex, start_web: Callable[..., WebServer]
) -> None:
    """Finding 3: never `Secure`. Behind a proxy listed in `DEX_WEB_TRUSTED_PROXIES` that says
    the client came over https, the cookie is `Secure`; a client's own `X-Forwarded-Proto` is
    not believed."""
    trusted = start_web(DEX_WEB_USERS="alice:pw-a", DEX_WEB_TRUSTED_PROXIES="127.0.0.1")
    https = {"X-Forwarded-Proto": "https", "Origin": f"https://127.0.0.1:{trusted.port}"}
    secure = sign_in(trusted, "alice", "pw-a", **https)
    assert secure.status_code == 303
    attributes = secure.headers["set-cookie"].lower()
    assert "secure" in attributes and "httponly" in attributes and "samesite=strict" in attributes
    # Over https the Origin check compares https: a page served over http is cross-site.
    http_origin = sign_in(
        trusted, "alice", "pw-a", **{**https, "Origin": f"http://127.0.0.1:{trusted.port}"}
    )
    assert http_origin.status_code == 403
    plain = sign_in(trusted, "alice", "pw-a")
    assert "secure" not in plain.headers["set-cookie"].lower()

    untrusted = start_web(DEX_WEB_USERS="alice:pw-a")
    claimed = sign_in(untrusted, "alice", "pw-a", **{"X-Forwarded-Proto": "https"})
    assert claimed.status_code == 303 and "secure" not in claimed.headers["set-cookie"].lower()


def test_forty_wrong_passwords_are_throttled(dex: Dex, start_web: Callable[..., WebServer]) -> None:
    """Finding 3: 40 wrong passwords in 0.1 s, none refused. Now after 5 failures in a minute
    the address gets 429 with Retry-After, for the right password too, whether guessed on
    /login or with HTTP Basic; the person still signs in from another address (the name alone
    is throttled only past many more failures, from many addresses)."""
    web = start_web(DEX_WEB_USERS="alice:pw-a,bob:pw-b", DEX_WEB_TRUSTED_PROXIES="127.0.0.1")
    codes = [sign_in(web, "alice", f"guess-{i}").status_code for i in range(40)]
    assert codes[:5] == [401] * 5
    assert set(codes[5:]) == {429}
    refused = sign_in(web, "alice", "pw-a")
    assert refused.status_code == 429 and 0 < int(refused.headers["retry-after"]) <= 60
    # One address's wrong guesses do not lock the person out from elsewhere (a trusted proxy
    # says where the client is): anyone could otherwise lock anyone out by name ...
    elsewhere = sign_in(web, "alice", "pw-a", **{"X-Forwarded-For": "203.0.113.9"})
    assert elsewhere.status_code == 303
    # ... and the address is throttled for any name.
    assert sign_in(web, "bob", "pw-b").status_code == 429
    assert sign_in(web, "bob", "pw-b", **{"X-Forwarded-For": "203.0.113.10"}).status_code == 303

    # HTTP Basic is a password guess too.
    basic = start_web(DEX_WEB_USERS="alice:pw-a")

    def scrape(password: str) -> int:
        return httpx.get(f"{basic.url}/metrics", auth=("alice", password), timeout=10).status_code

    codes = [scrape(f"guess-{i}") for i in range(40)]
    assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}
    assert scrape("pw-a") == 429


HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


def test_every_answer_carries_the_security_headers(
    dex: Dex, start_web: Callable[..., WebServer]
) -> None:
    """Finding 3: no `X-Frame-Options` or CSP. Now every answer (pages, sign-in, refusals,
    /metrics, the style sheet) forbids framing and inline script."""
    web = start_web(DEX_WEB_USERS="alice:pw-a")
    cookie = {"dex_session": sign_in(web, "alice", "pw-a").cookies["dex_session"]}
    answers = [
        httpx.get(f"{web.url}/login"),
        httpx.get(f"{web.url}/healthz"),
        httpx.get(f"{web.url}/approvals", cookies=cookie),
        httpx.get(f"{web.url}/calls", cookies=cookie),
        httpx.get(f"{web.url}/metrics"),  # 401
        httpx.get(f"{web.url}/login", headers={"Host": ATTACKER}),  # 421
        httpx.get(f"{web.url}/static/dex.css"),
    ]
    for answer in answers:
        for name, value in HEADERS.items():
            assert answer.headers.get(name) == value, (answer.url, answer.status_code, name)
        csp = answer.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp
    page = answers[2].text
    assert "<style" not in page and " style=" not in page and "<script" not in page
    assert answers[-1].headers["content-type"].startswith("text/css")
    assert "font:" in answers[-1].text


@dataclass
class TlsWebServer(WebServer):
    """`dex-celery web --ssl-certfile ... --ssl-keyfile ...`: the app itself serves https."""

    cert: Path = Path()
    key: Path = Path()

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--ssl-certfile",
            str(self.cert),
            "--ssl-keyfile",
            str(self.key),
        ]

    def _healthy(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"web app exited:\n{self.log_path.read_text()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1, verify=False).status_code == 200
        except httpx.HTTPError:
            return False


def test_cookies_are_secure_when_the_app_serves_tls(
    env: dict[str, str], dex: Dex, tmp_path: Path
) -> None:
    """Finding 3, the other half: served over TLS by the app itself, the cookie is `Secure`."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
         "-keyout", str(key), "-out", str(cert), "-days", "1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    web = TlsWebServer(
        {**env, "DEX_WEB_USERS": "alice:pw-a"}, tmp_path / "tls.log", cert=cert, key=key
    )
    web.start()
    try:
        signed = httpx.post(
            f"{web.url}/login", data={"name": "alice", "password": "pw-a", "next": "/"},
            verify=False, timeout=10,
        )  # fmt: skip
        assert signed.status_code == 303
        assert "secure" in signed.headers["set-cookie"].lower()
    finally:
        web.stop()
