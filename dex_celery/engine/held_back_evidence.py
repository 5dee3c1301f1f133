"""New evidence for the calls the repeat guard holds back (S5.4).

A held-back call waits for a person because an identical earlier call may still be running or
may have taken effect. When that earlier call's late result arrives or it is reconciled, each
call waiting on it gets a `tool_call_repeat_evidence` event, and its approval request (which
reads the earlier call's record live, `ops/present.py`) shows the evidence.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dex_celery.model.event_types import EventType
from dex_celery.model.records import ToolCallRecord
from dex_celery.model.repeat_rule import RepeatEvidence
from dex_celery.store.unknowns import REPORTED, UnknownOutcomes

if TYPE_CHECKING:
    from dex_celery.ledger.events import AgentEvents
    from dex_celery.store.repository import Store

log = logging.getLogger("dex_celery.engine.held_back_evidence")

#: The `evidence` field of the event.
LATE_RESULT = "late_result"
RECONCILED = "reconciled"


def announce_repeat_evidence(store: Store, events: AgentEvents, earlier: str, evidence: str) -> int:
    """Publish the evidence to every call held back by `earlier`; how many there were. Never
    raises: the evidence is in SQL already, only its announcement could be lost."""
    try:
        held = store.held_back_by(earlier)
        for key in held:
            events.publish(
                EventType.TOOL_CALL_REPEAT_EVIDENCE, key, earlier=earlier, evidence=evidence
            )
        return len(held)
    except Exception:
        log.exception(
            "could not announce the %s of %s to the calls repeating it", evidence, earlier
        )
        return 0


def repeat_evidence(store: Store, record: ToolCallRecord) -> RepeatEvidence | None:
    """The earlier call a held-back call repeats, as it is now (two primary-key reads); None
    for a call the guard did not hold back."""
    if record.repeat_of is None:
        return None
    earlier = store.get_call(record.repeat_of)
    unknown = UnknownOutcomes(store).get(record.repeat_of)
    return RepeatEvidence(
        earlier=record.repeat_of,
        reason=record.repeat_reason or "",
        earlier_status=earlier.status.value if earlier is not None else None,
        late_result=earlier is not None and earlier.late_result is not None,
        reconciled=unknown is not None and unknown.state == REPORTED,
    )
