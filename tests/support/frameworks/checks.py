"""What every framework's adapter test checks after its model's run, written once: the model
read exactly the records' TOOL messages (S4.4) and each tool ran as its record says (the test
tool's own log); how a sync framework's run is started in a thread and its worker SIGKILLed
mid-call; and the reconcile report that then reaches the session (S12.1)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from devtools.processes import Worker
from dex_celery import OUTCOME_UNKNOWN_TOOL_RESULT, CallStatus, Dex, reconcile_once
from tests.support.faults.crash import lines, tool_messages, wait_started

T = TypeVar("T")

REJECTED_TEXT = "The call was rejected and did not run"
#: The read and the idempotent write `assert_read_and_write_succeeded` checks, as
#: `(tool, arguments, call id)` for each framework's scripted model's `tool_call`.
READ_AND_WRITE = (
    ("echo", {"query": "order A"}, "call_read"),
    ("slow_idempotent_write", {"seconds": 0, "value": "kept"}, "call_write"),
)


#: The two writes of one model response `assert_both_wait` and `assert_one_approved_one_rejected`
#: check (`call_ok` to approve, `call_no` to reject), as `(tool, arguments, call id)`, and what
#: the model says once both are decided.
TWO_WRITES = (
    ("guarded_write", {"value": "yes"}, "call_ok"),
    ("guarded_write", {"value": "no"}, "call_no"),
)
TWO_WRITES_ANSWER = "One sent, one refused."


def assert_both_wait(
    dex: Dex, asked: Mapping[str, tuple[Any, Mapping[str, Any]]], ok_key: str, no_key: str
) -> None:
    """Both writes were asked of a person, each shown with its dex key, and are recorded in
    dex before anyone decides, waiting (`asked`: the framework's request and what it shows, by
    call id)."""
    assert sorted(asked) == ["call_no", "call_ok"]
    assert asked["call_ok"][1]["dex_key"] == ok_key
    assert dex.client().get_call(ok_key).status is CallStatus.AWAITING_APPROVAL
    assert dex.client().get_call(no_key).status is CallStatus.AWAITING_APPROVAL


def assert_read_and_write_succeeded(
    dex: Dex, outputs: Mapping[str, str], read_key: str, write_key: str
) -> None:
    """A read (`call_read`) and an idempotent write (`call_write`, returning "kept") of one
    turn: both succeeded, the model read each record's TOOL message, and the write ran once."""
    read, write = dex.client().get_call(read_key), dex.client().get_call(write_key)
    assert read.status is CallStatus.SUCCEEDED and write.status is CallStatus.SUCCEEDED
    assert tool_messages(dex, read_key) == [outputs["call_read"]]
    assert tool_messages(dex, write_key) == [outputs["call_write"]] == ['"kept"']
    assert len(lines(write_key, "start")) == 1


def assert_one_approved_one_rejected(
    dex: Dex,
    outputs: Mapping[str, str],
    ok_key: str,
    no_key: str,
    *,
    approved_by: str,
    rejected_by: str,
) -> None:
    """`call_ok` approved (returning "yes") and `call_no` rejected with the reason "not this
    one": each record says who decided, the model read each TOOL message, and only the approved
    call's tool ran, once."""
    ok, no = dex.client().get_call(ok_key), dex.client().get_call(no_key)
    assert ok.status is CallStatus.SUCCEEDED
    assert ok.approval is not None and ok.approval.decided_by == approved_by
    assert no.status is CallStatus.REJECTED
    assert no.approval is not None and no.approval.decided_by == rejected_by
    assert "not this one" in (no.error or "")
    assert tool_messages(dex, ok_key) == [outputs["call_ok"]] == ['"yes"']
    assert tool_messages(dex, no_key) == [outputs["call_no"]]
    assert outputs["call_no"].startswith(REJECTED_TEXT)
    assert len(lines(ok_key, "start")) == 1 and lines(no_key, "start") == []


def killed_mid_call(worker: Worker, key: str | Callable[[], str], run: Callable[[], T]) -> T:
    """Run a sync framework's run in a thread; SIGKILL the worker (main process and pool
    children) once the tool logged its start; the run's result, once it ended. `key` may be a
    function giving it once the run named the call (a key only the run knows)."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(run()))
    thread.start()
    wait_started(key if isinstance(key, str) else key())
    worker.kill_all()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the agent's run did not end after the kill"
    (result,) = out
    return result


def assert_killed_write_read_unknown(dex: Dex, seen: str, key: str) -> None:
    """The killed write ended `outcome_unknown`, the model read exactly that record's TOOL
    message (`seen`), and the tool started once."""
    assert dex.client().get_call(key).status is CallStatus.OUTCOME_UNKNOWN
    assert OUTCOME_UNKNOWN_TOOL_RESULT in seen
    assert tool_messages(dex, key) == [seen]
    assert len(lines(key, "start")) == 1


#: The reconcile report of the crash tests' killed refund (their outcome check's answer).
REPORT = "Note from the order system: the refund of 999 cents on order 1002 went through."


def report_check(key: str, arguments_json: str) -> str:
    """The outcome check the crash tests register: the refund went through."""
    return REPORT


def reports(texts: Iterable[str]) -> list[str]:
    """The reconcile reports among a model input's user texts."""
    return [t for t in texts if t.startswith(REPORT)]


def reconcile_reports(dex: Dex, key: str) -> None:
    """The killed call is `outcome_unknown`; the reconcile beat job's pass reports it to the
    session, and a second pass sends nothing (S8.2)."""
    assert dex.client().get_call(key).status is CallStatus.OUTCOME_UNKNOWN
    assert reconcile_once(dex).reported_keys == (key,)
    assert reconcile_once(dex).reported == 0
