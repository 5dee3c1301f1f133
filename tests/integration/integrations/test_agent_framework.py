"""A Microsoft Agent Framework agent whose tools run on real Celery workers through dex-celery,
driven by the scripted `ScriptedChatClient` (no network): the model reads exactly the records'
texts, approvals go through the framework's own function approval requests and responses, a
killed worker gives the `outcome_unknown` text, and a session restored from its saved snapshot
gets the same record for an approved call."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from devtools.processes import Worker, wait_for
from dex_celery import CallStatus, Dex
from dex_celery.integrations.frameworks.calls import CHANGED_ARGUMENTS_REASON
from dex_celery.testing.models.agent_framework import ScriptedChatClient, tool_call
from tests.support.faults.crash import lines, tool_messages
from tests.support.frameworks import checks
from tests.support.frameworks.agent_framework import Desk, answer, approvals


def test_read_and_idempotent_write_run_on_a_worker_and_the_model_reads_the_records(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    client = ScriptedChatClient(
        [[tool_call(*call) for call in checks.READ_AND_WRITE], "Both done."]
    )
    desk = Desk(dex, client, ["echo", "slow_idempotent_write"], "maf-read")
    assert desk.ask("Look up order A and keep it.").text == "Both done."

    read_key, write_key = "maf-read/turn-1/call_read", "maf-read/turn-1/call_write"
    checks.assert_read_and_write_succeeded(dex, client.tool_results(), read_key, write_key)


def test_a_second_model_response_is_the_next_turn(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """Turns count the model responses of the conversation: a call of the run's second response
    is `turn-2`, and the next run's first response is `turn-4` (three responses came before)."""
    start_worker()
    client = ScriptedChatClient(
        [
            [tool_call("echo", {"query": "a"}, "call_a")],
            [tool_call("echo", {"query": "b"}, "call_b")],
            "Done.",
            [tool_call("echo", {"query": "c"}, "call_c")],
            "Done again.",
        ]
    )
    desk = Desk(dex, client, ["echo"], "maf-turns")
    assert desk.ask("Look up a, then b.").text == "Done."
    assert desk.ask("And c.").text == "Done again."
    keys = [c.key for c in dex.client().get_agent_snapshot("maf-turns").tool_calls]
    assert sorted(keys) == [
        "maf-turns/turn-1/call_a",
        "maf-turns/turn-2/call_b",
        "maf-turns/turn-4/call_c",
    ]


def test_approved_and_rejected_writes_are_recorded_with_who_decided(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    writes = [tool_call(*call) for call in checks.TWO_WRITES]
    client = ScriptedChatClient([writes, checks.TWO_WRITES_ANSWER])
    desk = Desk(dex, client, ["guarded_write"], "maf-hitl", approver="desk-bot")
    asked = approvals(desk.ask("Send both."))
    ok_key, no_key = "maf-hitl/turn-1/call_ok", "maf-hitl/turn-1/call_no"
    # The run ended with the requests.
    checks.assert_both_wait(dex, asked, ok_key, no_key)
    assert len(client.seen) == 1  # the model was not asked again while a person decides

    final = desk.answer(
        answer(asked["call_ok"][0], True, decided_by="alice"),
        answer(asked["call_no"][0], False, reason="not this one"),
    )
    assert final.text == checks.TWO_WRITES_ANSWER
    checks.assert_one_approved_one_rejected(
        dex, client.tool_results(), ok_key, no_key, approved_by="alice", rejected_by="desk-bot"
    )


def test_killed_worker_gives_the_model_the_outcome_unknown_text(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    worker = start_worker()
    client = ScriptedChatClient(
        [[tool_call("slow_non_idempotent_write", {"seconds": 60}, "call_kill")], "I will check."]
    )
    desk = Desk(dex, client, ["slow_non_idempotent_write"], "maf-kill")
    key = "maf-kill/turn-1/call_kill"
    answer_text = checks.killed_mid_call(worker, key, lambda: desk.ask("Send it.").text)

    assert answer_text == "I will check."
    checks.assert_killed_write_read_unknown(dex, client.tool_results()["call_kill"], key)
    assert len(client.seen) == 2  # the model read the text and did not call again


def test_an_approval_answered_in_a_restored_session_runs_the_recorded_call_once(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """The session is saved while the call waits (`to_dict`, as a session store keeps it) and
    restored in a new agent, as a new process would: the approval there asks for the same key,
    runs the write once, and a second answer runs nothing more."""
    start_worker()
    client = ScriptedChatClient([[tool_call("guarded_write", {"value": "once"}, "call_w")], "Ok."])
    first = Desk(dex, client, ["guarded_write"], "maf-resume")
    asked = approvals(first.ask("Send it."))
    saved = json.loads(json.dumps(first.snapshot()))
    key = "maf-resume/turn-1/call_w"

    restored = Desk(dex, client, ["guarded_write"], "maf-resume", snapshot=saved)
    restored.answer(answer(asked["call_w"][0], True, decided_by="bob"))
    record = dex.client().get_call(key)
    assert record.status is CallStatus.SUCCEEDED
    assert record.approval is not None and record.approval.decided_by == "bob"
    assert client.tool_results()["call_w"] == '"once"' == tool_messages(dex, key)[0]
    assert len(lines(key, "start")) == 1
    assert [r.key for r in dex.client().get_agent_snapshot("maf-resume").tool_calls] == [key]


def test_an_expired_approval_and_an_edited_one_are_read_as_rejections(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """An approval arriving after the call's approval deadline runs nothing: the model reads
    the record's expiry. An approval whose function call carries other arguments is refused
    (the approval is of the arguments asked for), recorded `rejected` by who decided, and runs
    nothing, though the framework itself would have run the stored call."""
    from agent_framework import Content

    start_worker()
    client = ScriptedChatClient(
        [
            [
                tool_call("guarded_write_short", {"value": "late"}, "call_late"),
                tool_call("guarded_write", {"value": "asked"}, "call_edit"),
            ],
            "Nothing was sent.",
        ]
    )
    desk = Desk(dex, client, ["guarded_write_short", "guarded_write"], "maf-late")
    asked = approvals(desk.ask("Send both."))
    late_key, edit_key = "maf-late/turn-1/call_late", "maf-late/turn-1/call_edit"
    deadline = dex.client().get_call(late_key).approval_deadline or 0
    wait_for(lambda: time.time() > deadline + 0.05, timeout=10, what="the approval deadline")

    request = asked["call_edit"][0]
    original = request.function_call
    assert original is not None
    edited_call = Content.from_function_call(
        call_id=str(original.call_id), name="guarded_write",
        arguments={"value": "edited"}, id=original.id,
    )  # fmt: skip
    edited = Content.from_function_approval_response(
        True, id=str(request.id), function_call=edited_call,
        additional_properties={"decided_by": "carol"},
    )  # fmt: skip
    desk.answer(answer(asked["call_late"][0], True, decided_by="alice"), edited)

    late, edit = dex.client().get_call(late_key), dex.client().get_call(edit_key)
    assert late.status is CallStatus.REJECTED and "approval deadline passed" in (late.error or "")
    assert edit.status is CallStatus.REJECTED and CHANGED_ARGUMENTS_REASON in (edit.error or "")
    assert edit.approval is not None and edit.approval.decided_by == "carol"
    assert json.loads(edit.arguments) == {"value": "asked"}
    outputs = client.tool_results()
    assert tool_messages(dex, late_key) == [outputs["call_late"]]
    assert tool_messages(dex, edit_key) == [outputs["call_edit"]]
    assert outputs["call_late"].startswith("The call was rejected and did not run")
    assert lines(late_key, "start") == [] and lines(edit_key, "start") == []


def test_a_streamed_run_keys_its_calls_by_the_same_turns(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """`agent.run(..., stream=True)`: the chat middleware notes the turns from the streamed
    response, so a call of the run's second response is `turn-2` there too."""
    import asyncio

    start_worker()
    client = ScriptedChatClient(
        [
            [tool_call("echo", {"query": "a"}, "call_a")],
            [tool_call("echo", {"query": "b"}, "call_b")],
            "Done.",
        ]
    )
    desk = Desk(dex, client, ["echo"], "maf-stream")

    async def streamed() -> str:
        stream = desk.agent.run("Look up a, then b.", session=desk.session, stream=True)
        async for _ in stream:
            pass
        return (await stream.get_final_response()).text

    assert asyncio.run(streamed()) == "Done."
    keys = [c.key for c in dex.client().get_agent_snapshot("maf-stream").tool_calls]
    assert sorted(keys) == ["maf-stream/turn-1/call_a", "maf-stream/turn-2/call_b"]
    assert client.tool_results()["call_b"] == tool_messages(dex, "maf-stream/turn-2/call_b")[0]
