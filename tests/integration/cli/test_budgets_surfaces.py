"""Where write budgets show (S13.1.5): the request's answer, `budgets show`, `calls show`,
`approvals list`, the web app's pages, the webhook body and the metrics, on a real redis-server
and both SQLite and the running PostgreSQL. No worker runs: admitted calls stay reserved.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result
from prometheus_client import generate_latest
from starlette.testclient import TestClient

from dex_celery import CallStatus, Dex, Settings
from dex_celery.cli.main import main
from dex_celery.ops.metrics import registry_for
from dex_celery.ops.timeline import EntryKind, session_timeline
from dex_celery.web.app import WebApp
from dex_celery.web.auth import Credentials
from tests.support.stores.databases import ON_BOTH_DATABASES
from tests.support.stores.env_dex import dex_of

pytestmark = [
    pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning"),
    ON_BOTH_DATABASES,
]

APP = "devtools.toolapp:dex"
BUDGETS = (
    "writes: tools=slow_non_idempotent_write limit=2 label=writes; "
    "spend: tools=charge limit=1000 measure=amount scope=principal window=day over=reject "
    "label=refunds"
)
WAITING = "2 of 2 writes in this session already used or in doubt; this call needs 1 more"


@pytest.fixture
def budgeted(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Dex]:
    env["DEX_BUDGETS"] = BUDGETS
    dex = dex_of(env, monkeypatch)
    import devtools.toolapp as toolapp

    monkeypatch.setattr(toolapp, "dex", dex)
    yield dex


def cli(*args: str) -> Result:
    result = CliRunner().invoke(main, ["--app", APP, *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def state(budgeted: Dex) -> dict[str, str]:
    """Two writes admitted (reserved), a third waiting for a person; a charge of 600 for acme
    admitted, one of 500 rejected."""
    client = budgeted.client()
    tool = "slow_non_idempotent_write"
    for n in (1, 2):
        assert client.request_call("s1", "t1", f"w{n}", tool, {}).status is CallStatus.PENDING
    waiting = client.request_call("s1", "t1", "w3", tool, {})
    assert waiting.status is CallStatus.AWAITING_APPROVAL
    assert waiting.budget_reason == WAITING
    ok = client.request_call(
        "s2", "t1", "c1", "charge", {"order": "o1", "amount": 600}, principal="acme"
    )
    assert ok.status is CallStatus.PENDING
    refused = client.request_call(
        "s2", "t1", "c2", "charge", {"order": "o2", "amount": 500}, principal="acme"
    )
    assert refused.status is CallStatus.REJECTED
    assert refused.error is not None
    assert refused.error.startswith("not run: the write budget spend is used up (600 of 1000")
    # The model reads it in its history, too.
    _calls, history = budgeted.store.snapshot("s2")
    assert any("the write budget spend is used up" in (m.tool_output or "") for m in history)
    return {"waiting": waiting.key, "admitted": ok.key, "refused": refused.key}


def test_budgets_show_lists_used_held_left(budgeted: Dex, state: dict[str, str]) -> None:
    lines = cli("budgets", "show").output.splitlines()
    assert lines[0].split() == ["BUDGET", "SCOPE", "LIMIT", "USED", "HELD", "LEFT", "MEASURE"]
    assert ["spend", "principal:acme", "1000", "600", "0", "400", "amount", "(refunds)"] in [
        line.split() for line in lines
    ]
    assert ["writes", "session:s1", "2", "2", "0", "0", "writes"] in [row.split() for row in lines]
    rows = json.loads(cli("budgets", "show", "--json").output)["scopes"]
    by = {(r["name"], r["scope"]): r for r in rows}
    writes = by[("writes", "session:s1")]
    assert (writes["limit"], writes["used"], writes["held"], writes["left"]) == (2, 2.0, 0.0, 0.0)
    spend = json.loads(cli("budgets", "show", "--scope", "principal:acme", "--json").output)
    (acme,) = spend["scopes"]
    assert (acme["name"], acme["used"], acme["left"], acme["source"]) == (
        "spend",
        600.0,
        400.0,
        "ledger",
    )


def test_calls_show_and_approvals_list_say_why(budgeted: Dex, state: dict[str, str]) -> None:
    shown = cli("calls", "show", state["waiting"]).output
    assert f"budget    over: {WAITING}" in shown
    assert "budget    writes session:s1: this call 1 of limit 2" in shown
    details = json.loads(cli("calls", "show", state["waiting"], "--json").output)
    assert details["budget_reason"] == WAITING
    assert details["budgets"][0]["now"]["left"] == 0.0
    listed = cli("approvals", "list").output
    assert f"over budget: {WAITING}" in listed
    assert json.loads(cli("approvals", "list", "--json").output)[0]["budget_reason"] == WAITING


def test_web_pages_and_metrics_show_the_budgets(budgeted: Dex, state: dict[str, str]) -> None:
    app = WebApp(budgeted, Credentials.from_settings(Settings(web_users="alice:pw-a")))
    client = TestClient(app.build(), base_url="http://localhost", follow_redirects=False)
    signed = client.post("/login", data={"name": "alice", "password": "pw-a", "next": "/"})
    assert signed.status_code == 303
    page = client.get("/budgets")
    assert page.status_code == 200
    assert 'data-budget="writes" data-scope="session:s1"' in page.text
    assert 'data-budget="spend" data-scope="principal:acme"' in page.text
    for path in ("/approvals", f"/calls/{state['waiting']}"):
        assert WAITING in client.get(path).text, path

    metrics = generate_latest(registry_for(budgeted)).decode()
    assert 'dex_budget_used{budget="spend",scope="principal:acme"} 600.0' in metrics
    assert 'dex_budget_left{budget="spend",scope="principal:acme"} 400.0' in metrics
    assert "dex_budget_calls_waiting 1.0" in metrics
    assert "session:s1" not in metrics  # one series per session would have no end


def test_a_persons_approval_admits_a_call_over_its_budget(
    budgeted: Dex, state: dict[str, str]
) -> None:
    """S13.1.4: the person was told why it waits; their approval admits it over the limit."""
    events = [
        e.type for e in budgeted.client().events(session_id="s1") if e.key == state["waiting"]
    ]
    assert events[:2] == ["tool_call_requested", "tool_call_awaiting_approval"], events
    approved = budgeted.client().approve(state["waiting"], "ann", "one more is fine")
    assert approved.status is CallStatus.PENDING
    writes = json.loads(cli("budgets", "show", "--scope", "session:s1", "--json").output)
    (scope,) = writes["scopes"]
    assert (scope["used"], scope["left"]) == (3.0, 0.0)


def test_the_session_timeline_shows_charges_and_the_call_over_budget(
    budgeted: Dex, state: dict[str, str]
) -> None:
    """S13.6.5: budget decisions join the session's story."""
    entries = session_timeline(budgeted, "s1").entries
    charged = [e for e in entries if e.kind is EntryKind.BUDGET_CHARGED]
    assert len(charged) == 2
    assert charged[0].summary == "charged 1 to budget writes (session:s1, limit 2): reserved"
    (over,) = [e for e in entries if e.kind is EntryKind.BUDGET_OVER]
    assert over.call_key == state["waiting"] and over.summary == f"over budget: {WAITING}"
    rejected = session_timeline(budgeted, "s2").entries
    assert next(e.summary for e in rejected if e.kind is EntryKind.BUDGET_OVER).startswith(
        "over budget: 600 of 1000 amount (refunds) for acme"
    )
