"""One conversation (S12.1) in CrewAI, after a real SIGKILL: a customer's task asks for a
refund; the write starts on a real prefork worker, which is SIGKILLed mid-call, so the call ends
`outcome_unknown` and the model reads that text. The reconcile beat job's pass sends the report
to the session; the crew's next run of the task hands the model the report once (asserted on
what the scripted model was sent), the model answers without calling the tool again, and the
tool's own log shows one run. The task's conversation was copied into the dex session before
the call was requested."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from tests.support.crewai_skip import require_crewai

require_crewai()

from devtools.processes import Worker  # noqa: E402
from dex_celery import CallStatus, Dex, reconcile_once  # noqa: E402
from dex_celery.model.records import MessageRole  # noqa: E402
from dex_celery.testing.models.crewai import ScriptedLLM, tool_call  # noqa: E402
from tests.support import framework_checks as checks  # noqa: E402
from tests.support.crash import lines  # noqa: E402
from tests.support.crewai_crew import crew, session  # noqa: E402

pytestmark = pytest.mark.crash

TOOL = "slow_non_idempotent_write"
ARGUMENTS = {"seconds": 60, "value": {"order": 1002, "cents": 999}}
ASK = "Please refund 999 cents on order 1002."
REPORT = "Note from the order system: the refund of 999 cents on order 1002 went through."


def _check(key: str, arguments_json: str) -> str:
    return REPORT


def test_crewai_model_reads_the_reconciliation_report_once(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    dex.register_outcome_check(TOOL, _check)
    worker = start_worker()
    model = ScriptedLLM(
        turns=[
            [tool_call(TOOL, ARGUMENTS, "call_refund")],
            "I could not confirm the refund; I will not try it again until it is checked.",
        ]
    )
    team = crew(dex, model, [TOOL], ASK)
    conv = session(team)
    key = f"{conv}/turn-1/call_refund"

    checks.killed_mid_call(worker, key, lambda: team.kickoff().raw)
    checks.assert_killed_write_read_unknown(dex, model.tool_results()["call_refund"], key)
    assert len(model.seen) == 2  # read the text, did not call again

    # Into dex: the task's conversation, copied before the call was requested.
    _calls, history = dex.store.snapshot(conv)
    mirrored = [m for m in history if m.mirrored]
    assert any(m.role is MessageRole.USER and ASK in (m.text or "") for m in mirrored)

    assert dex.client().get_call(key).status is CallStatus.OUTCOME_UNKNOWN
    assert reconcile_once(dex).reported_keys == (key,)
    assert reconcile_once(dex).reported == 0

    # Back to the model: the crew's next run of the task (the same crew and task ids).
    follow_up = ScriptedLLM(turns=["Yes: the order system says the refund went through."])
    for agent in team.agents:
        agent.llm = follow_up
    assert team.kickoff().raw.startswith("Yes")
    reports = [t for t in follow_up.user_texts(0) if t.startswith(REPORT)]
    assert len(reports) == 1  # the model read the report, once
    assert len(follow_up.seen) == 1  # and answered without calling the tool
    assert [c.key for c in dex.client().get_agent_snapshot(conv).tool_calls] == [key]
    assert len(lines(key, "start")) == 1
