"""What every agent-framework adapter does the same way: the one call path (request, a
person's decision, the wait, the text the model reads), the session id, the turn rule, and
finding the tools.

Every adapter (one module per framework) only names a call in its framework's terms (a
`FrameworkCall`: session, turn, tool call id, arguments, the history that led to it) and asks
for a person's decision its framework's way; `FrameworkBridge.call` / `acall` do the rest, so
they all agree on:

- the session id: `session_id=` (a string, or a function of the framework's context), else the
  framework's own id (`resolve_session`);
- the turn id: `turn-<n>`, where `n` counts the model responses of the conversation up to and
  including the one that made the call (the first model response is `turn-1`;
  `responses_through`); every framework keeps that count in what it resumes from (the SDK's run
  usage, Pydantic AI's message history, LangGraph's checkpointed messages, ADK's session
  events, ...), so a resumed run asks for the same key (S2.1);
- a request: the conversation that led to the call is copied into the session, scrubbed of the
  call's secrets (S12.1), then `Decisions.request` gives the call's record, or the text the
  model reads when there is none (arguments or ids refused; recorded, or maybe, but not
  started: S11.2); a person asked to approve sees `shown_request` (secrets `***`);
- a decision (`Decision`): approving records the person in dex and dispatches the call under
  its recorded policy (S6.2); rejecting, or approving other arguments than the model asked for
  (`CHANGED_ARGUMENTS_REASON`), records the call `rejected` with who decided, so no call a
  person turned down is left without a record;
- the text: exactly the record's TOOL message (S4.4), or a sentence saying the call is still
  waiting for a person or still in flight, with `CallProgress` reports while it waits.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypedDict, TypeVar

from dex_celery.client.dex_client import AsyncDexClient, DexClient
from dex_celery.engine import PendingApproval, RuntimeSource, asettled_preview, settled_preview
from dex_celery.errors import (
    ApprovalError,
    CallTimeout,
    InvalidDecision,
    InvalidRequest,
    RequestInFlight,
)
from dex_celery.integrations.conversation import Conversation, call_secrets
from dex_celery.model.approval_binding import edited_note, with_note
from dex_celery.model.conversation import SeenMessage
from dex_celery.model.outcomes import CallStatus, tool_output
from dex_celery.model.records import ToolCallRecord
from dex_celery.model.times import format_utc
from dex_celery.tools.call_identity import canonical_json, json_number_form
from dex_celery.tools.tool import Tool, find_tool

log = logging.getLogger(__name__)

#: How often (seconds) a call the model is waiting for reports that it still waits.
PROGRESS_EVERY = 5.0
#: How long (seconds) a framework's tool waits for its call before the model reads that it runs.
WAIT_TIMEOUT = 300.0

#: The note dex records with an approval given through a framework.
APPROVED_NOTE = "approved in the {framework} run"
#: The reason recorded when an approval came with changed arguments (see `changed_arguments`).
CHANGED_ARGUMENTS_REASON = (
    "the approval changed the call's arguments; an approval is of the arguments the model asked "
    "for, so the call was not run (ask the model to call the tool again with the new arguments)"
)


def turn_id(model_responses: int) -> str:
    """The turn id of a call made by the `model_responses`-th model response (1-based)."""
    return f"turn-{max(model_responses, 1)}"


def runtime_source(dex: RuntimeSource | DexClient | AsyncDexClient) -> RuntimeSource:
    """The deployment behind a `Dex`, a `DexClient` or an `AsyncDexClient`."""
    if isinstance(dex, AsyncDexClient):
        return dex.sync.source
    if isinstance(dex, DexClient):
        return dex.source
    return dex


def select_tools(source: RuntimeSource, names: Sequence[str] | None) -> list[Tool]:
    """The named registered tools (`UnknownTool` for a name not registered), or all of them."""
    registered = source.runtime.tools
    if names is None:
        return list(registered.values())
    return [find_tool(registered, name) for name in names]


def same_arguments(requested: Mapping[str, Any], approved: Mapping[str, Any]) -> bool:
    """Whether an approval's arguments are the ones the model asked for (S12.2).

    Compared as JSON values (`10.0` is `10`, `true` is not `1`, key order and spacing never
    count). Both sides are the framework's own objects, with no tool at hand, so neither its
    coercion nor its defaults apply here: the dispatcher decides those when the call is
    requested (a repeat with `"10"` for `10` meets the repeat guard there).
    """
    return _as_json(requested) == _as_json(approved)


def _as_json(arguments: Mapping[str, Any]) -> str:
    return canonical_json(json_number_form(json.loads(json.dumps(arguments, default=str))))


def pending_text(record: ToolCallRecord) -> str:
    """What the model reads for a call still waiting for a person's decision: the deadline as
    a UTC time (`2026-12-05 10:15:00 UTC`), as every time a model or a person reads is."""
    deadline = (
        f" (deadline {format_utc(record.approval_deadline, millis=False)})"
        if record.approval_deadline is not None
        else ""
    )
    text = f"The call {record.key} is waiting for a person's approval{deadline} and has not run."
    if record.rewait_reason:
        # Approved once, but its tool changed before it ran (S13.3): the model reads why.
        text += f" It waits again: {record.rewait_reason}."
    return text


def in_flight_text(record: ToolCallRecord, timeout: float) -> str:
    """What the model reads for a call that did not end within the adapter's wait."""
    return (
        f"The call {record.key} is still in flight after {timeout:g}s; its outcome will be in "
        "the session's history."
    )


def request_in_flight_text(keys: Sequence[str]) -> str:
    """What the model reads when a request is recorded (or may be) but not yet started (S11.2):
    it must not ask again under a new tool-call id, which would be a second call."""
    return (
        f"The call {', '.join(keys)} is recorded (or may be) but could not be started yet; it "
        "will run, or end with a record saying it did not run, once the system recovers, and "
        "its outcome will be in the session's history. Do not call the tool again for the same "
        "purpose."
    )


def shown_request(
    record: ToolCallRecord, tool: Tool, arguments: Mapping[str, Any], preview: str | None = None
) -> dict[str, Any]:
    """What a framework shows the person asked to approve a call: enough to decide, nothing
    secret (the tool's secret arguments are `***`); with `preview`, what the tool's preview
    function says the call would do (S13.5, `Decisions.preview`)."""
    shown = {
        name: "***" if name in tool.policy.secret_arguments else value
        for name, value in arguments.items()
    }
    request = {
        "dex_key": record.key,
        "tool": tool.name,
        "arguments": shown,
        "approval_deadline": record.approval_deadline,
    }
    if preview is not None:
        request["preview"] = preview
    return request


def pending_request(pending: PendingApproval) -> dict[str, Any]:
    """`shown_request` of a call found in the approval listing (its arguments redacted by the
    one display rule, `tools/redact.py`), with its preview (S13.5) or None."""
    return {
        "dex_key": pending.key,
        "tool": pending.tool_name,
        "arguments": pending.arguments,
        "approval_deadline": pending.deadline,
        "preview": pending.preview,
    }


def refused_request_text(error: InvalidRequest | RequestInFlight) -> str:
    """What the model reads of a request that gave no record: bad arguments or ids (nothing was
    recorded), or recorded (or maybe) but not started (never ask again under a new id)."""
    if isinstance(error, RequestInFlight):
        return request_in_flight_text(error.keys)
    return f"Error: {error}"


def record_text(record: ToolCallRecord) -> str:
    """The TOOL message of an ended call: exactly what the session history keeps (S4.4)."""
    text = tool_output(record.status, record.result, record.error or "")
    return with_note(edited_note(record.approval_edit, record.status), text)


@dataclass(frozen=True, slots=True)
class CallProgress:
    """A call the framework is still waiting for: reported every `PROGRESS_EVERY` seconds, so a
    long tool, a queue or a Redis outage is not silence in the framework's run."""

    key: str
    tool: str
    status: CallStatus
    attempts: int
    waited: float
    timeout: float

    def text(self) -> str:
        return (
            f"dex call {self.key} ({self.tool}) is {self.status.value} after {self.waited:.0f}s "
            f"(attempts {self.attempts}; the framework waits up to {self.timeout:g}s)"
        )


ProgressCallback = Callable[[CallProgress], None]


class AdapterOptions(TypedDict, total=False):
    """The keyword options every adapter's tool factory takes (docs/frameworks.md), written once
    so the adapters cannot drift apart.

    - `approver`: who decided, in dex's record, when the framework's answer does not say (the
      adapter's `DEFAULT_APPROVER` when absent);
    - `wait_timeout`: how long a tool waits for its call before the model reads that it still
      runs (`WAIT_TIMEOUT`);
    - `progress`: where the `CallProgress` reports of a long wait go (besides the log).
    """

    approver: str
    wait_timeout: float
    progress: ProgressCallback | None


@dataclass(frozen=True, slots=True)
class WaitPlan:
    """How a framework's tool waits for its call: for how long, where progress goes, and how
    often (`None`: `PROGRESS_EVERY`, read when the wait starts)."""

    timeout: float = WAIT_TIMEOUT
    progress: ProgressCallback | None = None
    every: float | None = None

    @classmethod
    def of(cls, options: AdapterOptions) -> WaitPlan:
        return cls(options.get("wait_timeout", WAIT_TIMEOUT), options.get("progress"))


def report_progress(
    record: ToolCallRecord, waited: float, timeout: float, progress: ProgressCallback | None
) -> None:
    update = CallProgress(
        record.key, record.tool_name, record.status, record.attempts, waited, timeout
    )
    log.info("%s", update.text())
    if progress is not None:
        progress(update)


@dataclass(frozen=True)
class Decision:
    """A person's answer to a waiting dex call, given through a framework (LangGraph's
    `Command(resume=...)`, CrewAI's `decide` callback, ADK's confirmation, ...): what
    `FrameworkBridge.record_decision` records."""

    approved: bool
    decided_by: str | None
    reason: str | None
    edited: bool = False

    def rejection_reason(self) -> str | None:
        """The reason recorded with a rejection: the answer's, or `CHANGED_ARGUMENTS_REASON`
        for an approval of other arguments than the model asked for."""
        return CHANGED_ARGUMENTS_REASON if self.edited else self.reason

    @classmethod
    def parse(cls, value: Any) -> Decision:
        """`InvalidDecision` for a resume value that is not one of the documented shapes."""
        if isinstance(value, bool):
            return cls(value, None, None)
        if isinstance(value, Mapping):
            by = value.get("decided_by")
            reason = value.get("reason", value.get("message"))
            if by is not None and not isinstance(by, str):
                raise InvalidDecision("decided_by must be a string")
            reason = reason if isinstance(reason, str) else None
            kind = value.get("type")
            if kind == "edit" or "args" in value or "edited_action" in value:
                return cls(False, by, reason, edited=True)
            if isinstance(value.get("approved"), bool):
                return cls(bool(value["approved"]), by, reason)
            if kind in ("approve", "accept"):
                return cls(True, by, reason)
            if kind in ("reject", "response"):
                return cls(False, by, reason)
        raise InvalidDecision(
            "a dex approval is resumed with True/False, {'approved': bool, 'decided_by': ...} or "
            f"{{'type': 'approve' | 'reject', ...}}, not {value!r}"
        )


class Decisions:
    """A person's decisions on dex calls, made through a framework, for both client kinds."""

    def __init__(self, source: RuntimeSource, framework: str) -> None:
        self.client = DexClient(source)
        self.aclient = AsyncDexClient(source)
        self.note = APPROVED_NOTE.format(framework=framework)

    # --- the request ---------------------------------------------------------------------

    def request(
        self, session: str, turn: str, call_id: str, tool: str, arguments: Mapping[str, Any] | str
    ) -> ToolCallRecord | str:
        """Request the call: its record, or the text the model reads when there is none."""
        try:
            return self.client.request_call(session, turn, call_id, tool, arguments)
        except (InvalidRequest, RequestInFlight) as e:
            return refused_request_text(e)

    async def arequest(
        self, session: str, turn: str, call_id: str, tool: str, arguments: Mapping[str, Any] | str
    ) -> ToolCallRecord | str:
        """`request` for async code."""
        try:
            return await self.aclient.request_call(session, turn, call_id, tool, arguments)
        except (InvalidRequest, RequestInFlight) as e:
            return refused_request_text(e)

    # --- what the person is shown ----------------------------------------------------------

    def preview(self, record: ToolCallRecord) -> str | None:
        """The preview of a waiting call (S13.5), once a worker kept it or it can no longer
        come (at most `2 x preview_timeout` after the request); None without one."""
        runtime = self.client.source.runtime
        return settled_preview(runtime.store, record, runtime.tools, runtime.settings)

    async def apreview(self, record: ToolCallRecord) -> str | None:
        runtime = self.client.source.runtime
        return await asettled_preview(runtime.store, record, runtime.tools, runtime.settings)

    # --- a person's decision ---------------------------------------------------------------

    def approve(self, record: ToolCallRecord, decided_by: str) -> ToolCallRecord:
        """Approve a waiting call; one decided meanwhile (or expired) keeps its record."""
        if record.status is not CallStatus.AWAITING_APPROVAL:
            return record
        try:
            return self.client.approve(record.key, decided_by, self.note)
        except ApprovalError:
            return self.client.get_call(record.key)

    def reject(self, record: ToolCallRecord, decided_by: str, reason: str | None) -> ToolCallRecord:
        """Reject a waiting call: it ends `rejected`, with who decided, and never runs."""
        if record.status is not CallStatus.AWAITING_APPROVAL:
            return record
        try:
            return self.client.reject(record.key, decided_by, reason or None)
        except ApprovalError:
            return self.client.get_call(record.key)

    async def aapprove(self, record: ToolCallRecord, decided_by: str) -> ToolCallRecord:
        if record.status is not CallStatus.AWAITING_APPROVAL:
            return record
        try:
            return await self.aclient.approve(record.key, decided_by, self.note)
        except ApprovalError:
            return await self.aclient.get_call(record.key)

    async def areject(
        self, record: ToolCallRecord, decided_by: str, reason: str | None
    ) -> ToolCallRecord:
        if record.status is not CallStatus.AWAITING_APPROVAL:
            return record
        try:
            return await self.aclient.reject(record.key, decided_by, reason or None)
        except ApprovalError:
            return await self.aclient.get_call(record.key)

    # --- the model's text -----------------------------------------------------------------

    def text(self, record: ToolCallRecord, plan: WaitPlan) -> str:
        """Wait for a dispatched call to end and return what the model reads of it, reporting
        progress while it waits."""
        wait = _Wait(record, plan)
        while (answer := wait.answer()) is None:
            try:
                (wait.record,) = self.client.wait([wait.record.key], timeout=wait.next_wait())
            except CallTimeout:
                wait.waited(self.client.get_call(wait.record.key))
        return answer

    async def atext(self, record: ToolCallRecord, plan: WaitPlan) -> str:
        """`text` for async frameworks."""
        wait = _Wait(record, plan)
        while (answer := wait.answer()) is None:
            try:
                (wait.record,) = await self.aclient.wait(
                    [wait.record.key], timeout=wait.next_wait()
                )
            except CallTimeout:
                wait.waited(await self.aclient.get_call(wait.record.key))
        return answer


class _Wait:
    """One wait for a call's end, whichever client waits: what the model reads once it may
    stop waiting, how long the next wait lasts, and the progress reports between waits."""

    def __init__(self, record: ToolCallRecord, plan: WaitPlan) -> None:
        self.record = record
        self.timeout = plan.timeout
        self.progress = plan.progress
        self.every = plan.every or PROGRESS_EVERY
        self.started = time.monotonic()

    def answer(self) -> str | None:
        """The model's text once waiting is over (ended, waiting for a person, or out of
        time); None while the call runs and time is left."""
        if self.record.status is CallStatus.AWAITING_APPROVAL:
            return pending_text(self.record)
        if self.record.finished:
            return record_text(self.record)
        if self._remaining() <= 0:
            return in_flight_text(self.record, self.timeout)
        return None

    def next_wait(self) -> float:
        return min(self.every, self._remaining())

    def waited(self, record: ToolCallRecord) -> None:
        """A wait ran out before the call ended: report where it is."""
        self.record = record
        if not record.finished:
            report_progress(record, time.monotonic() - self.started, self.timeout, self.progress)

    def _remaining(self) -> float:
        return self.timeout - (time.monotonic() - self.started)


_Context = TypeVar("_Context")
_Item = TypeVar("_Item")
_Reply = TypeVar("_Reply")


def resolve_session(
    session_id: str | Callable[[_Context], str] | None,
    context: _Context,
    own_id: Callable[[], str],
) -> str:
    """The dex session of a call (docs/frameworks.md, "The key"): `session_id=` as the user
    gave it (a string, or a function of the framework's context), else the framework's own id
    (`own_id`, asked only then: it may say the framework has none)."""
    if isinstance(session_id, str):
        return session_id
    if session_id is not None:
        return session_id(context)
    return own_id()


def responses_through(
    items: Iterable[_Item], is_response: Callable[[_Item], bool], made_call: Callable[[_Item], bool]
) -> int:
    """How many of `items` are model responses, up to and including the one that made the call
    (`made_call`), or all of them if none did: the `n` of `turn_id` (S2.1)."""
    count = 0
    for item in items:
        if is_response(item):
            count += 1
            if made_call(item):
                return count
    return count


@dataclass(frozen=True, slots=True)
class FrameworkCall:
    """One call the model made, as an adapter names it for dex: the parts of its key, the tool,
    the arguments as the framework gave them (a JSON text too), and the conversation that led
    to it, copied into the session before the call is requested, scrubbed of the call's
    secrets. `history=None`: the framework copies its history elsewhere, so only the copies
    kept before are scrubbed, and only when the call has secrets."""

    session: str
    turn: str
    call_id: str
    tool: Tool
    arguments: Mapping[str, Any] | str
    history: Sequence[SeenMessage] | None = ()

    def secrets(self) -> dict[str, Any]:
        arguments: Any = self.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError:  # refused by the request, and the model reads why
                return {}
        return call_secrets(self.tool, arguments)

    def shown_arguments(self) -> Mapping[str, Any]:
        if isinstance(self.arguments, Mapping):
            return self.arguments
        try:
            parsed = json.loads(self.arguments or "{}")
        except ValueError:
            return {}
        return parsed if isinstance(parsed, Mapping) else {}


#: What an adapter does with a call that waits for a person (S1.3): a `Decision` to record,
#: None to leave it waiting (the model reads that it has not run), or what the tool answers the
#: framework instead of a text (the framework's own approval request).
Ask = Callable[[ToolCallRecord], Decision | _Reply | None]
AsyncAsk = Callable[[ToolCallRecord], Awaitable[Decision | _Reply | None]]


class FrameworkBridge(Generic[_Context]):
    """What every adapter's bridge between its framework and dex holds (the decisions, the
    conversation it records, how it finds the session id, who approves by default, how long a
    tool waits for its call, where progress goes) and the one call path every adapter uses:
    `call` / `acall` copy the conversation, request the call, ask the adapter for a person's
    decision when it waits for one, record that decision, and wait for the text the model
    reads. An adapter only names the call (`FrameworkCall`) and asks its framework's way."""

    #: The framework's name, in the note recorded with an approval given through it.
    framework: ClassVar[str]
    #: Who decided, in dex's record, when neither the framework's answer nor `approver` says.
    default_approver: ClassVar[str]

    def __init__(
        self,
        source: RuntimeSource,
        session_id: str | Callable[[_Context], str] | None,
        options: AdapterOptions,
    ) -> None:
        self.source = source
        self.decisions = Decisions(source, self.framework)
        self.conversation = Conversation(source)
        self.session_id = session_id
        self.approver = options.get("approver", self.default_approver)
        self.wait = WaitPlan.of(options)

    def session(self, context: _Context, own_id: Callable[[], str]) -> str:
        """`resolve_session` with this bridge's `session_id`."""
        return resolve_session(self.session_id, context, own_id)

    # --- the parts of a call ---------------------------------------------------------------

    def request(self, call: FrameworkCall) -> ToolCallRecord | str:
        """Copy the conversation that led to the call, then request it: its record, or the
        text the model reads when there is none."""
        secrets = call.secrets()
        if call.history is not None or secrets:
            self.conversation.record(call.session, call.history or (), secrets)
        return self.decisions.request(
            call.session, call.turn, call.call_id, call.tool.name, call.arguments
        )

    async def arequest(self, call: FrameworkCall) -> ToolCallRecord | str:
        secrets = call.secrets()
        if call.history is not None or secrets:
            await self.conversation.arecord(call.session, call.history or (), secrets)
        return await self.decisions.arequest(
            call.session, call.turn, call.call_id, call.tool.name, call.arguments
        )

    def record_decision(self, record: ToolCallRecord, decision: Decision) -> ToolCallRecord:
        """Record a person's decision on a waiting call: approved, it runs under its recorded
        policy (S6.2); rejected, or approved with changed arguments, it ends `rejected` with who
        decided (`approver` when the answer does not say) and why."""
        who = decision.decided_by or self.approver
        if decision.approved and not decision.edited:
            return self.decisions.approve(record, who)
        return self.decisions.reject(record, who, decision.rejection_reason())

    async def arecord_decision(self, record: ToolCallRecord, decision: Decision) -> ToolCallRecord:
        who = decision.decided_by or self.approver
        if decision.approved and not decision.edited:
            return await self.decisions.aapprove(record, who)
        return await self.decisions.areject(record, who, decision.rejection_reason())

    def shown(self, call: FrameworkCall, record: ToolCallRecord) -> dict[str, Any]:
        """`shown_request` of a waiting call, with its preview (S13.5)."""
        preview = self.decisions.preview(record)
        return shown_request(record, call.tool, call.shown_arguments(), preview)

    async def ashown(self, call: FrameworkCall, record: ToolCallRecord) -> dict[str, Any]:
        preview = await self.decisions.apreview(record)
        return shown_request(record, call.tool, call.shown_arguments(), preview)

    def text(self, record: ToolCallRecord) -> str:
        """What the model reads of the call, once it may stop waiting (`Decisions.text`)."""
        return self.decisions.text(record, self.wait)

    async def atext(self, record: ToolCallRecord) -> str:
        return await self.decisions.atext(record, self.wait)

    # --- the call path ---------------------------------------------------------------------

    def call(self, call: FrameworkCall, ask: Ask[_Reply]) -> str | _Reply:
        """Request the call, decide it with `ask` if it waits for a person, and return what
        the model reads (or what `ask` answers the framework instead)."""
        record = self.request(call)
        if isinstance(record, str):  # no record: what the model reads instead
            return record
        if record.status is CallStatus.AWAITING_APPROVAL:
            answer = ask(record)
            if isinstance(answer, Decision):
                record = self.record_decision(record, answer)
            elif answer is not None:
                return answer
        return self.text(record)

    async def acall(self, call: FrameworkCall, ask: AsyncAsk[_Reply]) -> str | _Reply:
        """`call` for async frameworks."""
        record = await self.arequest(call)
        if isinstance(record, str):  # no record: what the model reads instead
            return record
        if record.status is CallStatus.AWAITING_APPROVAL:
            answer = await ask(record)
            if isinstance(answer, Decision):
                record = await self.arecord_decision(record, answer)
            elif answer is not None:
                return answer
        return await self.atext(record)
