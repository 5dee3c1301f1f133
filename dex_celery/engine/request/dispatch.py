"""Requests become records, records become attempts, ledger steps become actions.

`Dispatcher.request` is the client's side of flow (validate, record, open, publish; docs/ledger.md).
`Dispatcher.apply` is shared by the worker, the fast path and the sweeper: whoever wins a ledger
transition acts on its step (publish the next attempt, record the outcome, keep a late result).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dex_celery.engine import tracing
from dex_celery.engine.decided import decided, outcome_of
from dex_celery.engine.request.budget_admission import charge_args, needs_rebuild, over_budget
from dex_celery.engine.request.previews import request_previews
from dex_celery.engine.request.publish_capture import can_capture, capture
from dex_celery.engine.request.request_errors import recorded_not_started, recording_unconfirmed
from dex_celery.engine.task_events import announce_decided
from dex_celery.engine.tracing import span
from dex_celery.errors import (
    ArgumentsTooLarge,
    CallConflict,
    CommitUnconfirmed,
    ConfigurationError,
    DexError,
    InvalidArguments,
    PublishError,
    UnknownCall,
)
from dex_celery.ledger.ledger import BrokerCommand, OpenResult, Step, StepKind
from dex_celery.model.argument_shape import MAX_ARGUMENT_DEPTH, lone_surrogate, too_deep
from dex_celery.model.budgets import BudgetCharge, budgets_for, charge_of
from dex_celery.model.effects import EffectClass, fenced_classes, traits_of
from dex_celery.model.event_types import EventType
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus, EndReason, error_text, unclaimed_write_text
from dex_celery.model.policy import PolicySnapshot, ToolPolicy, resolve_policy
from dex_celery.model.records import ToolCallRecord
from dex_celery.model.repeat_rule import RepeatHazard, judge_repeat
from dex_celery.settings import Settings
from dex_celery.store.repeat_guards import RepeatCheck
from dex_celery.store.repository import Store
from dex_celery.store.values import Admission, NewCall, Outcome, arguments_json
from dex_celery.tools.call_identity import identify, identity_text
from dex_celery.tools.definition_digest import definition_digest
from dex_celery.tools.redact import redacted_kwargs_repr
from dex_celery.tools.sealing import seal, split_secrets
from dex_celery.tools.tool import TASK_PREFIX, Tool, find_tool

if TYPE_CHECKING:
    from celery import Celery

    from dex_celery.engine.epoch import LedgerEpoch
    from dex_celery.ledger.ledger import Ledger

log = logging.getLogger("dex_celery.engine.request.dispatch")

_PUBLISH_RETRY = {
    "max_retries": 3,
    "interval_start": 0.0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}


@dataclass(frozen=True, slots=True)
class CallRequest:
    """One tool call the model asked for."""

    session_id: str
    turn_id: str
    tool_call_id: str
    tool_name: str
    arguments: Mapping[str, Any] | str
    #: Who the app acts for (a user or tenant): the scope of budgets kept per principal (S13.1).
    principal: str | None = None


@dataclass(frozen=True, slots=True)
class AttemptMessage:
    """What a Celery message of one attempt carries; enough to publish a retry."""

    tool_name: str
    key: str
    arguments: Mapping[str, Any]  # as stored: secret values are `***`
    policy: PolicySnapshot
    sealed: str | None = None  # the secret values, sealed (dex_celery/tools/sealing.py)
    #: The request's trace context, for a message published outside its spans (the sweeper's
    #: retries and starts); a publisher inside a live span sends its own (`_send`).
    trace: Mapping[str, str] | None = None
    #: A person approved the call: its worker's claim consumes the approval, bound to the
    #: tool and arguments it was given for (S13.3, `Worker._claim_approved`).
    approved: bool = False


def parse_arguments(
    arguments: Mapping[str, Any] | str, *, limit: int
) -> tuple[dict[str, Any], str]:
    """Arguments must be a JSON object within the size limit (S9.3). Returns (dict, JSON text)."""
    deep = InvalidArguments(f"tool arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels")
    if isinstance(arguments, str | bytes):
        try:
            value = json.loads(arguments)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidArguments(f"tool arguments are not valid JSON: {e}") from e
        except RecursionError:
            raise deep from None
    else:
        value = arguments
    if not isinstance(value, Mapping):
        raise InvalidArguments(f"tool arguments must be a JSON object, got {type(value).__name__}")
    bad_names = [k for k in value if not isinstance(k, str)]
    if bad_names:
        # They become keyword arguments of the tool; JSON would silently turn 1 into "1".
        raise InvalidArguments(f"tool argument names must be strings, got {bad_names[0]!r}")
    if too_deep(value):
        raise deep
    try:
        text = arguments_json(value)
    except (TypeError, ValueError) as e:
        raise InvalidArguments(f"tool arguments cannot be encoded as JSON: {e}") from e
    at = lone_surrogate(text)
    if at is not None:
        raise InvalidArguments(
            "tool arguments hold a lone surrogate (text that is not Unicode) near "
            f"{text[max(0, at - 20) : at]!r}"
        )
    size = len(text.encode())
    if size > limit:
        raise ArgumentsTooLarge(f"tool arguments are {size} bytes; the limit is {limit} bytes")
    return dict(value), text


class Dispatcher:
    """Starts calls and acts on ledger steps; one per process, built by `Dex` (`runtime`)."""

    def __init__(
        self,
        celery: Celery,
        ledger: Ledger,
        store: Store,
        epoch: LedgerEpoch,
        tools: Mapping[str, Tool],
        settings: Settings,
    ) -> None:
        self.celery = celery
        self.ledger = ledger
        self.store = store
        self.epoch = epoch
        self.tools = tools
        self.settings = settings
        #: Whether first attempts are published by the ledger's open (decided at the first
        #: request: the broker's channel tells, `engine/request/publish_capture.py`).
        self._capturing: bool | None = None

    # --- requests ------------------------------------------------------------------------------

    def request(self, requests: Sequence[CallRequest]) -> list[ToolCallRecord]:
        """`_request` inside a `dex.request` span (key, effect and status of a single call)."""
        with span(tracing.REQUEST, calls=len(requests)) as traced:
            records = self._request(requests)
            if traced.live and len(records) == 1:
                traced.set("key", records[0].key)
                traced.set("effect", records[0].effect)
                traced.set("status", records[0].status)
            sessions = {r.session_id for r in records} if traced.live else set()
            if len(sessions) == 1:  # a turn's calls: one session, one timeline page
                tracing.name_session(traced, sessions.pop(), self.settings.web_base_url)
            return records

    def _request(self, requests: Sequence[CallRequest]) -> list[ToolCallRecord]:
        """Record and dispatch calls of one turn in one transaction; duplicates return as is.

        Everything is validated before anything is written, so a bad request in the batch
        leaves no record of any of them (S9.3).
        """
        prepared: list[tuple[NewCall, dict[str, Any]]] = []
        seen: dict[str, NewCall] = {}
        # The request span's context, kept with each call for whoever acts on it later.
        context = tracing.dumps(tracing.carrier())
        for req in requests:
            new, arguments = self.check(req)
            if context is not None:
                new = replace(new, trace_context=context)
            if new.key.key in seen:
                same_call(seen[new.key.key], new.tool_name, new.arguments, new.identity)
                continue
            seen[new.key.key] = new
            prepared.append((new, arguments))
        if not prepared:
            return []
        epoch = self.epoch.recorded()
        try:
            results = self.store.insert_calls(
                [n for n, _ in prepared],
                epoch=epoch,
                check=lambda new, known: same_call(
                    new,
                    known.tool_name,
                    known.arguments,
                    self._identity_of(known) if known.arguments != new.arguments else None,
                ),
                repeats=RepeatCheck(self._judge_repeat, hold_back),
            )
        except CommitUnconfirmed as e:
            raise recording_unconfirmed([n.key.key for n, _ in prepared], e) from e
        by_key = {n.key.key: args for n, args in prepared}
        sealed = {n.key.key: n.sealed for n, _ in prepared}
        to_start: list[ToolCallRecord] = []
        try:
            for record, created in results:
                if created:
                    self._announce_request(record)
                    if record.status is CallStatus.PENDING:
                        to_start.append(record)
            moved = self._start_many(to_start, by_key, sealed)
        except Exception as e:
            # The insert is committed: these calls exist and the sweeper will start them. An
            # error that let the caller believe otherwise would make it ask under new ids and
            # run a write twice (S11.2).
            records = tuple(record for record, _ in results)
            created_keys = {record.key for record, created in results if created}
            raise recorded_not_started(records, created_keys, e, self.settings) from e
        # A call over its budget waits for a person or was rejected (S13.1): as it is now.
        now = [moved.get(record.key, record) for record, _ in results]
        # A new call that waits for a person gets its tool's preview run on a worker (S13.5).
        waiting = [r for r, (_, created) in zip(now, results, strict=True) if created]
        request_previews(self.celery, self.settings, self.tools, waiting)
        return now

    def check(self, req: CallRequest) -> tuple[NewCall, dict[str, Any]]:
        """Everything about one request that can be refused without writing (S9.3): ids, tool,
        JSON, size, the tool's own check (`call_identity.identify`); secrets are sealed here.

        Returns the call to record and its arguments as stored (secret values `***`).
        """
        settings = self.settings
        key = CallKey.of(req.session_id, req.turn_id, req.tool_call_id)
        tool = find_tool(self.tools, req.tool_name)
        arguments, _ = parse_arguments(req.arguments, limit=settings.max_argument_bytes)
        # The tool's own check, and the call as the tool will receive it (S12.2).
        identity = identify(tool, arguments, settings.secret_key)
        shown, secrets = split_secrets(arguments, tool.policy.secret_arguments)
        token = seal(secrets, settings.secret_key)
        stored = arguments_json(shown)

        policy = tool.policy
        pin = tool.approval_gate() if tool.approval_gate is not None else None
        if pin is not None:
            # The tool changed since a person accepted it: ask one before this call runs.
            policy = replace(policy, requires_approval=True)

        def resolve(
            default: EffectClass | None, now: float, tool: Tool = tool, policy: ToolPolicy = policy
        ) -> Admission:
            return admit(resolve_policy(policy, tool.annotations, default, settings), now)

        new = NewCall(
            key,
            tool.name,
            stored,
            resolve,
            sealed=token,
            repeat_digest=identity.fingerprint,
            identity=identity.text,
            charges=self._charges(tool, identity.received, req),
            definition_digest=definition_digest(tool, pin),
        )
        return new, shown

    def _charges(
        self, tool: Tool, received: Mapping[str, Any], req: CallRequest
    ) -> tuple[BudgetCharge, ...]:
        """What the call owes each write budget it draws on (S13.1), from the arguments the
        tool receives."""
        budgets = budgets_for(tool.name, tool.policy.budgets, self.settings.budget_list)
        if not budgets:
            return ()
        if self.settings.ledger_shards > 1:
            raise ConfigurationError(
                f"tool {tool.name!r} draws on write budgets, which need a ledger of one shard"
            )
        return tuple(
            charge_of(
                b,
                received,
                session_id=req.session_id,
                principal=req.principal,
                tool_name=tool.name,
            )
            for b in budgets
        )

    def _identity_of(self, known: ToolCallRecord) -> str | None:
        """The recorded call's `identity_text` (S12.2) from its stored arguments; None when it
        cannot be told (the tool is gone, or its arguments no longer pass its check: a secret
        stored as `***` where the tool wants a number)."""
        tool = self.tools.get(known.tool_name)
        if tool is None:
            return None
        try:
            return identity_text(tool, json.loads(known.arguments))
        except (DexError, ValueError, TypeError):
            return None

    def _judge_repeat(
        self, earlier: ToolCallRecord, reconciled: bool, window: float
    ) -> RepeatHazard | None:
        """The repeat guard's judgement of the last identical call that passed it (S5.4);
        `window` is the new call's `repeat_window`. The ledger is asked only about a failed call
        without a late result (a fenced attempt whose tool may go on), or about one SQL still
        shows pending (its outcome may be decided in the ledger and not yet recorded, as its
        caller may already have been told: `engine/decided.py`), so the common cases cost no Redis
        round trip."""
        if earlier.status is CallStatus.PENDING:
            earlier = decided(earlier, self.ledger.read(earlier.key))
        running = (
            earlier.status is CallStatus.FAILED
            and earlier.late_result is None
            and self.ledger.still_running(earlier.key)
        )
        return judge_repeat(
            earlier,
            reconciled=reconciled,
            still_running=running,
            now=self.ledger.now(),
            window=window,
        )

    def _start_many(
        self,
        records: Sequence[ToolCallRecord],
        arguments: Mapping[str, Mapping[str, Any]],
        sealed: Mapping[str, str | None],
    ) -> dict[str, ToolCallRecord]:
        """Open the new calls of one request in one round trip, then publish each.

        A requester that stalled after its insert for a good part of the orphan grace may find
        that the sweeper started (and even finished) these calls meanwhile: those go through
        `start`, which opens only what the database still has in flight.
        """
        now = self.ledger.now()
        late = {r.key for r in records if now - r.requested_at > self.settings.orphan_grace / 2}
        for record in records:
            if record.key in late:
                self.start(record, arguments[record.key])
        records = [r for r in records if r.key not in late]
        if not records:
            return {}
        messages = [
            AttemptMessage(
                record.tool_name,
                record.key,
                arguments[record.key],
                record.policy,
                sealed[record.key],
                tracing.loads(record.trace_context),
            )
            for record in records
        ]
        calls = [(r.key, r.policy) for r in records]
        budgets = [charge_args(self.ledger, r) if r.budgets else () for r in records]
        with self.celery.producer_or_acquire() as producer:  # one producer for the batch
            sends = self._captured(messages, producer)
            # With `sends`, each open publishes its own message when it opens the call: opening
            # and publishing are one atomic step, one round trip for the batch; so are its
            # budgets' reservations (S13.1).
            replies = self.ledger.open_replies(
                calls,
                epoch=self.epoch.current(),
                sends=sends,
                budgets=budgets if any(budgets) else None,
            )
            if sends is None:
                for message, reply in zip(messages, replies, strict=True):
                    if reply.result is OpenResult.OPENED:
                        self.publish(message, attempt=1, producer=producer)
        moved: dict[str, ToolCallRecord] = {}
        for record, reply in zip(records, replies, strict=True):
            result = reply.result
            if result in (OpenResult.EPOCH_CHANGED, OpenResult.REBUILD):
                # Refreshes the epoch, or counts a budget from SQL, and reopens.
                now_record = self.start(record)
                if now_record is not None:
                    moved[record.key] = now_record
            elif result is OpenResult.OVER_BUDGET:
                now_record = over_budget(self.ledger, self.store, record, reply)
                if now_record is not None:
                    moved[record.key] = now_record
            elif result is OpenResult.EXISTS:
                log.info("call %s already has a ledger entry; not publishing", record.key)
        return moved

    def _captured(
        self, messages: Sequence[AttemptMessage], producer: Any
    ) -> list[list[BrokerCommand]] | None:
        """The broker commands of each first attempt, for the ledger's open to run, where the
        broker is the ledger's own Redis (`engine/request/publish_capture.py`); None where it is not, or
        where any message cannot be taken that way (each is then published after its open)."""
        if self._capturing is None:
            self._capturing = can_capture(
                producer,
                self.celery.conf.broker_url,
                self.settings.redis_url,
                self.ledger.may_publish,
            )
        if not self._capturing:
            return None
        sends: list[list[BrokerCommand]] = []
        for message in messages:
            commands = capture(producer, functools.partial(self._send, message, 1))
            if commands is None:
                return None
            sends.append(commands)
        return sends

    def _announce_request(self, record: ToolCallRecord) -> None:
        if record.status is CallStatus.AWAITING_APPROVAL:
            events = self.ledger.events
            events.publish(EventType.TOOL_CALL_REQUESTED, record.key, effect=record.effect.value)
            if record.repeat_of is not None:
                events.publish(
                    EventType.TOOL_CALL_REPEAT_HELD,
                    record.key,
                    earlier=record.repeat_of,
                    reason=record.repeat_reason or "",
                )
            events.publish(
                EventType.TOOL_CALL_AWAITING_APPROVAL,
                record.key,
                deadline=str(record.approval_deadline or ""),
                repeat_of=record.repeat_of or "",
                reason=record.repeat_reason or "",
            )

    def start(
        self,
        record: ToolCallRecord,
        arguments: Mapping[str, Any] | None = None,
        *,
        may_have_run: bool = False,
    ) -> ToolCallRecord | None:
        """Open attempt 1 and publish it. Safe to call twice: only one open succeeds.

        `may_have_run`: the call was open in a ledger that lost its data (see `Ledger.open`).
        Returns the record as it became when a write budget had too little left (it waits for a
        person, or was rejected: S13.1); None otherwise.
        """
        ledger = self.ledger
        current = self._may_open(record)
        if current is None:
            return None
        # The record as the database has it now: a person's approval admits it over budget.
        record = current
        # A call that waited for approval announced its request already.
        announce = record.approval is None
        # A person's approval lets the call pass a write freeze begun before it (S13.2).
        approval = record.approval
        passed = approval.decided_at if approval and approval.decision == "approved" else None
        budgets = charge_args(ledger, record) if record.budgets else ()
        refresh = False
        for _ in range(4):
            epoch = self.epoch.current(refresh=refresh)
            (reply,) = ledger.open_replies(
                [(record.key, record.policy)],
                epoch=epoch,
                announce=announce,
                may_have_run=may_have_run,
                budgets=[budgets] if budgets else None,
                passed=passed,
            )
            if reply.result is OpenResult.EPOCH_CHANGED:
                # The ledger started a new life since this process last looked (the one place an
                # epoch change is handled when opening): open the call under the epoch in force.
                # A write still runs only after its claim in SQL, so this cannot run it twice.
                refresh = True
            elif reply.result is OpenResult.REBUILD:
                needs_rebuild(ledger, self.store, epoch, record, reply)
            else:
                break
        if reply.result is OpenResult.OVER_BUDGET:
            return over_budget(ledger, self.store, record, reply)
        if reply.result is not OpenResult.OPENED:
            log.info(
                "call %s already has a ledger entry (%s); not publishing", record.key, reply.result
            )
            return None
        if arguments is None:
            arguments = json.loads(record.arguments)
        message = AttemptMessage(
            record.tool_name,
            record.key,
            arguments,
            record.policy,
            record.sealed_arguments,
            tracing.loads(record.trace_context),
            approved=record.approved_digest is not None,
        )
        self.publish(message, attempt=1)
        return None

    def _may_open(self, record: ToolCallRecord) -> ToolCallRecord | None:
        """Open only what the system of record still has in flight (and, for a write, not yet
        claimed): a requester or sweeper acting on an old read of the record must not start a
        call that has ended or whose write was claimed meanwhile (docs/ledger.md). Returns the
        record as it is now, or None."""
        current = self.store.get_call(record.key)
        if current is None or current.status is not CallStatus.PENDING:
            log.info("call %s is no longer pending in the database; not opening it", record.key)
            return None
        if claimed_write(current):
            log.warning("write %s was claimed already; not opening it again", record.key)
            return None
        return current

    # --- attempts ------------------------------------------------------------------------------

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
            refused = self._send(message, attempt, producer)
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

    def _send(self, message: AttemptMessage, attempt: int, producer: Any) -> Exception | None:
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

    def apply(
        self,
        key: str,
        step: Step,
        *,
        message: AttemptMessage | None = None,
        result: str | None = None,
        announce: bool = True,
    ) -> Outcome | None:
        """Act on the step a ledger transition returned. Only the transition's winner calls this.

        `announce`: send the ended attempt's task event for Flower (`task_events`); the worker
        running the attempt passes False, its own task state says it. Returns the recorded
        outcome of a FINISHED step.
        """
        if step.kind is StepKind.RETRY:
            if message is None:
                message = self._message_from_record(key)
            log.info("retrying %s: attempt %d after %.2fs", key, step.attempt, step.delay)
            if announce:
                announce_decided(self.celery, self.settings, key, step.attempt - 1, None)
            self.publish(message, attempt=step.attempt)
        elif step.kind is StepKind.FINISHED:
            outcome = self.record(key, step, result=result)
            if announce:
                announce_decided(self.celery, self.settings, key, step.attempt, outcome)
            return outcome
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

    def _message_from_record(self, key: str) -> AttemptMessage:
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


def same_call(new: NewCall, tool_name: str, arguments: str, identity: str | None = None) -> None:
    """Same ids are the same call only with the same tool and arguments (S2.3); otherwise a
    `CallConflict`. Arguments compare as the tool receives them (S12.2, `identity`: the known
    call's `identity_text`), or in their stored canonical form (secret values `***`)."""
    if tool_name != new.tool_name:
        raise CallConflict(
            f"tool call {new.key.key} was requested before for tool {tool_name!r}, not "
            f"{new.tool_name!r}; use a new tool-call id for a new call"
        )
    if arguments != new.arguments and (identity is None or identity != new.identity):
        raise CallConflict(
            f"tool call {new.key.key} was requested before with other arguments; use a new "
            "tool-call id for a new call"
        )


def admit(policy: PolicySnapshot, now: float) -> Admission:
    """The approval rule (S6.1): a call whose policy requires approval waits for a person until
    `now + approval_timeout`; any other is pending at once."""
    if policy.requires_approval:
        return Admission(policy, CallStatus.AWAITING_APPROVAL, now + policy.approval_timeout)
    return Admission(policy, CallStatus.PENDING)


def hold_back(admission: Admission, hazard: RepeatHazard, now: float) -> Admission:
    """The repeat guard's admission (S5.4): a call identical to one that may still be running or
    may have taken effect waits for a person, even where its policy needs none, until the
    policy's approval timeout (a call that waits anyway keeps its deadline)."""
    if admission.status is CallStatus.AWAITING_APPROVAL:
        return admission
    policy = admission.policy
    return Admission(policy, CallStatus.AWAITING_APPROVAL, now + policy.approval_timeout)


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
