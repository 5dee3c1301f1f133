"""The web app's pages and buttons without a browser (Starlette's test client), on a real
redis-server and SQLite: searches, secrets, two people deciding at once, reconciling a session.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from devtools.processes import wait_for
from dex_celery import CallStatus, Dex, EffectClass, Settings, ToolContext, ToolPolicy
from dex_celery.tools.sealing import unseal
from dex_celery.web.app import WebApp
from dex_celery.web.auth import Credentials
from tests.support.web.web_session import CREDENTIALS, signed_in


@pytest.fixture
def app(dex: Dex) -> WebApp:
    def refund(ctx: ToolContext, order: str = "", card: str = "", secret: str = "") -> Any:
        return "refunded"

    dex.tool("refund", policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE,
                                         secret_arguments=("card",)))(refund)  # fmt: skip
    return WebApp(dex, CREDENTIALS)


def csrf(client: TestClient, path: str = "/approvals") -> str:
    return client.get(path).text.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def test_secrets_never_reach_a_page(app: WebApp, dex: Dex) -> None:
    args = {"order": "1002", "card": "4111-1111-1111-1111", "secret": "hunter2"}
    key = dex.client().request_call("s1", "t1", "c1", "refund", args).key
    alice = signed_in(app, "alice", "pw-a")
    for path in ("/approvals", f"/calls/{key}", "/calls?session=s1"):
        page = alice.get(path)
        assert page.status_code == 200
        assert "4111" not in page.text and "hunter2" not in page.text, path
    assert "1002" in alice.get("/approvals").text


def test_calls_search_by_session_tool_status_and_time(app: WebApp, dex: Dex) -> None:
    client = dex.client()
    first = client.request_call("sa", "t1", "c1", "guarded_write", {"value": 1}).key
    client.reject(first, "alice")
    time.sleep(0.01)  # distinct request times, so "newest first" has one answer
    second = client.request_call("sa", "t1", "c2", "refund", {"order": "1"}).key
    other = client.request_call("sb", "t1", "c1", "refund", {"order": "2"}).key
    alice = signed_in(app, "alice", "pw-a")

    def keys(query: str) -> list[str]:
        page = alice.get(f"/calls?{query}")
        assert page.status_code == 200, page.text
        return [p.split('"', 1)[0] for p in page.text.split('<tr data-key="')[1:]]

    assert keys("") == [other, second, first]
    assert keys("session=sa") == [second, first]
    assert keys("tool=refund") == [other, second]
    assert keys("status=rejected") == [first]
    assert keys("session=sa&status=awaiting_approval") == [second]
    assert keys("since=2000-01-01T00:00&until=2000-01-02T00:00") == []
    assert set(keys("since=2000-01-01T00:00")) == {first, second, other}
    assert alice.get("/calls?since=yesterday").status_code == 400


def test_two_people_deciding_at_once_get_one_winner(app: WebApp, dex: Dex) -> None:
    key = dex.client().request_call("s2", "t1", "c1", "guarded_write", {"value": 1}).key
    people = [("alice", "pw-a", "approve"), ("bob", "pw-b", "reject")]
    clients = [(signed_in(app, n, p), action) for n, p, action in people]
    forms = [(c, {"key": key, "action": a, "csrf": csrf(c)}) for c, a in clients]
    results: list[httpx.Response] = []
    barrier = threading.Barrier(2)

    def decide(client: TestClient, form: dict[str, str]) -> None:
        barrier.wait()
        results.append(client.post("/approvals/decide", data=form))

    threads = [threading.Thread(target=decide, args=f) for f in forms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r.status_code for r in results) == [303, 409]
    loser = next(r for r in results if r.status_code == 409)
    assert "already" in loser.text
    record = dex.client().get_call(key)
    assert record.approval is not None
    winner = record.approval.decided_by
    assert f"already {record.approval.decision} by {winner}" in loser.text


def test_reconcile_one_session_reports_once(app: WebApp, dex: Dex) -> None:
    client = dex.client()
    key = client.request_call("s3", "t1", "c1", "slow_non_idempotent_write", {"seconds": 1}).key
    assert dex.ledger.claim(key, 1, owner="gone:1", fence="f").ok  # then its worker vanished
    # (after its claim in SQL, as a real worker's before any tool code of a write)
    assert dex.store.claim_write(key, 1, fence="f", owner="gone:1", now=dex.ledger.now())

    def swept() -> bool:
        dex.sweeper.sweep_once()
        return client.get_call(key).status is CallStatus.OUTCOME_UNKNOWN

    wait_for(swept, timeout=20, what="the lost call to be recorded", interval=0.2)
    dex.register_outcome_check(
        "slow_non_idempotent_write", lambda k, a: "Note from the desk: it went through."
    )
    alice = signed_in(app, "alice", "pw-a")
    assert key in alice.get("/unknowns").text
    token = csrf(alice, "/unknowns")
    assert alice.post("/unknowns/reconcile", data={"session": "s3"}).status_code == 403
    done = alice.post("/unknowns/reconcile", data={"session": "s3", "csrf": token})
    assert done.status_code == 303 and "1%20reported" in done.headers["location"]
    again = alice.post("/unknowns/reconcile", data={"session": "s3", "csrf": token})
    assert "0%20reported" in again.headers["location"]
    texts = [m.text for m in client.get_agent_snapshot("s3").messages if m.role.value == "user"]
    assert texts == [f"Note from the desk: it went through. (tool call {key})"]
    assert key not in alice.get("/unknowns").text
    page = alice.get(f"/calls/{key}").text
    assert "reported" in page and "it went through" in page
    bad = alice.post("/unknowns/reconcile", data={"session": "a/b", "csrf": token})
    assert bad.status_code == 400


def test_metrics_need_credentials(app: WebApp) -> None:
    anonymous = TestClient(app.build(), base_url="http://localhost", follow_redirects=False)
    refused = anonymous.get("/metrics")
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic")
    assert anonymous.get("/metrics", auth=("alice", "pw-a")).status_code == 200
    assert anonymous.get("/healthz").status_code == 200


def test_edit_form_approves_with_edited_arguments_behind_csrf_host_and_scope(
    app: WebApp, dex: Dex
) -> None:
    """S13.3.3 on the approvals page: the edit form shows the whole arguments with the secret
    `***`; a post without the CSRF token, with a forged Host, or from a token without the
    `approvals:decide` scope changes nothing; a bad edit is a 409 naming the problem, nothing
    stored; a good one approves with the edited arguments (the secret kept) and is recorded."""
    args = {"order": "1003", "card": "4111-1111-1111-1111"}
    key = dex.client().request_call("s9", "t1", "c1", "refund", args).key
    before = dex.store.get_call(key)
    alice = signed_in(app, "alice", "pw-a")
    page = alice.get("/approvals").text
    assert 'value="edit"' in page and "4111" not in page
    assert "&#34;card&#34;: &#34;***&#34;" in page or '"card": "***"' in page
    edited = '{"order": "1004", "card": "***"}'
    form = {"key": key, "action": "edit", "arguments": edited}
    assert alice.post("/approvals/decide", data=form).status_code == 403  # no CSRF token
    token = csrf(alice)
    forged = alice.post(
        "/approvals/decide", data={**form, "csrf": token}, headers={"Host": "evil.example"}
    )
    assert forged.status_code in (400, 421)
    reader = WebApp(dex, Credentials.from_settings(Settings(web_tokens="prom:prom-token")))
    with TestClient(reader.build(), base_url="http://localhost") as prom:
        refused = prom.post(
            "/approvals/decide",
            data={**form, "csrf": token},
            headers={"Authorization": "Bearer prom-token"},
        )
        assert refused.status_code == 403 and "approvals:decide" in refused.text
    bad = alice.post("/approvals/decide", data={**form, "arguments": '{"order": 5}', "csrf": token})
    assert bad.status_code == 409 and "edited arguments" in bad.text
    assert dex.store.get_call(key) == before

    done = alice.post("/approvals/decide", data={**form, "csrf": token})
    assert done.status_code == 303, done.text
    record = dex.store.get_call(key)
    assert record is not None and record.status is CallStatus.PENDING
    assert record.approval_edit is not None and record.approval_edit.by == "alice"
    assert record.approval_edit.after == {"order": "1004", "card": "***"}
    assert unseal(record.sealed_arguments, dex.settings.secret_key) == {"card": args["card"]}
    call_page = alice.get(f"/calls/{key}").text
    assert 'id="edit"' in call_page and "1004" in call_page and "4111" not in call_page
