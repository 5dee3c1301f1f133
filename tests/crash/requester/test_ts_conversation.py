"""One conversation (S12.1) for the TypeScript agents over MCP, after a real SIGKILL.

For the Vercel AI SDK and Mastra (tests/js/, run under node), driven by a scripted model: the
customer asks for a refund; the `non_idempotent_write` starts on a real prefork worker, called
through `dex-celery mcp --transport http` with a token, and the worker (main process and pool
children) is SIGKILLed mid-call, so the call ends `outcome_unknown` and the model reads that text.
The reconcile beat job's pass sends the report to the session, and a second pass sends nothing.
The agent's next turn asks the prompt `dex-celery/session-messages` (docs/mcp.md, "Messages for
the agent") and hands the model the report once, before its reply; the turn after, from the
history saved with it, is not handed it again; a turn resumed from the history saved before it
(the report's turn lost) is handed it once. The tool's own log shows one run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from devtools.processes import Worker, wait_for
from dex_celery import OUTCOME_UNKNOWN_TOOL_RESULT, CallStatus, Dex, reconcile_once
from dex_celery.errors import UnknownSession
from tests.support.faults.crash import lines, wait_started
from tests.support.frameworks import checks
from tests.support.mcp.ts_agents import (
    FRAMEWORKS,
    MISSING,
    NODE,
    finish_turn,
    mcp_http,
    session_of,
    start_turn,
    tool_call,
    turn,
)

pytestmark = [pytest.mark.crash, pytest.mark.skipif(not NODE.exists(), reason=MISSING)]

TOOL = "slow_non_idempotent_write"
ARGUMENTS = {"seconds": 60, "value": {"order": 1002, "cents": 999}}
ASK = "Please refund 999 cents on order 1002."
FOLLOW_UP = "Did my refund go through?"
REPLY = "Yes: the order system says the refund went through."


def _calls(dex: Dex, session: str) -> list[str]:
    """The keys of the session's calls (none before the session begins)."""
    try:
        return [c.key for c in dex.client().get_agent_snapshot(session).tool_calls]
    except UnknownSession:
        return []


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_ts_agent_model_reads_the_reconciliation_report_once(
    framework: str,
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
    tmp_path: Path,
) -> None:
    dex.register_outcome_check(TOOL, checks.report_check)
    worker = start_worker()
    tool = f"dex_{TOOL}" if framework == "mastra" else TOOL
    session = session_of("desk")
    with mcp_http(env, "desk") as url:
        running = start_turn(
            framework, url, tmp_path, "t1", ASK,
            [tool_call(tool, ARGUMENTS, "call_refund"), "I could not confirm the refund."],
        )  # fmt: skip
        wait_for(lambda: bool(_calls(dex, session)), timeout=60, what="the call's record")
        (key,) = _calls(dex, session)
        wait_started(key)
        worker.kill_all()
        first = finish_turn(*running)
        # The model read the record's TOOL message: outcome unknown, do not call again.
        assert dex.client().get_call(key).status is CallStatus.OUTCOME_UNKNOWN
        assert OUTCOME_UNKNOWN_TOOL_RESULT[:60] in first.tool_results()[0]

        checks.reconcile_reports(dex, key)  # one report; a second pass sends nothing

        second = turn(framework, url, tmp_path, "t2", FOLLOW_UP, [REPLY], first.history)
        assert len(second.seen) == 1  # one model request: the reply, no call
        assert len(checks.reports(second.user_texts())) == 1
        assert second.user_texts()[0] == ASK
        assert second.user_texts()[-2:][0] == FOLLOW_UP
        assert checks.reports([second.user_texts()[-1]])  # the report, then the reply
        saved = [(m["role"], str(m["content"])) for m in second.messages()]
        at_report = next(i for i, m in enumerate(saved) if m[1].startswith(checks.REPORT))
        at_reply = next(i for i, m in enumerate(saved) if m[0] == "assistant" and REPLY in m[1])
        assert at_report < at_reply

        # The turn after, from the history saved with the report: not handed it again.
        third = turn(
            framework, url, tmp_path, "t3", "Thanks.", ["You are welcome."], second.history
        )
        assert len(checks.reports(third.user_texts())) == 1
        assert third.user_texts()[-1] == "Thanks."
        # A turn resumed from the history saved before it (that turn was lost): handed it once.
        again = turn(framework, url, tmp_path, "t4", FOLLOW_UP, [REPLY], first.history)
        assert len(checks.reports(again.user_texts())) == 1

    assert reconcile_once(dex).reported == 0
    assert _calls(dex, session) == [key]
    assert len(lines(key, "start")) == 1  # the tool's own log: one run
