"""The session page (S13.6) in a real browser (Debian's chromium, headless, via Selenium) against
a real `dex-celery web` process, for a session made by a real prefork worker: a succeeded read,
an approved write, a write approved with edited arguments (S13.3.3), an expired approval, a
write held by a write freeze until the thaw let it run (S13.2), and a write drawing on a write
budget (S13.1) whose worker was SIGKILLed, ended `outcome_unknown` (its charge held) and was
reconciled as gone through (spent) (`tests/support/apps/session_story.py`).

A person goes from a call's page to its session and reads the story in time order; while a call
of the session is open the page refreshes itself until it ends. The route keeps every rule of
the other pages: sign-in or a token with `calls:read`, the `Host` check, a 404 for a session
that is not there. Set `DEX_WEB_SCREENSHOTS=docs/web` to refresh docs/web/session.png.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from devtools.processes import Worker, wait_for
from dex_celery import CallStatus, Dex
from dex_celery.model.links import session_path
from tests.support.apps import session_story
from tests.support.web.web_process import WebServer, chromium, shot, texts

USERS = "alice:alice-password"
TOKENS = "reader:reader-token,agent:agent-token:tools:call"


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    """The story's write budget, for the test process, its workers and the web app alike."""
    return {**env, **session_story.STORY_ENV}


@pytest.fixture
def web(env: dict[str, str], dex: Dex, tmp_path: Path) -> Iterator[WebServer]:
    server = WebServer(
        {**env, "DEX_WEB_USERS": USERS, "DEX_WEB_TOKENS": TOKENS, "DEX_WEB_SECRET_KEY": "k"},
        tmp_path / "web.log",
    ).start()
    yield server
    server.stop()


def kinds(driver: Any, key: str) -> list[str]:
    rows = driver.find_elements("css selector", f'#timeline tr[data-key="{key}"]')
    return [r.get_attribute("data-kind") for r in rows]


def test_a_reconciled_session_reads_as_one_story_in_chromium(
    dex: Dex,
    web: WebServer,
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
) -> None:
    from selenium.webdriver.common.by import By  # deferred: selenium is a test-only dependency

    story = session_story.make_story(dex, start_worker)
    with chromium() as driver:
        d: Any = driver
        d.get(f"{web.url}/calls/{quote(story.unknown)}")
        d.find_element(By.ID, "name").send_keys("alice")
        d.find_element(By.ID, "password").send_keys("alice-password")
        d.find_element(By.ID, "sign-in").click()
        wait_for(lambda: texts(d, "status") == ["outcome_unknown"], timeout=10,
                 what="the unknown call's page")  # fmt: skip
        d.find_element(By.ID, "session-link").click()
        wait_for(lambda: d.find_elements(By.ID, "timeline"), timeout=10, what="the session page")
        assert d.find_element(By.ID, "session-id").text == session_story.SESSION
        assert not d.find_elements(By.ID, "live")  # nothing open: no refresh
        assert not d.find_elements(By.CSS_SELECTOR, 'meta[http-equiv="refresh"]')

        # In time order: the user's request, then the calls, the reconciled one last.
        rows = d.find_elements(By.CSS_SELECTOR, "#timeline tr[data-kind]")
        order = [r.get_attribute("data-kind") for r in rows]
        assert order[:3] == ["session_opened", "user", "assistant"]
        assert session_story.USER_TEXT in rows[1].text
        times = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#timeline td.at")]
        assert len(times) == len(rows) and all(t.endswith(" UTC") for t in times)
        unknown = kinds(d, story.unknown)
        # (Its TOOL message is written at its end or, by the sweeper, a little after it.)
        assert [k for k in unknown if k != "tool_result"] == session_story.UNKNOWN_KINDS, unknown
        assert order[-1] == "report" and session_story.REPORT in rows[-1].text
        # Its charge: reserved, held while unknown, spent once reconciled (S13.1.3).
        charge = d.find_elements(
            By.CSS_SELECTOR, f'#timeline tr[data-key="{story.unknown}"][data-kind^="budget"]'
        )
        said = [row.text for row in charge]
        assert len(said) == 3, said
        assert "reserved" in said[0] and "held until reconciled" in said[1], said
        assert "spent (reconciled: went_through)" in said[2], said
        assert "charged 1 to budget refunds" in charge[0].text and "limit 2" in charge[0].text

        # The edited approval: who, what changed, the arguments before and after (S13.3.3).
        edited = d.find_element(
            By.CSS_SELECTOR,
            f'#timeline tr[data-key="{story.edited}"][data-kind="approval_edited"]',
        )
        assert "arguments edited by alice when approving (changed: value)" in edited.text
        assert '{"value": 15} -> {"value": 5}' in edited.text
        assert kinds(d, story.edited)[:4] == [
            "call_requested",
            "approval_asked",
            "approval_decided",
            "approval_edited",
        ]

        # The write a freeze held at its claim, and the thaw that let it run (S13.2).
        assert kinds(d, story.frozen)[:4] == [
            "call_requested",
            "held_by_freeze",
            "released_by_thaw",
            "attempt_claimed",
        ]
        held = d.find_element(
            By.CSS_SELECTOR,
            f'#timeline tr[data-key="{story.frozen}"][data-kind="held_by_freeze"]',
        )
        assert "frozen by ann" in held.text and session_story.FREEZE_REASON in held.text
        thawed = d.find_element(
            By.CSS_SELECTOR,
            f'#timeline tr[data-key="{story.frozen}"][data-kind="released_by_thaw"]',
        )
        assert "thawed by bob" in thawed.text
        decided = d.find_element(
            By.CSS_SELECTOR,
            f'#timeline tr[data-key="{story.approved}"][data-kind="approval_decided"]',
        )
        assert "approved by alice" in decided.text and session_story.NOTE in decided.text
        expired = d.find_element(
            By.CSS_SELECTOR,
            f'#timeline tr[data-key="{story.expired}"][data-kind="approval_decided"]',
        )
        assert "expired" in expired.text
        assert session_story.SECRET not in d.page_source
        # The style sheet applies under the Content-Security-Policy.
        background = d.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(246, 247, 249)", background
        # The whole page in one picture (docs/operations.md shows it).
        height = d.execute_script("return document.documentElement.scrollHeight")
        d.set_window_size(1400, min(int(height) + 140, 4000))
        shot(d, "session")
        d.set_window_size(1400, 1000)

        # A call asked for now: the page says so and refreshes itself until it has ended.
        start_worker()
        waiting = dex.client().request_call(
            session_story.SESSION, "t4", "again", "guarded_write", {"value": 3}
        )
        d.refresh()
        wait_for(lambda: texts(d, "live"), timeout=10, what="the open call to be noticed")
        dex.client().approve(waiting.key, "alice", "second refund agreed")

        def shown_succeeded() -> bool:
            row = d.find_elements(By.CSS_SELECTOR, f'#session-calls tr[data-key="{waiting.key}"]')
            try:
                return bool(row) and "succeeded" in row[0].text and not texts(d, "live")
            except Exception:  # the page was replaced by its refresh under us: look again
                return False

        wait_for(shown_succeeded, timeout=30, what="the page to refresh to the call's end")
        assert dex.client().get_call(waiting.key).status is CallStatus.SUCCEEDED


def test_the_session_route_checks_the_caller_the_host_and_the_id(dex: Dex, web: WebServer) -> None:
    """S11.3 on the new route: sign-in or a token with `calls:read`; the `Host` check; a
    session that is not there, or an id no call could have, is a 404 page."""
    client = dex.client()
    client.open_session(session_story.SESSION)
    client.send_user_message(session_story.SESSION, "hello")
    path = session_path(session_story.SESSION)
    anonymous = httpx.get(f"{web.url}{path}", timeout=10)
    assert anonymous.status_code == 303 and anonymous.headers["location"].startswith("/login")
    assert "hello" not in anonymous.text

    def as_token(token: str, target: str = path, **headers: str) -> httpx.Response:
        return httpx.get(
            f"{web.url}{target}",
            headers={"Authorization": f"Bearer {token}", **headers},
            timeout=10,
        )

    page = as_token("reader-token")
    assert page.status_code == 200 and "hello" in page.text
    refused = as_token("agent-token")  # may call tools over MCP, not read the web app
    assert refused.status_code == 403 and "calls:read" in refused.text
    rebound = as_token("reader-token", Host=f"rebind.attacker.example:{web.port}")
    assert rebound.status_code in (400, 421) and "hello" not in rebound.text
    for target, says in (
        ("/sessions/no-such-session", "no session"),
        ("/sessions/bell%07id", "control characters"),
        ("/sessions/%20padded", "leading or trailing spaces"),
        ("/sessions/" + "x" * 201, "the limit is 200"),
    ):
        missing = as_token("reader-token", target)
        assert missing.status_code == 404 and says in missing.text, (target, missing.text[:300])
