"""The requesters' room: a request becomes records and first attempts (validation, admission,
budgets, opening and publishing attempt 1), and a person's decisions on the calls that wait for
one (approvals, edits, previews).

This face is what the other rooms and the engine's own face take from the room; its modules are
private to it (`tests/unit/test_architecture.py`).
"""

from dex_celery.engine.request.approvals import (
    DEFAULT_LIST_LIMIT,
    Approvals,
    PendingApproval,
    expire_approval,
)
from dex_celery.engine.request.dispatch import CallRequest, Dispatcher
from dex_celery.engine.request.opening import Opener
from dex_celery.engine.request.previews import (
    HARD_LIMIT_SLACK,
    MAX_PREVIEW_CHARS,
    PREVIEW_TASK,
    asettled_preview,
    check_preview,
    preview_pending,
    settled_preview,
    shown_preview,
    unavailable,
)

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "HARD_LIMIT_SLACK",
    "MAX_PREVIEW_CHARS",
    "PREVIEW_TASK",
    "Approvals",
    "CallRequest",
    "Dispatcher",
    "Opener",
    "PendingApproval",
    "asettled_preview",
    "check_preview",
    "expire_approval",
    "preview_pending",
    "settled_preview",
    "shown_preview",
    "unavailable",
]
