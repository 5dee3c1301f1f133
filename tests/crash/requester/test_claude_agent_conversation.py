"""One conversation (S12.1) in the Claude Agent SDK, after a real SIGKILL: the Claude Agent SDK's
part of test_framework_conversation.py, driving the real `claude` CLI against the scripted
Messages API server (tests/support/frameworks/claude_agent.py).

A customer asks for a refund; the `non_idempotent_write` starts on a real prefork worker, which
is SIGKILLed (main process and pool children) mid-call, so the call ends `outcome_unknown` and
the model reads that text. The reconcile beat job's pass sends the report to the session; the
session's next prompt hands it to the model (the `UserPromptSubmit` hook's additional context)
exactly once, after the prompt and before the model's reply to it; the prompt after that is not
handed it again (the transcript holds it), and the tool's own log shows one run. A second
reconcile pass sends nothing; the session resumed from the transcript saved before the report
(a lost run) is handed it once.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from devtools.processes import Worker
from dex_celery import OUTCOME_UNKNOWN_TOOL_RESULT, Dex
from tests.support.faults.crash import lines
from tests.support.frameworks import checks
from tests.support.frameworks.checks import killed_mid_call
from tests.support.frameworks.claude_agent import Desk, claude_cli, final_text

pytestmark = pytest.mark.crash

pytest.importorskip("claude_agent_sdk")
claude_cli()  # skips the module, saying why, without Node.js

from dex_celery.integrations.frameworks.claude_agent import model_tool_name  # noqa: E402
from dex_celery.testing.models.claude_messages import ScriptedMessages, tool_use  # noqa: E402

TOOL = "slow_non_idempotent_write"
ARGUMENTS = {"seconds": 60, "value": {"order": 1002, "cents": 999}}
ASK = "Please refund 999 cents on order 1002."
FOLLOW_UP = "Did my refund go through?"
YES = "Yes: the order system says the refund went through."


def _transcript(home: Path, session: str) -> Path:
    (path,) = (home / ".claude" / "projects").glob(f"*/{session}.jsonl")
    return path


def test_claude_agent_model_reads_the_reconciliation_report_once(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event, tmp_path: Path
) -> None:
    dex.register_outcome_check(TOOL, checks.report_check)
    worker = start_worker()
    home = tmp_path / "home"
    with ScriptedMessages(
        [
            [tool_use(model_tool_name(TOOL), ARGUMENTS, "toolu_refund")],
            "I could not confirm the refund; I will not try it again until it is checked.",
            YES,
            "You are welcome.",
        ]
    ) as model:
        desk = Desk(dex, model, [TOOL], home, session_id="claude-refund")
        key = "claude-refund/turn-1/toolu_refund"

        killed_mid_call(worker, key, lambda: desk.ask(ASK))
        assert OUTCOME_UNKNOWN_TOOL_RESULT in model.tool_results()["toolu_refund"]
        assert desk.sdk_session is not None
        transcript = _transcript(home, desk.sdk_session)
        saved_before_report = transcript.read_bytes()
        checks.reconcile_reports(dex, key)  # reported once; a second pass sends nothing

        asked = len(model.requests)
        assert final_text(desk.ask(FOLLOW_UP)) == YES
        assert len(model.requests) == asked + 1  # one model input for the follow-up
        read = model.user_texts()
        (report,) = checks.reports(read)  # the next model input holds the report, once
        assert read[0] == ASK and read.index(FOLLOW_UP) < read.index(report)
        assert [c.key for c in dex.client().get_agent_snapshot("claude-refund").tool_calls] == [key]

        # The transcript keeps it: the next prompt is not handed it again, and reads it where
        # it was read, after the follow-up and before the reply to it.
        desk.ask("Thanks.")
        read = model.user_texts()
        assert checks.reports(read) == [report]
        assert read.index(FOLLOW_UP) < read.index(report) < read.index("Thanks.")
        texts = _texts(model.requests[-1])
        assert texts.index(report) < texts.index(YES) < texts.index("Thanks.")

        # Resumed from the transcript saved before the report (a lost run): handed it once.
        transcript.write_bytes(saved_before_report)
        desk.ask(FOLLOW_UP)
        assert len(checks.reports(model.user_texts())) == 1
    assert len(lines(key, "start")) == 1  # the tool's own log: one run
    shutil.rmtree(home, ignore_errors=True)


def _texts(request: dict[str, object]) -> list[str]:
    """Every text of a model input, in order, whoever's it is (the report without the CLI's
    introduction)."""
    from dex_celery.testing.models.claude_messages import HOOK_CONTEXT

    out = []
    for message in request.get("messages", []):  # type: ignore[attr-defined]
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for block in blocks:
            if block.get("type") == "text":
                out.append(str(block["text"]).removeprefix(HOOK_CONTEXT))
    return out
