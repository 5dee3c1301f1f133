"""A Google ADK agent whose tools run on real Celery workers through dex-celery, driven by the
scripted `ScriptedLlm` (no network): the model reads exactly the records' texts, approvals go
through ADK's own tool confirmation on a resumable `App`, a killed worker gives the
`outcome_unknown` text, and an invocation resumed from its saved events gets the same record."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from devtools.processes import Worker, wait_for
from dex_celery import CallStatus, Dex
from dex_celery.integrations.frameworks.calls import CHANGED_ARGUMENTS_REASON
from dex_celery.testing.models.google_adk import ScriptedLlm, tool_call
from tests.support.faults.crash import lines, tool_messages
from tests.support.frameworks import checks
from tests.support.frameworks.google_adk import Desk, confirmations, final_text


def test_read_and_idempotent_write_run_on_a_worker_and_the_model_reads_the_records(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    model = ScriptedLlm(
        turns=[
            [tool_call(*call) for call in checks.READ_AND_WRITE],
            "Both done.",
        ]
    )
    desk = Desk(dex, model, ["echo", "slow_idempotent_write"], "adk-read")
    assert final_text(desk.ask("Look up order A and keep it.")) == "Both done."

    read_key, write_key = "adk-read/turn-1/call_read", "adk-read/turn-1/call_write"
    outputs = model.tool_results()
    checks.assert_read_and_write_succeeded(dex, outputs, read_key, write_key)


def test_confirmed_and_declined_writes_are_recorded_with_who_decided(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    writes = [tool_call(*call) for call in checks.TWO_WRITES]
    model = ScriptedLlm(turns=[writes, checks.TWO_WRITES_ANSWER])
    desk = Desk(dex, model, ["guarded_write"], "adk-hitl", approver="desk-bot")
    asked = confirmations(desk.ask("Send both."))
    ok_key, no_key = "adk-hitl/turn-1/call_ok", "adk-hitl/turn-1/call_no"
    # The resumable app paused.
    checks.assert_both_wait(dex, asked, ok_key, no_key)
    assert len(model.seen) == 1  # the model was not asked again while a person decides

    desk.answer(asked["call_ok"][0], True, decided_by="alice")
    final = desk.answer(asked["call_no"][0], False, reason="not this one")

    assert final_text(final) == checks.TWO_WRITES_ANSWER
    outputs = model.tool_results()
    checks.assert_one_approved_one_rejected(
        dex, outputs, ok_key, no_key, approved_by="alice", rejected_by="desk-bot"
    )


def test_killed_worker_gives_the_model_the_outcome_unknown_text(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    worker = start_worker()
    model = ScriptedLlm(
        turns=[
            [tool_call("slow_non_idempotent_write", {"seconds": 60}, "call_kill")],
            "I will check it.",
        ]
    )
    desk = Desk(dex, model, ["slow_non_idempotent_write"], "adk-kill")
    key = "adk-kill/turn-1/call_kill"
    answer = checks.killed_mid_call(worker, key, lambda: final_text(desk.ask("Send it.")))

    assert answer == "I will check it."
    checks.assert_killed_write_read_unknown(dex, model.tool_results()["call_kill"], key)
    assert len(model.seen) == 2  # the model read the text and did not call again


def test_an_invocation_resumed_from_its_saved_events_gets_the_same_record(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """The saved events are cut right after the model's function call, as if the process died
    before the tool's response was kept; a new runner resumes that invocation from them."""
    start_worker()
    model = ScriptedLlm(
        turns=[
            [tool_call("slow_non_idempotent_write", {"seconds": 0, "value": "once"}, "call_w")],
            "Done.",
        ]
    )
    first = Desk(dex, model, ["slow_non_idempotent_write"], "adk-resume")
    first.ask("Send it.")
    key = "adk-resume/turn-1/call_w"
    assert dex.client().get_call(key).status is CallStatus.SUCCEEDED

    events = first.events()
    cut = next(i for i, e in enumerate(events) if e.get_function_calls()) + 1
    resumed = Desk(dex, model, ["slow_non_idempotent_write"], "adk-resume")
    resumed.restore(events[:cut])
    assert final_text(resumed.resume(events[cut - 1].invocation_id)) == "Done."

    assert model.tool_results()["call_w"] == '"once"' == tool_messages(dex, key)[0]
    assert len(lines(key, "start")) == 1  # the write ran once
    assert [r.key for r in dex.client().get_agent_snapshot("adk-resume").tool_calls] == [key]


def test_an_expired_approval_and_an_edited_one_are_read_as_rejections(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """A confirmation arriving after the call's approval deadline runs nothing: the model reads
    the record's expiry. A confirmation with other `args` is refused (the approval is of the
    arguments asked for), recorded `rejected` by who decided, and runs nothing."""
    start_worker()
    model = ScriptedLlm(
        turns=[
            [
                tool_call("guarded_write_short", {"value": "late"}, "call_late"),
                tool_call("guarded_write", {"value": "asked"}, "call_edit"),
            ],
            "Nothing was sent.",
        ]
    )
    desk = Desk(dex, model, ["guarded_write_short", "guarded_write"], "adk-late")
    asked = confirmations(desk.ask("Send both."))
    late_key, edit_key = "adk-late/turn-1/call_late", "adk-late/turn-1/call_edit"
    deadline = dex.client().get_call(late_key).approval_deadline or 0
    wait_for(lambda: time.time() > deadline + 0.05, timeout=10, what="the approval deadline")

    desk.answer(asked["call_late"][0], True, decided_by="alice")
    desk.answer(asked["call_edit"][0], True, decided_by="carol", args={"value": "edited"})

    late, edit = dex.client().get_call(late_key), dex.client().get_call(edit_key)
    assert late.status is CallStatus.REJECTED and "approval deadline passed" in (late.error or "")
    assert edit.status is CallStatus.REJECTED and CHANGED_ARGUMENTS_REASON in (edit.error or "")
    assert edit.approval is not None and edit.approval.decided_by == "carol"
    assert json.loads(edit.arguments) == {"value": "asked"}
    outputs = model.tool_results()
    assert tool_messages(dex, late_key) == [outputs["call_late"]]
    assert tool_messages(dex, edit_key) == [outputs["call_edit"]]
    assert outputs["call_late"].startswith("The call was rejected and did not run")
    assert lines(late_key, "start") == [] and lines(edit_key, "start") == []
