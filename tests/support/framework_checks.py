"""What every framework's adapter test checks after its model's run, written once: the model
read exactly the records' TOOL messages (S4.4) and each tool ran as its record says (the test
tool's own log)."""

from __future__ import annotations

from collections.abc import Mapping

from dex_celery import CallStatus, Dex
from tests.support.crash import lines, tool_messages

REJECTED_TEXT = "The call was rejected and did not run"


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
