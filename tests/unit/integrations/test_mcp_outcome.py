"""The outcome field of `dex-celery mcp` answers and the tasks built from records (docs/mcp.md):
every record status maps to what a client may conclude about the tool's effect (S4.2, S4.5)."""

from __future__ import annotations

from collections.abc import Callable

import mcp_types
import pytest

from dex_celery.errors import InvalidId
from dex_celery.integrations.mcp.outcome import (
    OUTCOME_EXTENSION,
    OUTCOME_META_KEY,
    Outcome,
    advertised,
    extension_settings,
    outcome_in,
    outcome_of,
)
from dex_celery.integrations.mcp.server import call_ids, opaque_call
from dex_celery.integrations.mcp.tasks import (
    APPROVAL_INPUT,
    APPROVAL_META_KEY,
    DEADLINE_META_KEY,
    created,
    task_of,
)
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY
from dex_celery.model.outcomes import DID_NOT_RUN, CallStatus
from dex_celery.model.records import ToolCallRecord


@pytest.mark.parametrize(
    ("status", "error", "outcome"),
    [
        (CallStatus.SUCCEEDED, None, Outcome.EXECUTED),
        (CallStatus.FAILED, f"{DID_NOT_RUN}: no attempt reached a worker", Outcome.NOT_EXECUTED),
        (CallStatus.FAILED, "the order does not exist", Outcome.EXECUTED),
        (CallStatus.FAILED, "the attempt was lost after the tool started", Outcome.EXECUTED),
        (CallStatus.REJECTED, "no", Outcome.NOT_EXECUTED),
        (CallStatus.OUTCOME_UNKNOWN, "lost", Outcome.UNKNOWN),
        (CallStatus.AWAITING_APPROVAL, None, Outcome.PENDING),
        (CallStatus.PENDING, None, Outcome.PENDING),
    ],
)
def test_every_status_has_its_outcome(
    status: CallStatus, error: str | None, outcome: Outcome
) -> None:
    assert outcome_of(status, error) is outcome


def test_a_did_not_run_sentence_inside_a_tool_error_does_not_count() -> None:
    """Only an error that starts with the sentence says the tool did not run (S4.2)."""
    assert outcome_of(CallStatus.FAILED, f"my tool said: {DID_NOT_RUN}") is Outcome.EXECUTED


@pytest.mark.parametrize(
    ("status", "error", "task_status", "outcome"),
    [
        (CallStatus.AWAITING_APPROVAL, None, "input_required", "pending"),
        (CallStatus.PENDING, None, "working", "pending"),
        (CallStatus.SUCCEEDED, None, "completed", "executed"),
        (
            CallStatus.FAILED,
            f"{DID_NOT_RUN}: no attempt reached a worker",
            "completed",
            "not_executed",
        ),
        (CallStatus.OUTCOME_UNKNOWN, "lost", "completed", "unknown"),
        (CallStatus.REJECTED, "no", "cancelled", "not_executed"),
    ],
)
def test_a_task_shows_the_record_with_its_outcome_field(
    status: CallStatus,
    error: str | None,
    task_status: str,
    outcome: str,
    record_of: Callable[..., ToolCallRecord],
) -> None:
    """docs/mcp.md, "Calls as tasks": the task id is the key, every state carries the outcome
    field, an ended call (but a rejected one) completes with its `CallToolResult`."""
    record = record_of(status, error)
    result = mcp_types.CallToolResult(content=[], is_error=status is not CallStatus.SUCCEEDED)
    task = task_of(record, result if status.terminal else None, poll_interval=1.0)
    assert (task["taskId"], task["status"]) == ("s/t/c", task_status)
    assert task["_meta"][OUTCOME_META_KEY] == outcome
    assert task["_meta"][IDEMPOTENCY_META_KEY] == "s/t/c"
    assert task["ttlMs"] is None and task["pollIntervalMs"] == 1000
    assert task["createdAt"] == "2027-01-15T08:00:00Z"
    assert ("result" in task) is (task_status == "completed")
    if status is CallStatus.AWAITING_APPROVAL:
        assert task["_meta"][DEADLINE_META_KEY] == "2027-01-15T08:10:00Z"
        assert "until 2027-01-15 08:10:00 UTC" in task["statusMessage"]
    if not status.terminal:  # a call that cannot finish at once answers with its task
        assert created(record, poll_interval=1.0) == {"resultType": "task", **task}


def test_the_extension_is_advertised_and_read_back() -> None:
    """docs/mcp-outcome-extension.md: the settings name every outcome; a client reads a stated
    outcome, and treats a missing or unknown value as none (its fallback rules apply)."""
    settings = extension_settings()
    assert set(settings["outcomes"]) == {o.value for o in Outcome}
    assert advertised({OUTCOME_EXTENSION: settings}) and not advertised({}) and not advertised(None)
    assert outcome_in({OUTCOME_META_KEY: "unknown"}) is Outcome.UNKNOWN
    assert outcome_in({OUTCOME_META_KEY: "maybe"}) is None
    assert outcome_in(None) is None


def test_an_opaque_key_names_one_call_in_the_callers_default_session() -> None:
    first = opaque_call("3f0c1a52-9d7e-4b7e-9a51", "mcp-alice")
    assert first == opaque_call("3f0c1a52-9d7e-4b7e-9a51", "mcp-alice")
    assert first.key.startswith("mcp-alice/key/")
    assert opaque_call("another", "mcp-alice") != first
    assert call_ids({IDEMPOTENCY_META_KEY: "3f0c1a52-9d7e-4b7e-9a51"}, "mcp-alice") == first
    with pytest.raises(InvalidId):
        opaque_call("x" * 201, "mcp-alice")


def test_a_call_waiting_for_approval_is_input_required_with_its_form(
    record_of: Callable[..., ToolCallRecord],
) -> None:
    """docs/mcp.md, "Approvals as input_required": the context and an elicitation form that
    the SDK's own types accept."""
    record = record_of(CallStatus.AWAITING_APPROVAL)
    task = task_of(record, None, poll_interval=1.0)
    assert task["status"] == "input_required"
    assert task["_meta"][APPROVAL_META_KEY]["tool"] == record.tool_name
    form = task["inputRequests"][APPROVAL_INPUT]
    request = mcp_types.ElicitRequest.model_validate(form)
    assert request.method == "elicitation/create"
