"""Values that travel between the dispatcher, the worker and the store.

Kept apart from the store so the worker, the recorder and the task events can name an outcome
without importing SQL code, and so the store's modules hold only persistence.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dex_celery.model.budgets import BudgetCharge
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import EffectClass, PolicySnapshot


@dataclass(frozen=True, slots=True)
class Admission:
    """How a new call enters the record: its policy snapshot, first status and approval
    deadline. Decided by the dispatcher (`dispatch.admit`); the store only writes it."""

    policy: PolicySnapshot
    status: CallStatus
    approval_deadline: float | None = None


#: Decides a call's admission once the session's default effect class is known (read in the
#: insert's transaction) and the time of the request (the ledger's clock).
Resolver = Callable[[EffectClass | None, float], Admission]


@dataclass(frozen=True, slots=True)
class NewCall:
    """A validated request, ready to be recorded."""

    key: CallKey
    tool_name: str
    arguments: str
    resolve: Resolver
    #: The secret arguments, sealed (`dex_celery.tools.sealing`); None when the tool has none.
    sealed: str | None = None
    #: Digest of tool and canonical arguments (`tools/repeat_digest.py`); the store keeps it
    #: and runs the repeat guard only when the admitted policy has `repeat_guard` (S5.4).
    repeat_digest: str | None = None
    #: The arguments as the tool receives them, canonical, secrets `***` (S12.2,
    #: `tools/call_identity.py`): what "same ids, same arguments" compares (S2.3).
    identity: str | None = None
    #: The request's trace context, kept with the call (JSON text; `engine/tracing.py`).
    trace_context: str | None = None
    #: The write budgets it draws on (S13.1), fixed now and recorded with it.
    charges: tuple[BudgetCharge, ...] = ()
    #: The digest of the tool's definition (`tools/definition_digest.py`); kept only for a
    #: call that waits for a person, with `repeat_digest` as its arguments' digest (S13.3).
    definition_digest: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """A terminal outcome to record, with what the model should read."""

    status: CallStatus
    error: str
    result: str | None = None
    attempts: int = 0
    attempt_log: str | None = None
    #: "The tool did not run": true only while no attempt of the call was claimed in the system
    #: of record (the write fence); otherwise the outcome becomes `outcome_unknown` (S10.2).
    did_not_run: bool = False
    #: When the ledger decided it (Redis's clock), recorded as `finished_at`; None: when it is
    #: written. A caller that learned the outcome from the ledger saw this time already.
    decided_at: float | None = None


@dataclass(frozen=True, slots=True)
class OutcomeRow:
    """An outcome decided by a worker, with what its TOOL message needs, so that a batch of
    them is written without reading the calls back (`Store.record_outcomes`)."""

    key: CallKey
    tool_name: str
    arguments: str
    outcome: Outcome
    #: The trace context of the attempt that decided it (`engine/tracing.py`); None untraced.
    trace: Mapping[str, str] | None = None
    #: The call's `approval_edit` (JSON) when a person edited its arguments (S13.3).
    edit: str | None = None


def arguments_json(arguments: object) -> str:
    """Canonical JSON for storing arguments (sorted keys, no spaces, no NaN or Infinity)."""
    return json.dumps(
        arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
