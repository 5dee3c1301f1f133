"""A CrewAI crew whose tools run on real Celery workers through dex-celery, driven by the
scripted `ScriptedLLM` (no network): the model reads exactly the records' texts, a person's
decision is recorded with who decided, a killed worker gives the `outcome_unknown` text, and a
crew run again with the same ids gets the same record."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.support.frameworks.crewai_skip import require_crewai

require_crewai()

from crewai import Agent  # noqa: E402

from devtools.processes import Worker, wait_for  # noqa: E402
from dex_celery import CallStatus, Dex  # noqa: E402
from dex_celery.integrations.frameworks import calls as framework_calls  # noqa: E402
from dex_celery.integrations.frameworks.calls import (  # noqa: E402
    CHANGED_ARGUMENTS_REASON,
    CallProgress,
)
from dex_celery.integrations.frameworks.crewai import dex_crewai_tools  # noqa: E402
from dex_celery.testing.models.crewai import ScriptedLLM, tool_call  # noqa: E402
from tests.support.faults.crash import lines, tool_messages  # noqa: E402
from tests.support.frameworks import checks as checks  # noqa: E402
from tests.support.frameworks.crewai_crew import (  # noqa: E402
    checkpointed,
    crew,
    desk_flow,
    key_of,
    resumed,
    session,
)


def test_read_and_idempotent_write_run_on_a_worker_and_the_model_reads_the_records(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    model = ScriptedLLM(
        turns=[
            [tool_call(*call) for call in checks.READ_AND_WRITE],
            "Both done.",
        ]
    )
    team = crew(dex, model, ["echo", "slow_idempotent_write"], "Look up order A and keep it.")
    assert team.kickoff().raw == "Both done."

    conv = session(team)
    read_key = key_of(dex, conv, "echo", "call_read")
    write_key = key_of(dex, conv, "slow_idempotent_write", "call_write")
    checks.assert_read_and_write_succeeded(dex, model.tool_results(), read_key, write_key)


def test_a_person_decides_through_decide_and_the_decision_is_recorded(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """`decide` answers at once, as CrewAI's `request_human_input` would: the approved call runs
    with who approved it; the rejected one is recorded `rejected` and the model reads why; an
    edited approval is refused."""
    start_worker()
    model = ScriptedLLM(
        turns=[
            [
                tool_call("guarded_write", {"value": "yes"}, "call_ok"),
                tool_call("guarded_write", {"value": "no"}, "call_no"),
                tool_call("guarded_write", {"value": "asked"}, "call_edit"),
            ],
            "One sent, two refused.",
        ]
    )
    shown: list[dict[str, Any]] = []

    def decide(request: dict[str, Any]) -> Any:
        shown.append(request)
        value = request["arguments"]["value"]
        if value == "yes":
            return {"approved": True, "decided_by": "alice"}
        if value == "no":
            return {"approved": False, "reason": "not this one"}
        return {"approved": True, "decided_by": "carol", "args": {"value": "edited"}}

    team = crew(dex, model, ["guarded_write"], "Send all.", approver="desk-bot", decide=decide)
    assert team.kickoff().raw == "One sent, two refused."

    conv = session(team)
    calls = ("call_ok", "call_no", "call_edit")
    ok_key, no_key, edit_key = (key_of(dex, conv, "guarded_write", c) for c in calls)
    assert sorted(r["dex_key"] for r in shown) == sorted([ok_key, no_key, edit_key])
    outputs = model.tool_results()
    checks.assert_one_approved_one_rejected(
        dex, outputs, ok_key, no_key, approved_by="alice", rejected_by="desk-bot"
    )
    edit = dex.client().get_call(edit_key)
    assert edit.status is CallStatus.REJECTED and CHANGED_ARGUMENTS_REASON in (edit.error or "")
    assert json.loads(edit.arguments) == {"value": "asked"}
    assert tool_messages(dex, edit_key) == [outputs["call_edit"]]
    assert lines(edit_key, "start") == []


def test_a_waiting_call_is_decided_in_dex_and_the_resumed_crew_reads_the_decision(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event, tmp_path: Path
) -> None:
    """Without `decide`, the model reads that the call waits for a person and has not run. A
    person approves one call and rejects another in dex; the crew restored from its checkpoint
    runs the task again, the model makes the same calls, and reads the result and the
    rejection; a third call whose deadline passed (the sweeper ends it `rejected`) reads the
    expiry."""
    start_worker()
    names = ["guarded_write", "guarded_write_short"]
    script = [
        [
            tool_call("guarded_write", {"value": "yes"}, "call_ok"),
            tool_call("guarded_write", {"value": "no"}, "call_no"),
            tool_call("guarded_write_short", {"value": "late"}, "call_late"),
        ],
        "Done.",
    ]
    model = ScriptedLLM(turns=script)
    team = checkpointed(crew(dex, model, names, "Send them."), tmp_path / "checkpoints")
    team.kickoff()
    conv = session(team)
    ok_key, no_key = (key_of(dex, conv, "guarded_write", c) for c in ("call_ok", "call_no"))
    late_key = key_of(dex, conv, "guarded_write_short", "call_late")
    first = model.tool_results()
    for key, call in ((ok_key, "call_ok"), (no_key, "call_no"), (late_key, "call_late")):
        assert dex.client().get_call(key).status is CallStatus.AWAITING_APPROVAL
        assert first[call].startswith(f"The call {key} is waiting for a person's approval")

    dex.client().approve(ok_key, "alice")
    dex.client().reject(no_key, "bob", "not this one")
    wait_for(
        lambda: dex.client().get_call(late_key).status is CallStatus.REJECTED,
        timeout=30,
        what="the sweeper to end the call whose approval deadline passed",
    )

    again = ScriptedLLM(turns=script)
    assert resumed(dex, tmp_path / "checkpoints", again, names).kickoff().raw == "Done."
    outputs = again.tool_results()
    assert outputs["call_ok"] == '"yes"' == tool_messages(dex, ok_key)[0]
    assert outputs["call_no"].startswith("The call was rejected and did not run")
    assert "not this one" in outputs["call_no"]
    late = dex.client().get_call(late_key)
    assert late.status is CallStatus.REJECTED and "approval deadline passed" in (late.error or "")
    assert outputs["call_late"] == tool_messages(dex, late_key)[0]
    assert len(lines(ok_key, "start")) == 1
    assert lines(no_key, "start") == [] and lines(late_key, "start") == []


def test_killed_worker_gives_the_model_the_outcome_unknown_text(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    worker = start_worker()
    model = ScriptedLLM(
        turns=[
            [tool_call("slow_non_idempotent_write", {"seconds": 60}, "call_kill")],
            "I will check it.",
        ]
    )
    team = crew(dex, model, ["slow_non_idempotent_write"], "Send it.")
    named = partial(key_of, dex, session(team), "slow_non_idempotent_write", "call_kill")
    assert checks.killed_mid_call(worker, named, lambda: team.kickoff().raw) == "I will check it."
    key = named()
    checks.assert_killed_write_read_unknown(dex, model.tool_results()["call_kill"], key)
    assert len(model.seen) == 2  # the model read the text and did not call again


def test_a_crew_resumed_from_its_checkpoint_gets_the_same_record(
    dex: Dex, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    """CrewAI restores a crew with its own ids; the task runs again, the model makes the same
    call, and dex answers it from the record: the write ran once."""
    start_worker()
    script = [
        [tool_call("slow_non_idempotent_write", {"seconds": 0, "value": "once"}, "call_w")],
        "Done.",
    ]
    model = ScriptedLLM(turns=script)
    names = ["slow_non_idempotent_write"]
    team = checkpointed(crew(dex, model, names, "Send it."), tmp_path / "checkpoints")
    team.kickoff()
    key = key_of(dex, session(team), "slow_non_idempotent_write", "call_w")
    assert dex.client().get_call(key).status is CallStatus.SUCCEEDED

    again = ScriptedLLM(turns=script)
    restored = resumed(dex, tmp_path / "checkpoints", again, names)
    assert session(restored) == session(team)
    assert restored.kickoff().raw == "Done."
    assert again.tool_results()["call_w"] == '"once"' == tool_messages(dex, key)[0]
    assert len(lines(key, "start")) == 1  # the write ran once
    assert [r.key for r in dex.client().get_agent_snapshot(session(team)).tool_calls] == [key]


def test_a_long_call_reports_progress_under_the_session_it_was_given(
    dex: Dex, start_worker: Callable[..., Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`progress=` gets the waiting call's reports (S12.1: long calls are not silent), keyed
    under `session_id=` rather than the crew's ids."""
    monkeypatch.setattr(framework_calls, "PROGRESS_EVERY", 0.3)
    start_worker()
    seen: list[CallProgress] = []
    read = ("slow_read", {"seconds": 2, "value": "found"}, "call_long")
    model = ScriptedLLM(turns=[[tool_call(*read)], "Found it."])
    team = crew(
        dex, model, ["slow_read"], "Look it up.", session_id="crew-long", progress=seen.append
    )
    assert team.kickoff().raw == "Found it."
    assert seen and {p.key for p in seen} == {key_of(dex, "crew-long", "slow_read", "call_long")}
    assert all(p.timeout == 300.0 and p.tool == "slow_read" for p in seen)
    assert model.tool_results()["call_long"] == '"found"'


def test_an_agent_in_a_flow_keys_its_calls_by_the_flow_id_and_a_rerun_gets_the_same_record(
    dex: Dex, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    """An agent run on its own in a flow step (`Agent.kickoff`): the session is the flow's id;
    the flow kicked off again with that id (CrewAI's `inputs={"id": ...}`) makes the same call
    and gets the same record, so the write ran once."""
    start_worker()
    script = [
        [tool_call("slow_non_idempotent_write", {"seconds": 0, "value": "once"}, "call_w")],
        "Done.",
    ]
    agent = Agent(
        role="order desk",
        goal="answer the customer",
        backstory="You run the order desk's tools.",
        llm=ScriptedLLM(turns=script),
        tools=dex_crewai_tools(dex, ["slow_non_idempotent_write"]),
    )
    flow = desk_flow(agent, "Send it.", tmp_path / "flows.db")
    assert flow.kickoff() == "Done."
    flow_id = flow.state["id"]
    key = key_of(dex, flow_id, "slow_non_idempotent_write", "call_w")
    assert dex.client().get_call(key).status is CallStatus.SUCCEEDED

    again = ScriptedLLM(turns=script)
    agent.llm = again
    rerun = desk_flow(agent, "Send it.", tmp_path / "flows.db")
    assert rerun.kickoff(inputs={"id": flow_id}) == "Done."
    assert rerun.state["id"] == flow_id
    assert again.tool_results()["call_w"] == '"once"' == tool_messages(dex, key)[0]
    assert len(lines(key, "start")) == 1
    assert [r.key for r in dex.client().get_agent_snapshot(flow_id).tool_calls] == [key]
