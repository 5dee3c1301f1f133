"""One conversation (S12.1) in CrewAI, after a real SIGKILL, with one `Crew.kickoff()` per user
turn (the task's description is `{question}`, each kickoff a new task conversation).

The first kickoff asks for a refund; the write starts on a real prefork worker, which is
SIGKILLed mid-call, so the call ends `outcome_unknown` and the model reads that text. The
reconcile beat job's pass sends the report to the session (a second pass sends nothing). The
next kickoff hands the model the report once, before the model's reply to it, and the kickoff
after does not see it; the tool's own log shows one run. Each kickoff's calls have turn ids of
their own, even where the model reuses a call id. Both with `session_id=` and without it (the
session is then the crew's task, `<crew id>.<task id>`, for every kickoff of that crew object).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.frameworks.crewai_skip import require_crewai

require_crewai()

from devtools.processes import Worker  # noqa: E402
from dex_celery import CallStatus, Dex  # noqa: E402
from dex_celery.model.ids import CallKey  # noqa: E402
from dex_celery.model.records import MessageRole  # noqa: E402
from dex_celery.testing.models.crewai import ScriptedLLM, tool_call  # noqa: E402
from tests.support.faults.crash import lines  # noqa: E402
from tests.support.frameworks import checks as checks  # noqa: E402
from tests.support.frameworks.crewai_crew import checkpointed, crew, key_of, resumed, session  # noqa: E402

pytestmark = pytest.mark.crash

TOOL = "slow_non_idempotent_write"
ARGUMENTS = {"seconds": 60, "value": {"order": 1002, "cents": 999}}
ASK = "Please refund 999 cents on order 1002."
FOLLOW_UP = "Did my refund go through?"
THANKS = "Thanks, that is all."
YES = "Yes: the order system says the refund went through."
#: A CrewAI turn id: the kickoff's run, then the model response's number within it.
TURN = re.compile(r"run-[0-9a-f]{12}\.turn-[0-9]+")


@pytest.mark.parametrize("session_id", ["crew-1", None])
def test_a_report_reaches_the_next_kickoff_once_before_the_reply_and_not_the_one_after(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event, session_id: str | None
) -> None:
    dex.register_outcome_check(TOOL, checks.report_check)
    worker = start_worker()
    model = ScriptedLLM(
        scripts={
            ASK: [
                [tool_call(TOOL, ARGUMENTS, "call_1")],
                "I could not confirm the refund; I will not try it again until it is checked.",
            ],
            # The same call id as the first kickoff's: a call of its own all the same.
            FOLLOW_UP: [[tool_call("echo", {"query": "order 1002"}, "call_1")], YES],
            THANKS: ["You are welcome."],
        }
    )
    team = crew(dex, model, [TOOL, "echo"], "{question}", session_id=session_id)
    conv = session_id or session(team)

    def kickoff(question: str) -> str:
        return str(team.kickoff(inputs={"question": question}).raw)

    checks.killed_mid_call(worker, lambda: key_of(dex, conv, TOOL, "call_1"), lambda: kickoff(ASK))
    key = key_of(dex, conv, TOOL, "call_1")
    checks.assert_killed_write_read_unknown(dex, model.tool_results(1)["call_1"], key)

    # Into dex: the task's conversation, copied before the call was requested.
    _calls, history = dex.store.snapshot(conv)
    assert any(m.role is MessageRole.USER and ASK in (m.text or "") for m in history if m.mirrored)
    checks.reconcile_reports(dex, key)

    start_worker()  # the next kickoff's read runs on a worker that lives
    assert kickoff(FOLLOW_UP) == YES
    assert kickoff(THANKS) == "You are welcome."

    # The report: in the next kickoff's model input, once, before the reply to it; then never.
    asked = model.requests_of(FOLLOW_UP)
    assert len(checks.reports(model.user_texts(asked[0]))) == 1
    assert len(checks.reports(model.user_texts(asked[-1]))) == 1
    others = model.requests_of(ASK) + model.requests_of(THANKS)
    assert others and not any(checks.reports(model.user_texts(i)) for i in others)

    # Each kickoff has its own turn ids: the reused call id is a second call, with its own record.
    echo = key_of(dex, conv, "echo", "call_1")
    turns = {CallKey.parse(k).turn_id for k in (key, echo)}
    assert len(turns) == 2 and all(TURN.fullmatch(t) for t in turns), turns
    assert dex.client().get_call(echo).status is CallStatus.SUCCEEDED
    assert json.loads(model.tool_results(asked[-1])["call_1"])["key"] == echo
    assert [c.key for c in dex.client().get_agent_snapshot(conv).tool_calls] == [key, echo]
    assert len(lines(key, "start")) == 1


def test_a_message_reaches_only_the_kickoff_that_took_it_and_that_kickoff_resumed(
    dex: Dex, tmp_path: Path
) -> None:
    """S12.1.1, with a new `Crew` per user turn and one `session_id`: a message sent between
    kickoffs is taken by the next one; the kickoff after is not handed it; the kickoff that took
    it, restored from its checkpoint (the same CrewAI kickoff id, its task run again from its
    start), is handed it once more."""
    note = "A note from the order system for the next run."
    model = ScriptedLLM(turns=["Noted."])

    def turn(question: str, folder: Path | None = None) -> None:
        team = crew(dex, model, ["echo"], question, session_id="crew-2")
        (checkpointed(team, folder) if folder else team).kickoff()

    def notes(sent: ScriptedLLM, question: str) -> list[list[str]]:
        return [[t for t in sent.user_texts(i) if t == note] for i in sent.requests_of(question)]

    turn("First question.")
    dex.client().send_user_message("crew-2", note)
    turn("Second question.", tmp_path / "checkpoints")
    turn("Third question.")
    assert notes(model, "First question.") == [[]]
    assert notes(model, "Second question.") == [[note]]
    assert notes(model, "Third question.") == [[]]

    again = ScriptedLLM(turns=["Noted."])
    resumed(dex, tmp_path / "checkpoints", again, ["echo"], session_id="crew-2").kickoff()
    assert notes(again, "Second question.") == [[note]]
