"""The worker's claim of an approved call (S13.3, docs/guardrails.md, "Approvals bound to what
was approved").

A call a person approved carries `approved` in its task message. Its worker computes, from its
own tool (as deployed in this process) and the arguments the message hands it, the binding an
approval must hold (`tools/definition_digest.py`) and claims the call in SQL with it: one
conditional update that is also the write fence for a write, so the approval is consumed once,
in the same step that makes the write at most once. If the binding is not the approved one (a
deploy changed the tool's signature, schema, policy or MCP definition between the approval and
the claim, or the arguments are not the approved ones), nothing runs: the attempt is withdrawn
from the ledger and the call waits for a person again, with the reason in its record, the
approvals listing and page, and the events stream (so the webhook).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dex_celery.engine.attempt.invoke import stored_arguments
from dex_celery.errors import DexError
from dex_celery.model.approval_binding import definition_changed_reason
from dex_celery.model.event_types import EventType
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.store.approval_binding import ApprovedClaim
from dex_celery.tools.call_identity import identify
from dex_celery.tools.definition_digest import binding_digest, current_definition_digest
from dex_celery.tools.sealing import unseal
from dex_celery.tools.tool import Tool

if TYPE_CHECKING:
    from dex_celery.ledger.ledger import Ledger
    from dex_celery.settings import Settings
    from dex_celery.store.repository import Store

log = logging.getLogger("dex_celery.engine.attempt.worker")

#: A binding no approval holds: what a worker claims with when it cannot compute its own.
_UNBOUND = "-"


class Worker(Protocol):
    """What of the worker (`engine/attempt/worker.py`) an approved claim uses."""

    store: Store
    ledger: Ledger
    settings: Settings

    def give_up_unconfirmed(self, key: str, attempt: int, fence: str, error: Exception) -> None:
        """The claim could not be committed in SQL: give the attempt up, no tool code."""

    def refused_by_database(self, key: str, attempt: int, fence: str) -> None:
        """SQL holds another claim of the write, or the call ended there: give it up."""


@dataclass(frozen=True, slots=True)
class Bound:
    """What an approved call's worker has: its tool and the message's arguments."""

    tool: Tool
    arguments: str | dict[str, Any]
    sealed: str | None


@dataclass(frozen=True, slots=True)
class WorkerView:
    """The binding this worker computes, and its parts (to say which part differs)."""

    definition: str
    arguments: str | None
    #: Why the arguments have no digest here (they do not fit the tool as deployed now).
    problem: str | None = None

    @property
    def binding(self) -> str:
        if self.arguments is None:
            return _UNBOUND
        return binding_digest(self.arguments, self.definition)


def worker_view(bound: Bound, secret_key: str | None) -> WorkerView:
    """The definition digest of this process's tool and the digest of the message's arguments
    as this tool receives them (S12.2), secrets included as their keyed digest."""
    definition = current_definition_digest(bound.tool)
    try:
        arguments = {**stored_arguments(bound.arguments), **unseal(bound.sealed, secret_key)}
        fingerprint = identify(bound.tool, arguments, secret_key).fingerprint
    except DexError as e:
        return WorkerView(definition, None, str(e))
    return WorkerView(definition, fingerprint)


def claim_approved(
    worker: Worker, bound: Bound, key: str, attempt: int, fence: str, owner: str, fenced: bool
) -> ApprovedClaim:
    """Consume the approval of `key` (inside the write fence when `fenced`); not ok when the
    call must not run here (it then waits again, or the database holds another claim)."""
    view = worker_view(bound, worker.settings.secret_key)
    store = worker.store
    try:
        held = store.claim_approved(
            key,
            attempt,
            fence=fence,
            owner=owner,
            now=worker.ledger.now(),
            binding=view.binding,
            fenced=fenced,
        )
    except Exception as e:  # the database refused, or broke during the commit: no tool code
        worker.give_up_unconfirmed(key, attempt, fence, e)
        return ApprovedClaim(False)
    if held.ok:
        return held
    record = store.get_call(key)
    if (
        record is not None
        and record.status is CallStatus.PENDING
        and record.claimed_by is None
        and record.approved_digest is not None
        and record.approved_digest != view.binding
    ):
        wait_again(worker, record, view, attempt, fence)
    else:
        worker.refused_by_database(key, attempt, fence)
    return ApprovedClaim(False)


def what_changed(record: ToolCallRecord, view: WorkerView) -> str:
    """Which part of the approved binding this worker does not have, in words."""
    if view.problem is not None:
        return f"the arguments do not fit the tool as it is deployed now ({view.problem})"
    if record.definition_digest != view.definition:
        return (
            f"the tool {record.tool_name!r} changed (a deploy with another signature, schema, "
            f"policy or MCP definition: approved definition {(record.definition_digest or '?')[:12]}, "
            f"the worker has {view.definition[:12]})"
        )
    return "the arguments the worker was handed are not the approved ones"


def wait_again(
    worker: Worker, record: ToolCallRecord, view: WorkerView, attempt: int, fence: str
) -> None:
    """Withdraw the attempt from the ledger (nothing ran), then send the call back to wait
    for a person with the reason. Ledger first: a crash in between leaves a pending call with
    no ledger entry, which the sweeper opens again, and the next claim finds the same."""
    key = record.key
    if not worker.ledger.withdraw(key, attempt, fence=fence):
        log.warning("attempt %d of %s was not this worker's to withdraw; not run", attempt, key)
        return
    approval = record.approval
    reason = definition_changed_reason(
        approval.decided_by if approval is not None else "someone",
        approval.decided_at if approval is not None else record.requested_at,
        what_changed(record, view),
    )
    now = worker.ledger.now()
    assert record.approved_digest is not None
    if not worker.store.rewait(
        key,
        approved=record.approved_digest,
        reason=reason,
        deadline=now + record.policy.approval_timeout,
        definition_digest=view.definition,
        arguments_digest=view.arguments,
    ):
        log.warning("%s changed meanwhile; not sent back to wait for approval", key)
        return
    log.warning("approved call %s waits for a person again: %s", key, reason)
    try:
        events = worker.ledger.events
        events.publish(
            EventType.TOOL_CALL_AWAITING_APPROVAL,
            key,
            deadline=str(now + record.policy.approval_timeout),
            repeat_of="",
            reason=reason,
        )
    except Exception:  # the record says it; the event only announces it
        log.exception("could not announce that %s waits for approval again", key)
