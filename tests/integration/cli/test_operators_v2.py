"""What an operator reads (issue 24): read-only commands never create a database, long values
are cut with a way to see them whole, each attempt's text is about that attempt, a running
attempt shows as running, counts are of attempts started, and the web pages show JSON as JSON,
the approvals page gives what a person needs to decide, and banners agree with the record.

Real redis-server, real SQLite, real prefork workers where an attempt must run; the CLI in-process
through click's runner, and as the installed script where files must not appear.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from starlette.testclient import TestClient

from devtools.processes import RedisServer, Worker, wait_for
from dex_celery import Dex, EffectClass, Settings, ToolContext, ToolPolicy
from dex_celery.engine.decided_outcomes import outcome_of
from dex_celery.ledger.ledger import Step, StepKind
from dex_celery.model.records import MessageRole
from dex_celery.web.app import WebApp
from dex_celery.web.auth import Credentials

BIG = 900_000
#: `ops.present.VALUE_LIMIT`: how much of one value is shown before it is cut.
VALUE_LIMIT = 2000


# --- read-only commands ----------------------------------------------------------------------

READ_ONLY = (
    ("status",),
    ("status", "--json"),
    ("calls", "list"),
    ("calls", "list", "--json"),
    ("calls", "show", "s/t/c"),
    ("approvals", "list"),
    ("webhooks", "status"),
)


@pytest.mark.parametrize("command", READ_ONLY, ids=" ".join)
def test_read_only_commands_never_create_a_database(
    command: tuple[str, ...], redis_server: RedisServer, tmp_path: Path
) -> None:
    """`dex-celery -A shop status` in an empty folder with no DEX_DATABASE_URL left an empty
    `dex-celery.db` behind: no read-only command creates a file, and those that need the
    database say in one `error:` line that none is configured."""
    project, here = tmp_path / "project", tmp_path / "empty"
    project.mkdir()
    here.mkdir()
    (project / "shop.py").write_text(
        "from celery import Celery\nfrom dex_celery import Dex\n"
        "app = Celery('shop')\ndex = Dex(app)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEX_")}
    env.update(DEX_REDIS_URL=redis_server.url, PYTHONPATH=str(project), DEX_KEY_PREFIX="ro")
    script = Path(sys.executable).parent / "dex-celery"
    done = subprocess.run(
        [str(script), "-A", "shop", *command],
        cwd=here, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert list(here.iterdir()) == [], (command, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    if command[0] in ("calls", "approvals"):
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: no database configured"), lines
    if command[0] == "status":
        assert done.returncode == 1
        assert "no database configured" in done.stdout


# --- long values ---------------------------------------------------------------------------


def test_calls_show_cuts_long_values_and_full_shows_them(
    cli: Callable[..., Result], dex: Dex
) -> None:
    """`calls show` of a call with large arguments printed 900,000 characters: values are cut
    with a marker saying how much, and `--full` shows them whole (text and JSON)."""
    big = "x" * BIG
    key = dex.client().request_call("s1", "t1", "c1", "echo", {"note": big}).key

    text = cli("calls", "show", key).output
    assert len(text) < 4 * VALUE_LIMIT + 4000, len(text)
    assert f"[cut: {BIG - VALUE_LIMIT:,} more characters]" in text
    assert f"calls show {key} --full" in text and "dex-celery -A " in text

    shown = json.loads(cli("calls", "show", key, "--json").output)
    assert shown["cut"] is True
    assert len(shown["arguments"]["note"]) < VALUE_LIMIT + 100

    whole = json.loads(cli("calls", "show", key, "--json", "--full").output)
    assert whole["cut"] is False and whole["arguments"]["note"] == big
    assert big in cli("calls", "show", key, "--full").output


# --- attempts ------------------------------------------------------------------------------


def test_a_running_attempt_shows_as_running_with_its_worker_and_claim_time(
    cli: Callable[..., Result], dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """While an attempt ran, `calls show` listed it with claimed `-` and `--json` said
    `"attempts": 0`: it is `running`, with the worker and the claim time, and counted."""
    start_worker()
    key = dex.client().request_call("s1", "t1", "c1", "slow_read", {"seconds": 30}).key

    def running() -> bool:
        entry = dex.ledger.read(key)
        return entry is not None and entry.state == "running"

    wait_for(running, timeout=60, what="the attempt runs")
    shown = json.loads(cli("calls", "show", key, "--json").output)
    assert shown["status"] == "pending" and shown["attempts"] == 1
    (attempt,) = shown["attempt_log"]
    assert attempt["state"] == "running" and attempt["claimed_at"] is not None
    assert attempt["node"] and "@" in attempt["node"] and attempt["pid"]
    assert attempt["error"] is None and attempt["ended_at"] is None
    row = next(
        line for line in cli("calls", "show", key).output.splitlines() if " running " in line
    )
    assert attempt["owner"] in row and " UTC" in row.split(attempt["owner"], 1)[1]

    (listed,) = json.loads(cli("calls", "list", "--json").output)
    assert listed["attempts"] == 1
    table = cli("calls", "list").output.splitlines()[2].split()
    assert table[3:5] == ["pending", "1"], table


def test_a_call_waiting_for_its_second_attempt_counts_the_first(
    cli: Callable[..., Result], dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """A call in its second attempt showed `pending 0`: once attempt 1 ran, it is counted,
    and attempt 2 waiting in its backoff is not counted as started."""
    start_worker()
    key = dex.client().request_call("s1", "t1", "c1", "flaky_read_backoff", {"fail_times": 1}).key

    def second() -> bool:
        entry = dex.ledger.read(key)
        return entry is not None and entry.attempt == 2 and entry.state == "enqueued"

    wait_for(second, timeout=60, what="attempt 2 waits in its backoff", interval=0.02)
    shown = json.loads(cli("calls", "show", key, "--json").output)
    if shown["status"] == "pending" and shown["attempt_log"][-1]["state"] == "enqueued":
        assert shown["attempts"] == 1
        assert shown["attempt_log"][0]["state"] == "failed"
    (final,) = dex.client().wait([key], timeout=60)
    assert json.loads(cli("calls", "show", key, "--json").output)["attempts"] == final.attempts


def test_each_attempt_text_is_about_that_attempt_only() -> None:
    """A call whose attempt 1 was lost after its tool started and whose attempt 2 never reached
    a worker read "lost after the tool started (no worker claimed it before its
    schedule-to-start deadline)": the call's error now says which attempt did what."""
    log = json.dumps(
        [
            {"attempt": 1, "state": "lost", "owner": "w@h:1", "claimed_at": 1.0,
             "ended_at": 2.0, "error": "its heartbeat lease lapsed"},
            {"attempt": 2, "state": "expired", "owner": "", "claimed_at": None,
             "ended_at": 9.0, "error": "no worker claimed it before its schedule-to-start deadline"},
        ]
    )  # fmt: skip
    for status in ("outcome_unknown", "failed"):
        step = Step(StepKind.FINISHED, attempt=2, status=status, reason="lost", log=log,
                    detail="no worker claimed it before its schedule-to-start deadline")  # fmt: skip
        error = outcome_of(step, None).error
        assert "lost after the tool started (no worker" not in error, error
        assert error.startswith("attempt 2 never reached a worker (no worker claimed it"), error
        assert "an earlier attempt was lost once its tool had started" in error
    lost = Step(StepKind.FINISHED, attempt=1, status="outcome_unknown", reason="lost",
                log=log[: log.index("}") + 1] + "]", detail="its heartbeat lease lapsed")  # fmt: skip
    assert outcome_of(lost, None).error.startswith(
        "the attempt was lost after the tool started (its heartbeat lease lapsed)"
    )


def test_attempt_rows_carry_their_own_text(
    cli: Callable[..., Result], dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """A retried read: the failed attempt says the tool failed, the succeeded one says
    nothing; neither carries the other's text or the call's."""
    start_worker()
    key = dex.client().request_call("s1", "t1", "c1", "flaky_read", {"fail_times": 1}).key
    dex.client().wait([key], timeout=60)
    shown = json.loads(cli("calls", "show", key, "--json").output)
    first, second = shown["attempt_log"]
    assert first["state"] == "failed" and first["error"]
    assert second["state"] == "succeeded" and second["error"] is None


# --- the web pages -------------------------------------------------------------------------

CREDENTIALS = Credentials.from_settings(Settings(web_users="alice:pw-a"))


@pytest.fixture
def web(dex: Dex) -> TestClient:
    def refund(ctx: ToolContext, order: str = "", card: str = "") -> Any:
        """Refund an order to the card it was paid with."""
        return "refunded"

    policy = ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, secret_arguments=("card",))
    dex.tool("refund", policy=policy)(refund)
    client = TestClient(
        WebApp(dex, CREDENTIALS).build(), base_url="http://localhost", follow_redirects=False
    )
    response = client.post("/login", data={"name": "alice", "password": "pw-a", "next": "/"})
    assert response.status_code == 303
    return client


def _csrf(client: TestClient, path: str = "/approvals") -> str:
    return client.get(path).text.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def test_web_shows_arguments_and_policy_as_formatted_json(web: TestClient, dex: Dex) -> None:
    """Arguments wrapped mid-token (`"**` / `*"`) and the policy read `True`, `['card']`."""
    client = dex.client()
    client.open_session("s1")
    key = client.request_call("s1", "t1", "c1", "refund", {"order": "1002", "card": "4111"}).key
    page = web.get(f"/calls/{key}").text
    assert '<pre id="arguments">{\n  &#34;card&#34;: &#34;***&#34;,' in page
    assert "<code>true</code>" in page and "<code>[&#34;card&#34;]</code>" in page
    assert "True" not in page.split('id="policy"', 1)[1].split("</dl>", 1)[0]
    assert "['card']" not in page
    assert "break-all" not in web.get("/static/dex.css").text


def test_web_call_page_cuts_long_values_with_a_link_to_all(web: TestClient, dex: Dex) -> None:
    key = dex.client().request_call("s1", "t1", "c1", "echo", {"note": "y" * BIG}).key
    page = web.get(f"/calls/{key}").text
    assert len(page) < 4 * VALUE_LIMIT + 20_000
    assert f"[cut: {BIG - VALUE_LIMIT:,} more characters]" in page
    assert 'id="full-link" href="?full=1"' in page
    assert "y" * BIG in web.get(f"/calls/{key}?full=1").text


def test_approvals_page_gives_what_a_person_needs_to_decide(web: TestClient, dex: Dex) -> None:
    """The tool's description, what its effect class means, and the session's last user and
    assistant messages before the call."""
    client = dex.client()
    client.open_session("s1")
    client.add_message("s1", MessageRole.USER, "Please refund order 1002, it arrived broken.")
    client.add_message("s1", MessageRole.ASSISTANT, "I will refund order 1002 to your card.")
    client.request_call("s1", "t1", "c1", "refund", {"order": "1002", "card": "4111"})
    client.add_message("s1", MessageRole.USER, "a later message, not the context of the call")
    page = web.get("/approvals").text
    assert "Refund an order to the card it was paid with." in page
    assert "runs at most once" in page
    assert "Please refund order 1002, it arrived broken." in page
    assert "I will refund order 1002 to your card." in page
    assert "a later message" not in page
    assert "4111" not in page


def test_the_banner_after_a_decision_agrees_with_the_record(
    web: TestClient, dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """After approving, the banner said "it is now pending" beside a "succeeded" badge."""
    start_worker()
    client = dex.client()
    key = client.request_call("s1", "t1", "c1", "guarded_write", {"value": 1}).key
    form = {"key": key, "action": "approve", "csrf": _csrf(web), "note": ""}
    response = web.post("/approvals/decide", data=form)
    assert response.status_code == 303
    client.wait([key], timeout=60)
    page = web.get(response.headers["location"]).text
    banner = page.split('id="flash">', 1)[1].split("</div>", 1)[0]
    badge = page.split('id="status" class="status ', 1)[1].split('"', 1)[0]
    assert badge == "succeeded"
    assert banner == "approved by alice; the call is now succeeded", banner
