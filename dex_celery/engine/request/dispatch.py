"""Requests become records, and new pending records first attempts: the requesters' side.

`Dispatcher.request` is the client's side of flow (validate, record, open, publish;
docs/ledger.md); `Dispatcher.check` refuses a bad request before anything is written. Opening and
publishing a first attempt is `opening.py`; acting on the step a ledger transition returns is
`engine/steps.py`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dex_celery.engine import tracing
from dex_celery.engine.decided_outcomes import decided
from dex_celery.engine.request.previews import request_previews
from dex_celery.engine.request.request_errors import recorded_not_started, recording_unconfirmed
from dex_celery.engine.tracing import span
from dex_celery.errors import (
    ArgumentsTooLarge,
    CallConflict,
    CommitUnconfirmed,
    ConfigurationError,
    DexError,
    InvalidArguments,
)
from dex_celery.model.argument_shape import MAX_ARGUMENT_DEPTH, lone_surrogate, too_deep
from dex_celery.model.budgets import BudgetCharge, budgets_for, charge_of
from dex_celery.model.effects import EffectClass
from dex_celery.model.event_types import EventType
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import PolicySnapshot, ToolPolicy, resolve_policy
from dex_celery.model.records import ToolCallRecord
from dex_celery.model.repeat_rule import RepeatHazard, judge_repeat
from dex_celery.store.repeat_guards import RepeatCheck
from dex_celery.store.values import Admission, NewCall, arguments_json
from dex_celery.tools.call_identity import identify, identity_text
from dex_celery.tools.definition_digest import definition_digest
from dex_celery.tools.sealing import seal, split_secrets
from dex_celery.tools.tool import Tool, find_tool

if TYPE_CHECKING:
    from dex_celery.engine.request.opening import Opener

log = logging.getLogger("dex_celery.engine.request.dispatch")


#: Tool arguments as a caller gives them: a JSON object, or its text (`parse_arguments` checks
#: either the same way).
GivenArguments = Mapping[str, Any] | str


@dataclass(frozen=True, slots=True)
class CallRequest:
    """One tool call the model asked for."""

    session_id: str
    turn_id: str
    tool_call_id: str
    tool_name: str
    arguments: GivenArguments
    #: Who the app acts for (a user or tenant): the scope of budgets kept per principal (S13.1).
    principal: str | None = None


def parse_arguments(arguments: GivenArguments, *, limit: int) -> tuple[dict[str, Any], str]:
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
    """Records requests and starts the new calls; one per process, built by `runtime`.

    It records and starts calls in the deployment its `Opener` opens them in: the broker, ledger,
    store, epoch and settings are the opener's own, so the two can never disagree."""

    def __init__(self, tools: Mapping[str, Tool], opener: Opener) -> None:
        self.tools = tools
        self.opener = opener
        self.celery = opener.celery
        self.ledger = opener.ledger
        self.store = opener.store
        self.epoch = opener.epoch
        self.settings = opener.settings

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
            moved = self.opener.start_new(to_start, by_key, sealed)
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
        caller may already have been told: `engine/decided_outcomes.py`), so the common cases cost no Redis
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
