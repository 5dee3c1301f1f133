"""`dex-celery approvals list | approve | reject` (S6, S6.3): output and exit codes, against a
real redis-server and both SQLite and the running PostgreSQL (a private schema per test).

The command loads `--app tests.support.apps.cliapp:dex`, which each test points at its own `Dex`.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from click.testing import CliRunner, Result

from devtools.processes import wait_for
from dex_celery import CallStatus, Dex, EffectClass, ToolContext, ToolPolicy
from dex_celery.cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, main
from tests.support.apps import cliapp
from tests.support.stores.databases import ON_BOTH_DATABASES

pytestmark = [
    pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning"),
    ON_BOTH_DATABASES,
]


@pytest.fixture
def cli(dex: Dex, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run `dex-celery --app tests.support.apps.cliapp:dex approvals ARGS...` in-process."""
    monkeypatch.setattr(cliapp, "dex", dex)
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(main, ["--app", "tests.support.apps.cliapp:dex", "approvals", *args])

    return run


def _noop(ctx: ToolContext, **arguments: Any) -> Any:
    return "ok"


def refused_line(result: Result) -> str:
    """A refusal is exit 1 with exactly one `error: ...` line on stderr and nothing on stdout."""
    assert result.exit_code == EXIT_REFUSED, (result.exit_code, result.output)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_list_shows_what_waits_as_text_and_json(dex: Dex, cli: Any) -> None:
    """S6.1, S9.2: `approvals list` prints the waiting calls oldest first with tool, effect,
    deadline and redacted arguments; `--session` filters; `--json` is machine-readable."""
    empty = cli("list")
    assert empty.exit_code == EXIT_OK and "no calls are waiting" in empty.stdout
    assert json.loads(cli("list", "--json").stdout) == []

    dex.tool(
        "charge_card",
        policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, secret_arguments=("token",)),
    )(_noop)
    client = dex.client()
    a = client.request_call("s1", "t1", "c1", "charge_card", {"amount": 7, "token": "sk-live"})
    b = client.request_call("s2", "t1", "c1", "guarded_write", {"value": "x"})
    client.request_call("s1", "t2", "c1", "echo", {})

    text = cli("list")
    assert text.exit_code == EXIT_OK, text.output
    lines = text.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [a.key, b.key]
    assert "charge_card" in lines[0] and "non_idempotent_write" in lines[0]
    assert "deadline" in lines[0] and '"token": "***"' in lines[0]
    assert "sk-live" not in text.stdout

    listed = json.loads(cli("list", "--json").stdout)
    assert [p["key"] for p in listed] == [a.key, b.key]
    assert listed[0]["arguments"] == {"amount": 7, "token": "***"}
    assert listed[0]["effect"] == "non_idempotent_write"
    assert listed[0]["deadline"] == pytest.approx(a.approval_deadline)
    only = json.loads(cli("list", "--session", "s2", "--json").stdout)
    assert [p["key"] for p in only] == [b.key]
    assert cli("list", "--limit", "0").exit_code == EXIT_USAGE


def test_approve_and_reject_then_every_refusal_exits_1_and_changes_nothing(
    dex: Dex, cli: Any
) -> None:
    """S6.1-S6.3: approve and reject exit 0 and record who and why; deciding twice, deciding a
    call that never waited, an unknown key and a malformed key exit 1 with one error line, and
    leave the records as they were."""
    client = dex.client()
    a = client.request_call("s1", "t1", "c1", "guarded_write", {})
    b = client.request_call("s1", "t1", "c2", "guarded_write", {})
    echo = client.request_call("s1", "t1", "c3", "echo", {})

    ok = cli("approve", a.key, "--by", "alice", "--note", "checked the order")
    assert ok.exit_code == EXIT_OK, ok.output
    assert ok.stdout.startswith(f"approved {a.key} by alice")
    approved = client.get_call(a.key)
    assert approved.status is CallStatus.PENDING
    assert approved.approval is not None
    assert (approved.approval.decided_by, approved.approval.note) == ("alice", "checked the order")

    ok = cli("reject", b.key, "--by", "carol", "--reason", "duplicate request")
    assert ok.exit_code == EXIT_OK, ok.output
    assert ok.stdout.startswith(f"rejected {b.key} by carol")
    rejected = client.get_call(b.key)
    assert rejected.status is CallStatus.REJECTED
    assert rejected.error == "rejected by carol: duplicate request"

    before = [client.get_call(k) for k in (a.key, b.key, echo.key)]
    history = client.get_agent_snapshot("s1").messages
    line = refused_line(cli("approve", a.key, "--by", "bob"))
    assert "already approved by alice" in line
    line = refused_line(cli("reject", a.key, "--by", "bob"))
    assert "already approved by alice" in line
    line = refused_line(cli("approve", b.key, "--by", "bob"))
    assert "already rejected by carol" in line
    line = refused_line(cli("approve", echo.key, "--by", "bob"))
    assert "never needed approval" in line
    line = refused_line(cli("approve", "s1/t1/nope", "--by", "bob"))
    assert "no tool call" in line
    line = refused_line(cli("reject", "not-a-key", "--by", "bob"))
    assert "session/turn/call" in line
    refused_line(cli("approve", a.key, "--by", " "))
    assert [client.get_call(k) for k in (a.key, b.key, echo.key)] == before
    assert client.get_agent_snapshot("s1").messages == history


def test_deciding_after_the_deadline_exits_1_and_rejects(dex: Dex, cli: Any) -> None:
    """S6.2, S6.3: `approve` after the deadline exits 1 saying the deadline passed; the call is
    `rejected` at once and leaves the list."""
    record = dex.client().request_call("s1", "t1", "c1", "guarded_write_short", {})
    deadline = record.approval_deadline or 0
    wait_for(lambda: time.time() > deadline + 0.05, timeout=10, what="the approval deadline")
    line = refused_line(cli("approve", record.key, "--by", "alice"))
    assert "deadline" in line and "passed" in line
    assert dex.client().get_call(record.key).status is CallStatus.REJECTED
    assert json.loads(cli("list", "--json").stdout) == []


def test_usage_errors_exit_2(dex: Dex, cli: Any) -> None:
    """`--by` is required and KEY must be given: click's usage errors exit 2, nothing changes."""
    record = dex.client().request_call("s1", "t1", "c1", "guarded_write", {})
    assert cli("approve", record.key).exit_code == EXIT_USAGE
    assert cli("reject", record.key).exit_code == EXIT_USAGE
    assert cli("approve", "--by", "alice").exit_code == EXIT_USAGE
    assert cli("frobnicate").exit_code == EXIT_USAGE
    assert dex.client().get_call(record.key).status is CallStatus.AWAITING_APPROVAL
