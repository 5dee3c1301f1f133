"""The same call however it is spelled (docs/semantics.md S12.2), on SQLite and PostgreSQL.

`charge(order, amount: int, memo=None, seconds=0.0)` is a `non_idempotent_write` needing no
approval, so only the repeat guard (S5.4) can hold a repeat back. Its first call is held inside
the tool (a real prefork worker) until the test releases it, and meanwhile later turns of the
same session ask for it again, spelled as a model that re-plans the write would: each spelling
the worker's argument check turns into the same values waits for a person naming the first
call; each different value runs; the tool's own side-effect log shows one charge per distinct
call. A property over spellings then checks the guard against what the tool would receive,
with the calls still queued (no worker).
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.processes import Worker
from devtools.toolapp import LOG_ENV, charges
from dex_celery import CallStatus, Dex
from dex_celery.tools.arguments import check_arguments
from tests.support.faults.crash import wait_finished, wait_started
from tests.support.stores.databases import ON_BOTH_DATABASES

pytestmark = [
    pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning"),
    ON_BOTH_DATABASES,
]


#: Spellings of `{"order": "A-1", "amount": 10}` the worker's check hands the tool unchanged.
SAME_AS_TEN = [
    {"order": "A-1", "amount": 10.0},
    {"order": "A-1", "amount": "10"},
    {"order": "A-1", "amount": 10, "memo": None},
    {"order": "A-1", "amount": 10, "seconds": 0.0},
    '{"amount": 10, "order": "A-1"}',
    '{ "order" :"A-1",\n   "amount":10 }',
]


def test_equivalent_spellings_wait_for_the_pending_call_and_other_values_run(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    client = dex.client()
    turns = iter(range(1, 100))

    def ask(arguments: dict[str, Any] | str) -> Any:
        return client.request_call("s1", f"t{next(turns)}", "call-1", "charge", arguments)

    ten = ask({"order": "A-1", "amount": 10})
    one = ask({"order": "A-1", "amount": 1})
    assert ten.status is CallStatus.PENDING and one.status is CallStatus.PENDING
    wait_started(ten.key)
    wait_started(one.key)

    for arguments in SAME_AS_TEN:
        held = ask(arguments)
        assert held.status is CallStatus.AWAITING_APPROVAL, (arguments, held)
        assert held.repeat_of == ten.key, arguments
        assert held.repeat_reason == f"an identical call {ten.key} may still be running"
    true_for_one = ask({"order": "A-1", "amount": True})  # pydantic's `int` takes `true` as 1
    assert true_for_one.status is CallStatus.AWAITING_APPROVAL
    assert true_for_one.repeat_of == one.key

    different = [
        ask({"order": "A-1", "amount": 11}),
        ask({"order": "A-1", "amount": 10, "memo": "second order line"}),
        ask({"order": "A-1", "amount": 10, "seconds": 0.01}),
    ]
    for record in different:
        assert record.status is CallStatus.PENDING and record.repeat_of is None, record

    (Path(env[LOG_ENV]) / "release-A-1").touch()
    for record in (ten, one, *different):
        assert wait_finished(dex, record.key).status is CallStatus.SUCCEEDED
    charged = sorted(line.split(" ", 2)[2] for line in charges("A-1"))
    assert charged == sorted(
        ["10 None 0.0", "1 None 0.0", "11 None 0.0", "10 'second order line' 0.0", "10 None 0.01"]
    ), charged
    waiting = {p.key for p in client.pending_approvals()}
    assert len(waiting) == len(SAME_AS_TEN) + 1


def test_the_same_ids_asked_again_differently_spelled_are_the_same_call(dex: Dex) -> None:
    """S2.3 compares the call as received too: a retry that respells the arguments gets the
    recorded call back, not a `CallConflict`."""
    client = dex.client()
    first = client.request_call("s1", "t1", "call-1", "charge", {"order": "B-1", "amount": 5})
    again = client.request_call(
        "s1", "t1", "call-1", "charge", {"amount": "5", "order": "B-1", "memo": None}
    )
    assert again.key == first.key and again.arguments == first.arguments


SPELLINGS: dict[str, list[Any]] = {
    "amount": [1, 1.0, "1", True, 2, 2.0, " 2 "],
    "memo": [None, "x"],
    "seconds": [0, 0.0, "0", 0.5, "0.5"],
}
#: The arguments with defaults: each example omits or spells them.
OMITTED = ["memo", "seconds"]


@st.composite
def spelling(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {"order": "P-1", "amount": draw(st.sampled_from(SPELLINGS["amount"]))}
    for name in OMITTED:
        if draw(st.booleans()):
            out[name] = draw(st.sampled_from(SPELLINGS[name]))
    return out


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(first=spelling(), second=spelling())
def test_a_queued_call_holds_back_exactly_what_the_tool_would_receive_the_same(
    dex: Dex, first: dict[str, Any], second: dict[str, Any]
) -> None:
    """No worker runs: the first call stays queued. The second, in the next turn of the same
    session, waits naming it exactly when the worker's check gives the tool the same values."""
    tool = dex.runtime.tools["charge"]

    def receives(arguments: dict[str, Any]) -> dict[str, Any]:
        bound = inspect.signature(tool.function).bind(None, **check_arguments(tool, arguments))
        bound.apply_defaults()
        return {k: (type(v), v) for k, v in bound.arguments.items() if k != "ctx"}

    session = f"p-{uuid.uuid4().hex[:12]}"
    client = dex.client()
    earlier = client.request_call(session, "t1", "c", "charge", first)
    assert earlier.status is CallStatus.PENDING
    later = client.request_call(session, "t2", "c", "charge", second)
    if receives(first) == receives(second):
        assert later.status is CallStatus.AWAITING_APPROVAL and later.repeat_of == earlier.key
    else:
        assert later.status is CallStatus.PENDING and later.repeat_of is None
