"""The web app's write freeze (docs/semantics.md, S13.2; docs/security.md) against a real
`dex-celery web` process over real HTTP: its own scope `writes:freeze` (a token without it gets
403 and nothing is frozen), the `Host` check and the CSRF token of every form, who froze and
thawed recorded, and the banner on every page while writes are frozen."""

from __future__ import annotations

import base64
from collections.abc import Callable

import httpx

from dex_celery import Dex
from tests.integration.web import test_web_doors as doors
from tests.integration.web.test_web_doors import ATTACKER, csrf_of
from tests.support.web.web_process import WebServer

#: The web server fixture of the doors' tests, shared.
start_web = doors.start_web

TOKENS = (
    "prom:prom-token,ops:ops-token:approvals:decide+calls:read,"
    "freezer:freeze-token:writes:freeze+calls:read"
)


def test_freezing_needs_its_scope_the_host_and_the_csrf_token(
    dex: Dex,
    start_web: Callable[..., WebServer],
) -> None:
    web = start_web(DEX_WEB_USERS="alice:pw-a", DEX_WEB_TOKENS=TOKENS)

    def as_token(token: str, **headers: str) -> httpx.Client:
        return httpx.Client(
            base_url=web.url,
            headers={"Authorization": f"Bearer {token}", **headers},
            timeout=10,
        )

    form = {"reason": "incident 7", "mode": "hold"}
    for token in ("ops-token", "prom-token"):  # may read (and decide), never freeze
        with as_token(token) as reader:
            page = reader.get("/writes")
            assert page.status_code == 200 and "writes:freeze" in page.text
            refused = reader.post("/writes/freeze", data={**form, "csrf": csrf_of(page.text)})
            assert refused.status_code == 403 and "writes:freeze" in refused.text
            refused = reader.post("/writes/thaw", data={"csrf": csrf_of(page.text)})
            assert refused.status_code == 403
    assert dex.writes.status() == []

    forged = f"{ATTACKER}:{web.port}"
    with as_token("freeze-token") as freezer:
        page = freezer.get("/writes")
        assert page.status_code == 200 and 'id="freeze-form"' in page.text
        csrf = csrf_of(page.text)
        rebound = freezer.post(
            "/writes/freeze",
            data={**form, "csrf": csrf},
            headers={"Host": forged, "Origin": f"http://{forged}"},
        )
        assert rebound.status_code in (400, 421)
        assert freezer.post("/writes/freeze", data=form).status_code == 403  # no CSRF token
        assert dex.writes.status() == []
        done = freezer.post("/writes/freeze", data={**form, "csrf": csrf}, follow_redirects=False)
        assert done.status_code == 303, done.text
    [frozen] = dex.writes.status()
    assert (frozen.tool, frozen.frozen_by, frozen.reason) == ("*", "freezer", "incident 7")

    basic = "Basic " + base64.b64encode(b"alice:pw-a").decode()
    with httpx.Client(base_url=web.url, headers={"Authorization": basic}, timeout=10) as alice:
        for path in ("/approvals", "/calls", "/unknowns", "/writes"):
            page = alice.get(path)
            assert 'id="writes-frozen"' in page.text, path
            assert "frozen by freezer" in page.text and "incident 7" in page.text
        page = alice.get("/writes")
        done = alice.post("/writes/thaw", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
        assert done.status_code == 303, done.text
        assert 'id="writes-frozen"' not in alice.get("/approvals").text
    assert dex.writes.status() == []
    [thawed] = dex.writes.history()
    assert (thawed.frozen_by, thawed.thawed_by) == ("freezer", "alice")
