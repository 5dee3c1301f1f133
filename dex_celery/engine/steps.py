"""The one place a ledger step becomes an action.

A ledger transition (`ledger/ledger.py`: finish, expire, lose, time out, a sweep's moves)
returns a `Step`; only the transition's winner holds it, and hands it to `Steps.apply`:

| Step | Action |
|---|---|
| `RETRY` | publish the next attempt (`publish`; the ledger holds its backoff) |
| `FINISHED` | record the outcome in SQL (`record`), judging a fenced write from SQL; from the worker that ran the attempt (`Ran`), hand it to the outcome writer instead |
| `LATE`, or a step with `late_result`, from the worker that ran it | keep the late result as evidence (S5.2) |
| `NOOP` | nothing: another process won the transition |

Its callers: the worker's own finish (`attempt/worker.py`), its refused or unconfirmed claims
and a lost pool child, the start-to-close watchdog (`attempt/invoke.py`), a refused publish
(`publish`), the sweeper (`upkeep/sweep.py`) and a waiting caller (`DexClient.wait`). A new
ledger transition that returns these kinds of step changes nothing here; a new kind of step
(or a new action) is a row of this table (docs/architecture.md, "Where do I change X").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dex_celery.engine import tracing
from dex_celery.engine.decided_outcomes import outcome_of
from dex_celery.engine.held_back_evidence import LATE_RESULT, announce_repeat_evidence
from dex_celery.engine.task_events import announce_decided
from dex_celery.engine.tracing import span
from dex_celery.errors import PublishError, UnknownCall
from dex_celery.ledger.ledger import Cause, Step, StepKind
from dex_celery.model.effects import fenced_classes, traits_of
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus, EndReason, error_text, unclaimed_write_text
from dex_celery.model.policy import PolicySnapshot
from dex_celery.model.records import ToolCallRecord
from dex_celery.settings import Settings
from dex_celery.store.repository import Store
from dex_celery.store.values import Outcome, arguments_json
from dex_celery.tools.redact import redacted_kwargs_repr
from dex_celery.tools.tool import TASK_PREFIX

if TYPE_CHECKING:
    from celery import Celery

    from dex_celery.ledger.ledger import Ledger

log = logging.getLogger("dex_celery.engine.steps")

_PUBLISH_RETRY = {
    "max_retries": 3,
    "interval_start": 0.0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}


@dataclass(frozen=True, slots=True)
class AttemptMessage:
    """What a Celery message of one attempt carries; enough to publish a retry."""

    tool_name: str
    key: str
    arguments: Mapping[str, Any]  # as stored: secret values are `***`
    policy: PolicySnapshot
    sealed: str | None = None  # the secret values, sealed (dex_celery/tools/sealing.py)
    #: The request's trace context, for a message published outside its spans (the sweeper's
    #: retries and starts); a publisher inside a live span sends its own (`send`).
    trace: Mapping[str, str] | None = None
    #: A person approved the call: its worker's claim consumes the approval, bound to the
    #: tool and arguments it was given for (S13.3, `Worker._claim_approved`).
    approved: bool = False


@dataclass(frozen=True, slots=True)
class Ran:
    """What the worker that ran the attempt brings to the step of its own finish
    (`Worker._finish`): what the tool returned, and where a decided outcome goes. Its task's
    state tells Flower how the attempt ended, so no task event is sent for it."""

    attempt: int
    cause: Cause
    payload: str
    #: Hands a FINISHED step's outcome to the outcome writer (batched, off the task's path; the
    #: worker's recorder process with the prefork pool).
    write: Callable[[Outcome], None]

    @property
    def result(self) -> str | None:
        """The tool's result: its payload when it returned."""
        return self.payload if self.cause is Cause.OK else None


@dataclass(frozen=True, slots=True)
class Acted:
    """What `Steps.apply` did: the outcome it recorded or handed on (FINISHED), whether it
    published the next attempt (RETRY), whether it kept a late result."""

    outcome: Outcome | None = None
    retried: bool = False
    late: bool = False


class Steps:
    """Acts on ledger steps and publishes attempts; one per process, built by `runtime`."""

    def __init__(self, celery: Celery, ledger: Ledger, store: Store, settings: Settings) -> None:
        self.celery = celery
        self.ledger = ledger
        self.store = store
        self.settings = settings

    def apply(
        self,
        key: str,
        step: Step,
        *,
        message: AttemptMessage | None = None,
        result: str | None = None,
        announce: bool = True,
        ran: Ran | None = None,
    ) -> Acted:
        """Act on the step a ledger transition returned (the table above). Only the
        transition's winner calls this.

        `message`: the attempt's message, if the caller has it (a retry otherwise reads it from
        SQL). `result`: a FINISHED step's result, if the caller has it. `announce`: send the
        ended attempt's task event for Flower (`task_events`); the worker's own steps pass False
        (`ran`, a lost pool child), its task state or its own event says it.
        """
        late = ran is not None and (step.kind is StepKind.LATE or bool(step.late_result))
        if ran is not None and late:
            self._keep_late(key, ran)
        if step.kind is StepKind.RETRY:
            if message is None:
                # A retry (rare) reads the policy snapshot back from SQL; the common path costs
                # nothing.
                message = self.message_from_record(key)
            log.info("retrying %s: attempt %d after %.2fs", key, step.attempt, step.delay)
            if announce and ran is None:
                announce_decided(self.celery, self.settings, key, step.attempt - 1, None)
            self.publish(message, attempt=step.attempt)
            return Acted(retried=True, late=late)
        if step.kind is StepKind.FINISHED:
            if ran is not None:
                # The ledger holds the outcome now; SQL gets it in the writer's next batch.
                outcome = outcome_of(step, ran.result)
                ran.write(outcome)
                return Acted(outcome=outcome, late=late)
            outcome = self.record(key, step, result=result)
            if announce:
                announce_decided(self.celery, self.settings, key, step.attempt, outcome)
            return Acted(outcome=outcome, late=late)
        return Acted(late=late)

    def _keep_late(self, key: str, ran: Ran) -> None:
        """Fenced, or past start-to-close: the outcome stands; this is evidence only (S5.2)."""
        log.warning("attempt %d of %s finished too late; kept as a late result", ran.attempt, key)
        evidence = {"attempt": ran.attempt, "cause": ran.cause.value, "payload": ran.payload}
        self.store.record_late_result(key, json.dumps(evidence))
        announce_repeat_evidence(self.store, self.ledger.events, key, LATE_RESULT)

    def publish(self, message: AttemptMessage, *, attempt: int, producer: Any = None) -> None:
        """Send attempt `attempt` now; if the broker refuses it, it ends as never reached.

        A refused attempt is expired in the ledger, whose step may be a retry: the loop then
        sends the next attempt (no recursion through `apply`), until one is sent or the call
        has ended. A retry's backoff is not a Celery countdown: an ETA is computed on the
        publisher's clock and waited out on the worker's, so skewed hosts would run it early or
        let it expire. The ledger holds the retry's `not_before` on Redis's clock and its claim
        waits it out.
        """
        while True:
            refused = self.send(message, attempt, producer)
            if refused is None:
                return
            step = self.ledger.expire(
                message.key,
                attempt,
                unpublished=True,
                detail=f"the broker refused the message: {refused}",
            )
            if step.kind is not StepKind.RETRY:
                self.apply(message.key, step, message=message)
                return
            log.info("retrying %s: attempt %d after %.2fs", message.key, step.attempt, step.delay)
            announce_decided(self.celery, self.settings, message.key, attempt, None)
            attempt = step.attempt

    def send(self, message: AttemptMessage, attempt: int, producer: Any) -> Exception | None:
        """Publish one attempt's task message; the broker's error if it refused it."""
        key = CallKey.parse(message.key)
        shown = {"key": message.key, "attempt": attempt, "arguments": dict(message.arguments)}
        # Arguments travel as JSON text: see `invoke.stored_arguments` (Kombu's type markers).
        kwargs = {
            "key": message.key,
            "attempt": attempt,
            "arguments": arguments_json(message.arguments),
            "sealed": message.sealed,
        }
        if message.approved:  # only then: a message of any other call is unchanged
            kwargs["approved"] = True
        # The trace context travels in the message's headers: the live span's (the request's,
        # or the attempt's whose retry this is), else the one kept with the call (a sweeper's
        # retry); none without tracing.
        headers = tracing.carrier() or message.trace
        try:
            self.celery.send_task(
                TASK_PREFIX + message.tool_name,
                kwargs=kwargs,
                task_id=key.task_id(attempt),
                soft_time_limit=message.policy.start_to_close,
                argsrepr="()",
                kwargsrepr=redacted_kwargs_repr(shown, message.policy.secret_arguments),
                add_to_parent=False,
                producer=producer,
                retry=True,
                retry_policy=_PUBLISH_RETRY,
                headers=dict(headers) if headers else None,
            )
        except Exception as e:  # kombu raises several unrelated types for a broker that is down
            log.warning(
                "%s", PublishError(f"could not publish attempt {attempt} of {message.key}: {e}")
            )
            return e
        return None

    def record(self, key: str, step: Step, *, result: str | None = None) -> Outcome:
        """Write a decided outcome to SQL, then release the ledger entry and announce it."""
        if CallStatus(step.status) is CallStatus.SUCCEEDED and result is None:
            entry = self.ledger.read(key)
            result = entry.result if entry is not None else None
        outcome = outcome_of(step, result)
        status, error = outcome.status.value, outcome.error
        # Outside any span (the sweeper, a lost pool child), the record joins the request's
        # trace through the context kept with the call: one read, only when tracing.
        parent = None
        if tracing.enabled() and not tracing.active():
            parent = tracing.loads(self.store.trace_context(key))
        with span(tracing.RECORD, parent, key=key, outcome=outcome.status):
            unclaimed = unclaimed_write_outcome(step)
            if unclaimed is not None and self.store.record_outcome(
                key, unclaimed, effects=fenced_classes()
            ):
                # A write the database never saw claimed: no tool code ran (the write fence).
                outcome = unclaimed
                status, error = outcome.status.value, outcome.error
            elif not self.store.record_outcome(key, outcome):
                record = self.store.get_call(key)
                if (
                    outcome.did_not_run
                    and record is not None
                    and record.status is CallStatus.PENDING
                ):
                    # Refused by the write fence: an attempt of this write was claimed in SQL.
                    outcome = claimed_write_outcome(record, step.attempt, step.log)
                    self.store.record_outcome(key, outcome)
                    record = self.store.get_call(key)
                if record is not None and record.finished:
                    # The event tells what the database holds, whoever wrote it.
                    status, error = record.status.value, record.error or ""
            self.ledger.recorded(key, status=status, error=error)
        return outcome

    def message_from_record(self, key: str) -> AttemptMessage:
        """The message of `key`'s attempts, rebuilt from its record (a retry the sweeper moves)."""
        record = self.store.get_call(key)
        if record is None:
            raise UnknownCall(f"no tool call {key!r} in the store")
        return AttemptMessage(
            record.tool_name,
            key,
            json.loads(record.arguments),
            record.policy,
            record.sealed_arguments,
            tracing.loads(record.trace_context),
            approved=record.approved_digest is not None,
        )


#: Ends after which a fenced write may be judged from SQL: the ledger cannot tell whether tool
#: code ran (lost, timed out) or knows it did not (the claim was given up unconfirmed).
_JUDGED_FROM_SQL = frozenset(
    r.value for r in (EndReason.LOST, EndReason.TIMED_OUT, EndReason.CLAIM_UNCONFIRMED)
)


def unclaimed_write_outcome(step: Step) -> Outcome | None:
    """What a FINISHED step becomes if its call is a write the database never saw claimed
    (`did_not_run`, so the store writes it only while no claim exists); None when SQL cannot
    improve on the ledger's word (a success, a tool's own error, a step that never reached a
    worker, which says "did not run" already).

    The write fence (docs/ledger.md) lets no tool code of a write run before its claim is
    committed in SQL, and the conditional update that records this outcome requires that no
    claim exists and the call is still pending, so a claim committed later changes no row and
    its worker runs nothing. The ledger alone would call such a write "lost after the tool
    started" (a worker killed, or cut off from the database, between its two claims).
    """
    if step.reason not in _JUDGED_FROM_SQL:
        return None
    return Outcome(
        CallStatus.FAILED,
        unclaimed_write_text(step.detail, max(step.attempt, 1)),
        attempts=step.attempt,
        attempt_log=step.log,
        did_not_run=True,
    )


def claimed_write(record: ToolCallRecord) -> bool:
    """The call's class is fenced (its row of `model/effects.py`) and the system of record holds
    a claim of it: an attempt may have run its tool code, so it never runs again (S3.2)."""
    return traits_of(record.effect).fenced and record.claimed_by is not None


def claimed_write_outcome(
    record: ToolCallRecord, attempts: int, log_json: str | None = None
) -> Outcome:
    """The one rule for a claimed write whose ledger entry was lost (S10.2): the system of
    record holds a claim of this write but the ledger no longer knows what became of it (Redis
    lost data or went back in time), so the tool may have run: `outcome_unknown`, never run
    again. Used by the dispatcher (the ledger said "did not run") and the sweeper (an orphan)."""
    detail = (
        "the ledger lost track of it while it was in flight (Redis lost data or went back in "
        f"time), and the database shows it was claimed by {record.claimed_by or 'a worker'}"
    )
    return Outcome(
        CallStatus.OUTCOME_UNKNOWN,
        error_text(CallStatus.OUTCOME_UNKNOWN, EndReason.LOST, detail, max(attempts, 1)),
        attempts=attempts,
        attempt_log=log_json,
    )
