"""The web app in a real browser (Debian's chromium, headless, via Selenium and chromedriver),
against a real `dex-celery web` process, a real Celery worker and a real redis-server.

A person signs in, sees the waiting calls, approves one and watches it become `succeeded` (the
tool ran once, by its own log), rejects another; without credentials nothing is shown or
decided; a forged cross-site form post is refused however it is dressed up.

Set `DEX_WEB_SCREENSHOTS=docs/web` to refresh the README's screenshots from this test.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.processes import Worker, free_port, wait_for
from devtools.toolapp import executions
from dex_celery import CallStatus, Dex
from tests.support.web.web_process import WebServer, chromium, shot, texts

USERS = "alice:alice-password,bob:bob-password"


@pytest.fixture
def web(env: dict[str, str], dex: Dex, tmp_path: Path) -> Iterator[WebServer]:
    server = WebServer(
        {**env, "DEX_WEB_USERS": USERS, "DEX_WEB_SECRET_KEY": "test-secret-key"},
        tmp_path / "web.log",
    ).start()
    yield server
    server.stop()


def swept_unknown(dex: Dex, key: str) -> bool:
    dex.sweeper.sweep_once()
    return status_of(dex, key) is CallStatus.OUTCOME_UNKNOWN


def status_of(dex: Dex, key: str) -> CallStatus:
    return dex.client().get_call(key).status


class EvilSite:
    """Another origin serving a page whose form auto-posts a decision to the web app."""

    def __init__(self, target: str, key: str) -> None:
        page = f"""<!doctype html><html><body>
<form id="f" method="post" action="{target}/approvals/decide">
<input name="key" value="{key}"><input name="action" value="approve">
<input name="csrf" value="guessed"><input name="note" value="forged"></form>
<script>document.getElementById('f').submit();</script></body></html>""".encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        # "localhost" vs "127.0.0.1": a different site as far as the browser is concerned.
        self.url = f"http://localhost:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_sign_in_approve_reject_and_refusals_in_chromium(
    dex: Dex, web: WebServer, start_worker: Callable[..., Worker]
) -> None:
    from selenium.webdriver.common.by import By  # deferred: selenium is a test-only dependency

    start_worker()
    client = dex.client()
    approve_key = client.request_call("web-s1", "t1", "c1", "guarded_write", {"value": 42}).key
    reject_key = client.request_call("web-s1", "t1", "c2", "guarded_write", {"value": 7}).key
    forged_key = client.request_call("web-s2", "t1", "c1", "guarded_write", {"value": 9}).key
    for key in (approve_key, reject_key, forged_key):
        assert status_of(dex, key) is CallStatus.AWAITING_APPROVAL

    # Without credentials: no page, no decision, no metrics.
    anonymous = httpx.Client(base_url=web.url, follow_redirects=False)
    page = anonymous.get("/approvals")
    assert page.status_code == 303 and page.headers["location"].startswith("/login")
    assert approve_key not in page.text
    refused = anonymous.post("/approvals/decide", data={"key": approve_key, "action": "approve"})
    assert refused.status_code == 401
    assert anonymous.get("/metrics").status_code == 401
    wrong = httpx.get(f"{web.url}/metrics", auth=("alice", "not-her-password"))
    assert wrong.status_code == 401
    assert status_of(dex, approve_key) is CallStatus.AWAITING_APPROVAL

    with chromium() as driver:
        d: Any = driver
        d.get(f"{web.url}/approvals")
        assert "/login" in d.current_url  # sent to sign in first
        d.find_element(By.ID, "name").send_keys("alice")
        d.find_element(By.ID, "password").send_keys("wrong")
        d.find_element(By.ID, "sign-in").click()
        wait_for(lambda: d.find_elements(By.ID, "error"), timeout=10, what="the sign-in error")
        assert "wrong name or password" in d.find_element(By.ID, "error").text
        d.find_element(By.ID, "name").send_keys("alice")
        d.find_element(By.ID, "password").send_keys("alice-password")
        shot(d, "sign-in")
        d.find_element(By.ID, "sign-in").click()

        # The waiting calls, oldest first, with tool, effect class, arguments and time left.
        wait_for(lambda: d.find_elements(By.ID, "approvals"), timeout=10, what="the approvals")
        assert d.find_element(By.ID, "user").text == "alice"
        # The style sheet applies under the Content-Security-Policy (no inline styles allowed).
        background = d.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(246, 247, 249)", background
        rows = d.find_elements(By.CSS_SELECTOR, "#approvals tr[data-key]")
        assert [r.get_attribute("data-key") for r in rows] == [approve_key, reject_key, forged_key]
        first = rows[0].text
        assert "guarded_write" in first and "non_idempotent_write" in first and "42" in first
        assert "23h" in rows[0].find_element(By.CLASS_NAME, "left").text
        shot(d, "approvals")

        # Approve: the call runs on the real worker; its page refreshes until it has ended.
        row = d.find_element(By.CSS_SELECTOR, f'tr[data-key="{approve_key}"]')
        row.find_element(By.NAME, "note").send_keys("refund agreed with the customer")
        row.find_element(By.CSS_SELECTOR, "button.approve").click()
        wait_for(
            lambda: texts(d, "status") == ["succeeded"],
            timeout=30,
            what="the approved call's page to show succeeded",
        )
        approval = d.find_element(By.ID, "approval").text
        assert "approved by alice" in approval and "refund agreed" in approval
        assert d.find_elements(By.CSS_SELECTOR, "#attempts tr")[1].text.startswith("1 ")
        shot(d, "call")
        assert status_of(dex, approve_key) is CallStatus.SUCCEEDED
        assert [line.split()[0] for line in executions(approve_key)] == ["start"]
        record = client.get_call(approve_key)
        assert record.approval is not None and record.approval.decided_by == "alice"

        # Reject another, with a reason; it never runs.
        d.get(f"{web.url}/approvals")
        wait_for(lambda: d.find_elements(By.ID, "approvals"), timeout=10, what="the approvals")
        row = d.find_element(By.CSS_SELECTOR, f'tr[data-key="{reject_key}"]')
        row.find_element(By.NAME, "note").send_keys("duplicate request")
        row.find_element(By.CSS_SELECTOR, "button.reject").click()
        wait_for(lambda: texts(d, "status") == ["rejected"], timeout=10,
                 what="the rejected call's page")  # fmt: skip
        assert "rejected by alice" in d.find_element(By.ID, "approval").text
        assert status_of(dex, reject_key) is CallStatus.REJECTED
        assert executions(reject_key) == []

        d.get(f"{web.url}/calls")
        shot(d, "calls")

        # An outcome_unknown call (its worker vanished after the claim) waits to be reported.
        # `unserved_write` waits in a queue no worker reads, so the claim here is the only one.
        lost = client.request_call("web-s3", "t1", "c1", "unserved_write", {})
        assert dex.ledger.claim(lost.key, 1, owner="gone:1", fence="f1").ok
        # ... and in SQL, as a real worker does before any tool code of a write.
        now = dex.ledger.now()
        assert dex.store.claim_write(lost.key, 1, fence="f1", owner="gone:1", now=now)
        wait_for(lambda: swept_unknown(dex, lost.key), timeout=20, what="the lost call",
                 interval=0.2)  # fmt: skip
        d.get(f"{web.url}/unknowns")
        wait_for(lambda: d.find_elements(By.ID, "unknowns"), timeout=10, what="the unknowns")
        row = d.find_element(By.CSS_SELECTOR, f'#unknowns tr[data-key="{lost.key}"]')
        assert "unserved_write" in row.text and "none: a person" in row.text
        shot(d, "unknowns")
        d.find_element(By.CSS_SELECTOR, 'button[data-session="web-s3"]').click()
        wait_for(lambda: texts(d, "flash"), timeout=10, what="the reconcile summary")
        assert "1 without an outcome check" in texts(d, "flash")[0]
        cookie = d.get_cookie("dex_session")["value"]

        # A forged cross-site form post, from another site, in alice's signed-in browser.
        evil = EvilSite(web.url, forged_key)
        try:
            d.get(evil.url)

            def refusal_shown() -> bool:
                if "/approvals/decide" not in d.current_url:
                    return False
                body = d.find_element(By.TAG_NAME, "body").text
                return "refused" in body or "authentication required" in body

            wait_for(refusal_shown, timeout=10, what="the forged post to be refused")
        finally:
            evil.close()
        assert status_of(dex, forged_key) is CallStatus.AWAITING_APPROVAL

    # The same forgery sent with alice's real cookie: the CSRF token and origin checks hold.
    signed_in = httpx.Client(base_url=web.url, cookies={"dex_session": cookie})
    form = {"key": forged_key, "action": "approve", "csrf": "guessed"}
    assert signed_in.post("/approvals/decide", data=form).status_code == 403
    page = signed_in.get("/approvals").text
    token = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    foreign = signed_in.post(
        "/approvals/decide",
        data={**form, "csrf": token},
        headers={"Origin": "http://evil.example"},
    )
    assert foreign.status_code == 403 and "cross-site" in foreign.text
    assert status_of(dex, forged_key) is CallStatus.AWAITING_APPROVAL
    # ...while the real page's own form, with its token, works.
    ok = signed_in.post(
        "/approvals/decide",
        data={**form, "csrf": token, "action": "reject"},
        headers={"Origin": web.url},
    )
    assert ok.status_code == 303
    assert status_of(dex, forged_key) is CallStatus.REJECTED
    # Deciding again (a stale tab, a second person) gets the CLI's one-winner answer.
    again = signed_in.post("/approvals/decide", data={**form, "csrf": token, "action": "approve"})
    assert again.status_code == 409 and "already rejected by alice" in again.text


def test_edit_arguments_then_approve_in_chromium(
    dex: Dex, web: WebServer, start_worker: Callable[..., Worker]
) -> None:
    """S13.3.3, S13.3.4 in a real browser: alice opens "Edit arguments, then approve", changes
    the value, approves; the call runs once on a real worker with the edited value, its page
    shows the edit, and the model's TOOL message says the arguments were edited. A bad edit
    first is shown as the page's error and changes nothing."""
    from selenium.webdriver.common.by import By  # deferred: selenium is a test-only dependency

    start_worker()
    key = dex.client().request_call("web-e1", "t1", "c1", "guarded_write", {"value": 42}).key
    with chromium() as driver:
        d: Any = driver
        d.get(f"{web.url}/login")
        d.find_element(By.ID, "name").send_keys("alice")
        d.find_element(By.ID, "password").send_keys("alice-password")
        d.find_element(By.ID, "sign-in").click()
        wait_for(lambda: d.find_elements(By.ID, "approvals"), timeout=10, what="the approvals")

        def submit_edit(text: str) -> None:
            row = d.find_element(By.CSS_SELECTOR, f'tr[data-key="{key}"]')
            row.find_element(By.CSS_SELECTOR, "details.edit summary").click()
            area = row.find_element(By.NAME, "arguments")
            area.clear()
            area.send_keys(text)
            row.find_element(By.CSS_SELECTOR, "button.approve-edited").click()

        submit_edit('{"value": 43, "extra": 1}')
        wait_for(lambda: d.find_elements(By.ID, "error"), timeout=10, what="the edit's refusal")
        assert "edited arguments" in d.find_element(By.ID, "error").text
        assert status_of(dex, key) is CallStatus.AWAITING_APPROVAL

        d.get(f"{web.url}/approvals")
        wait_for(lambda: d.find_elements(By.ID, "approvals"), timeout=10, what="the approvals")
        submit_edit('{"value": 43}')
        wait_for(lambda: texts(d, "status") == ["succeeded"], timeout=30,
                 what="the edited call's page to show succeeded")  # fmt: skip
        assert "by alice" in d.find_element(By.ID, "edit").text
        shot(d, "call-edited")
    record = dex.client().get_call(key)
    assert record.result == "43" and [x.split()[0] for x in executions(key)] == ["start"]
    history = dex.client().get_agent_snapshot("web-e1").messages
    (message,) = [m.tool_output or "" for m in history if m.tool_call_id == "c1" and m.tool_output]
    assert message.startswith("Note: alice edited the arguments") and message.endswith("43")
