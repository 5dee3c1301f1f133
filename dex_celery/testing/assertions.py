"""Assertions on a call's record and on how many times the user's tool body ran.

The record comes from dex-celery's SQL store; the count from the kit's side-effect counter
(`dex_celery.testing.effects`), written by the tool itself: they are checked against each other,
so a test catches a record that says "did not run" for a tool that ran, or a write that ran
twice (docs/semantics.md, S3.2, S4.2).
"""

from __future__ import annotations

from dex_celery.app import Dex
from dex_celery.model.outcomes import DID_NOT_RUN, CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.testing import effects
from dex_celery.testing.processes import wait_for


def wait_finished(dex: Dex, key: str, *, timeout: float = 60) -> ToolCallRecord:
    """Wait until the record of `key` is terminal (succeeded, failed, rejected, outcome_unknown)."""
    box: list[ToolCallRecord] = []

    def done() -> bool:
        record = dex.store.get_call(key)
        if record is not None and record.finished:
            box.append(record)
            return True
        return False

    wait_for(done, timeout=timeout, what=f"a terminal record of {key}")
    return box[-1]


def wait_late_result(dex: Dex, key: str, *, timeout: float = 60) -> ToolCallRecord:
    """Wait until a late result (an attempt that finished after the outcome was decided, kept
    as evidence only, S5.2) is on the record of `key`, and return the record."""
    box: list[ToolCallRecord] = []

    def landed() -> bool:
        record = dex.store.get_call(key)
        if record is not None and record.late_result:
            box.append(record)
            return True
        return False

    wait_for(landed, timeout=timeout, what=f"the late result of {key} to be kept")
    return box[-1]


def assert_outcome(
    dex: Dex, key: str, status: CallStatus | str, *, timeout: float = 60
) -> ToolCallRecord:
    """The call `key` ends with `status` (waits for its record to be terminal); returns it."""
    record = wait_finished(dex, key, timeout=timeout)
    expected = CallStatus(status)
    assert record.status is expected, (
        f"{key}: expected {expected.value}, got {record.status.value} ({record.error or ''})"
    )
    return record


def assert_at_most_once(effect: str, key: str) -> int:
    """The effect `effect` of call `key` happened at most once; returns how many times."""
    n = effects.count(effect, key)
    assert n <= 1, f"{effect} of {key} happened {n} times"
    return n


def assert_ran(effect: str, key: str, times: int) -> None:
    """The effect `effect` of call `key` happened exactly `times` times."""
    n = effects.count(effect, key)
    assert n == times, f"{effect} of {key} happened {n} times, expected {times}"


def assert_record_agrees(record: ToolCallRecord, effect: str) -> None:
    """The record tells the truth about the tool body: a call whose effect happened is never
    "did not run", and a success's effect happened."""
    n = effects.count(effect, record.key)
    if n:
        assert not (record.error or "").startswith(DID_NOT_RUN), (
            f"{record.key}: the effect happened {n} times but the record says {record.error!r}"
        )
    if record.status is CallStatus.SUCCEEDED:
        assert n >= 1, f"{record.key}: succeeded, but its effect {effect} never happened"
