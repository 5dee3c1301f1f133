"""An approver's edit of a call's arguments, and the texts of a call bound to its approval
(S13.3, docs/guardrails.md, "Approvals bound to what was approved").

The edit is kept with the call (who, when, the arguments before and after, both as the one
display rule shows them: secrets `***`, docs/secrets.md), and the model reads it in the call's
TOOL message, before what the tool returned: a call that ran with arguments a person changed is
never reported as if it ran with the model's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dex_celery.model.outcomes import CallStatus
from dex_celery.model.times import format_utc


@dataclass(frozen=True, slots=True)
class ApprovalEdit:
    """Arguments a person changed when approving a call (stored as JSON in `approval_edit`)."""

    by: str
    at: float
    #: The arguments before and after, as shown to people (secret values `***`).
    before: dict[str, Any]
    after: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps(
            {"by": self.by, "at": self.at, "before": self.before, "after": self.after},
            sort_keys=True,
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str | None) -> ApprovalEdit | None:
        if not text:
            return None
        raw = json.loads(text)
        return cls(str(raw["by"]), float(raw["at"]), dict(raw["before"]), dict(raw["after"]))

    def as_dict(self) -> dict[str, Any]:
        return {"by": self.by, "at": self.at, "before": self.before, "after": self.after}


def _compact(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))


def edited_note(edit: ApprovalEdit | None, status: CallStatus) -> str | None:
    """The line the model reads first in the TOOL message of a call that ran with edited
    arguments; None when nothing was edited, or the call never ran (rejected)."""
    if edit is None or status is CallStatus.REJECTED:
        return None
    return (
        f"Note: {edit.by} edited the arguments when approving this call, so it ran with "
        f"{_compact(edit.after)} instead of the requested {_compact(edit.before)}."
    )


def with_note(note: str | None, text: str) -> str:
    """`text` (a TOOL message) with the edit's note before it."""
    return text if note is None else f"{note}\n{text}"


def definition_changed_reason(approved_by: str, approved_at: float, what: str) -> str:
    """Why an approved call waits for a person again: its tool changed (a deploy) between the
    approval and the worker's claim, or its arguments no longer are what was approved."""
    return (
        f"approved by {approved_by} at {format_utc(approved_at, millis=False)}, but {what} "
        "before it ran; it did not run and waits for a new approval"
    )
