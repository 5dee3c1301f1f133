"""The outcome field of `dex-celery mcp` answers (docs/mcp.md): every record status maps to
what a client may conclude about the tool's effect (S4.2, S4.5)."""

from __future__ import annotations

import pytest

from dex_celery.integrations.mcp_outcome import Outcome, outcome_of
from dex_celery.model.outcomes import DID_NOT_RUN, CallStatus


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
