"""dex calls as MCP tasks: the tasks extension (`io.modelcontextprotocol/tasks`, 2026-07-28).

A client that declares the extension in its request's capabilities may get, instead of a
`CallToolResult`, a task for a call that cannot finish at once (it waits for a person's
approval, or is queued or running past `--task-after` seconds). The task's id is the call's
idempotency key, so the task is the call's record seen through MCP, kept as long as the record
(`ttlMs` null) and the same for every server process:

- `tasks/get` reports the record as it moves: `working` while it waits for approval (with the
  deadline) or runs; `completed` with the call's `CallToolResult` (its text and the outcome
  field of `mcp/outcome`) once it ended `succeeded`, `failed` or `outcome_unknown`;
  `cancelled` once it was rejected (it did not run). Every state carries `_meta` with the dex
  status, the outcome field and the key.
- `tasks/cancel` of a call waiting for approval rejects it, recorded with who asked (the
  caller's identity as the server knows it); of a call already queued or running it changes
  nothing, and its answer says so: the tool may still take effect.
- A call waiting for a person's approval is `input_required`: its `inputRequests` hold one
  form (`APPROVAL_INPUT`, an `elicitation/create`) with the approval's context (the tool, the
  arguments by the one display rule, the deadline, why it waits again). `tasks/update`
  answers it: approve (optionally with edited arguments, S13.3.3), or reject. Only an identity
  with the scope `approvals:decide` may (S11.3); the decision is the one `Approvals` makes for
  the web app and the CLI, one conditional update, so of two deciders exactly one wins (S6.3).

A task id is not a capability: only the identity owning the call's session, in its own
namespace (`mcp/namespace`), may read or cancel it (`store/owners.py`), and any other id answers "no such task", whether or not it exists.
Clients that do not declare the extension (and every client of an older revision) get the
answers of `mcp/server` as before.

Task status is also pushed (`TaskStatusPush`): a `subscriptions/listen` request naming task
ids under `notifications.tasksStatus` gets, on its stream, a `notifications/tasks/status` with
the whole task for the state it is in and for each later change of its status, once each and in
order (`_meta["dex-celery/sequence"]` counts them), for the caller's own tasks only. Polling
`tasks/get` keeps working.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import mcp_types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field

from dex_celery.access import Identity, Scope
from dex_celery.client.dex_client import AsyncDexClient
from dex_celery.errors import ApprovalError, DexError, InvalidEdit, InvalidId, UnknownCall
from dex_celery.integrations.mcp.namespace import scoped_session
from dex_celery.integrations.mcp.outcome import OUTCOME_META_KEY, STATUS_META_KEY, outcome_of
from dex_celery.integrations.mcp.unanswered import UnansweredCalls
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY, TASKS_EXTENSION
from dex_celery.ledger.events import AgentEvent
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.model.times import format_utc
from dex_celery.store.owners import SessionOwners
from dex_celery.tools.redact import record_arguments

log = logging.getLogger("dex_celery.mcp")

#: `_meta` key of a task: the approval deadline of a waiting call.
DEADLINE_META_KEY = "dex-celery/approval-deadline"
#: `_meta` key of a `tasks/cancel` answer: `rejected`, `already_ended` or `may_still_run`.
CANCEL_META_KEY = "dex-celery/cancel"

#: `_meta` key of an `input_required` task: what the person decides on (`approval_context`).
APPROVAL_META_KEY = "dex-celery/approval"
#: The key of the approval form in an `input_required` task's `inputRequests`.
APPROVAL_INPUT = "dex-celery/approval"
#: `_meta` key of a `tasks/update` acknowledgement: `approved`, `rejected` or `none`.
DECISION_META_KEY = "dex-celery/decision"

_NO_SUCH_TASK = "Failed to retrieve task: Task not found"
#: Seconds between two `tasks/get` a client is asked to keep (`pollIntervalMs`): a person's
#: decision or a worker's end is seen within about that.
POLL_INTERVAL = 1.0


class TaskParams(mcp_types.RequestParams):
    """`tasks/get` and `tasks/cancel` params."""

    task_id: str = Field(alias="taskId")


class ListenParams(mcp_types.RequestParams):
    """`subscriptions/listen` params as the tasks extension widens them (`tasksStatus`)."""

    notifications: dict[str, Any] = Field(default_factory=dict)


class UpdateParams(TaskParams):
    """`tasks/update` params: the client's answers to the task's `inputRequests`, by key."""

    input_responses: dict[str, Any] = Field(default_factory=dict, alias="inputResponses")


def speaks_tasks(ctx: ServerRequestContext[Any]) -> bool:
    """True if this request's client declared the tasks extension (2026-07-28 requests only:
    the extension cannot be delivered on an older revision's wire)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    meta: Mapping[str, Any] = ctx.meta or {}
    capabilities = meta.get(mcp_types.CLIENT_CAPABILITIES_META_KEY)
    if not isinstance(capabilities, Mapping):
        return False
    extensions = capabilities.get("extensions")
    return isinstance(extensions, Mapping) and TASKS_EXTENSION in extensions


def _iso(seconds: float) -> str:
    """RFC 3339, for the protocol's own fields (`createdAt`); text a model reads uses
    `format_utc`."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat().replace("+00:00", "Z")


def _working_message(record: ToolCallRecord, where: str | None) -> str:
    if record.status is CallStatus.AWAITING_APPROVAL:
        deadline = (
            f" until {format_utc(record.approval_deadline, millis=False)}"
            if record.approval_deadline is not None
            else ""
        )
        return f"waiting for a person's approval{deadline}; it has not run"
    return where or "queued or running on a worker"


def approval_context(record: ToolCallRecord) -> dict[str, Any]:
    """What a person decides on, as the approvals page shows it: the tool, the arguments by the
    one display rule (secrets `***`), the deadline and why the call waits again (S13.3.2)."""
    context: dict[str, Any] = {
        "tool": record.tool_name,
        "arguments": record_arguments(record),
        "deadline": _iso(record.approval_deadline) if record.approval_deadline else None,
    }
    if record.rewait_reason:
        context["rewaitReason"] = record.rewait_reason
    return context


def approval_request(record: ToolCallRecord) -> dict[str, Any]:
    """The `elicitation/create` form of a call waiting for approval: approve or reject, a note,
    and optionally the whole arguments to run with instead, as JSON text (S13.3.3)."""
    shown = json.dumps(record_arguments(record), sort_keys=True, ensure_ascii=False)
    return {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": (
                f"Approve the call {record.key} of {record.tool_name} with arguments {shown}? "
                "It has not run. Only an approver (scope approvals:decide) may answer."
            ),
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "decision": {
                        "type": "string",
                        "title": "Decision",
                        "enum": ["approve", "reject"],
                    },
                    "note": {"type": "string", "title": "Note or reason"},
                    "arguments": {
                        "type": "string",
                        "title": "Edited arguments (a JSON object), to run with instead",
                    },
                },
                "required": ["decision"],
            },
        },
    }


def task_of(
    record: ToolCallRecord,
    result: mcp_types.CallToolResult | None,
    *,
    poll_interval: float,
    where: str | None = None,
) -> dict[str, Any]:
    """The task of `record` as the wire shows it (`DetailedTask`), `result` being the call's
    `CallToolResult` once it ended and `where` what the ledger says of a call in flight."""
    meta: dict[str, Any] = {
        STATUS_META_KEY: record.status.value,
        OUTCOME_META_KEY: outcome_of(record.status, record.error).value,
        IDEMPOTENCY_META_KEY: record.key,
    }
    if record.status is CallStatus.AWAITING_APPROVAL and record.approval_deadline is not None:
        meta[DEADLINE_META_KEY] = _iso(record.approval_deadline)
    task: dict[str, Any] = {
        "taskId": record.key,
        "createdAt": _iso(record.requested_at),
        "lastUpdatedAt": _iso(record.finished_at or record.requested_at),
        # The record is kept as long as the system of record keeps calls: no expiry here.
        "ttlMs": None,
        "pollIntervalMs": max(1, int(poll_interval * 1000)),
        "_meta": meta,
    }
    if record.status is CallStatus.AWAITING_APPROVAL:
        meta[APPROVAL_META_KEY] = approval_context(record)
        return {
            **task,
            "status": "input_required",
            "statusMessage": _working_message(record, where),
            "inputRequests": {APPROVAL_INPUT: approval_request(record)},
        }
    if not record.finished:
        return {**task, "status": "working", "statusMessage": _working_message(record, where)}
    if record.status is CallStatus.REJECTED:
        why = f": {record.error}" if record.error else ""
        return {**task, "status": "cancelled", "statusMessage": f"rejected, did not run{why}"}
    assert result is not None
    return {
        **task,
        "status": "completed",
        "statusMessage": f"the call ended {record.status.value}",
        "result": result.model_dump(by_alias=True, mode="json", exclude_none=True),
    }


def created(record: ToolCallRecord, *, poll_interval: float) -> dict[str, Any]:
    """The `CreateTaskResult` answering a `tools/call` whose call cannot finish at once."""
    return {"resultType": "task", **task_of(record, None, poll_interval=poll_interval)}


class TaskMethods:
    """`tasks/get` and `tasks/cancel` of one `dex-celery mcp` server."""

    def __init__(
        self,
        client: AsyncDexClient,
        owners: SessionOwners,
        unanswered: UnansweredCalls,
        *,
        identity_of: Callable[[ServerRequestContext[Any]], Identity],
        result_of: Callable[[ToolCallRecord], Awaitable[mcp_types.CallToolResult]],
        where_is: Callable[[str], str | None] = lambda key: None,
        poll_interval: float = POLL_INTERVAL,
    ) -> None:
        self.client = client
        self.owners = owners
        self.unanswered = unanswered
        self.identity_of = identity_of
        self.result_of = result_of
        #: What the ledger says of a call in flight (queued, or running on which worker).
        self.where_is = where_is
        self.poll_interval = poll_interval

    async def get(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        record = await self.owned_record(ctx, params.task_id)
        result, where = None, None
        if record.status is CallStatus.PENDING:
            where = await asyncio.to_thread(self.where_is, record.key)
        if record.finished:
            result = await self.result_of(record)
            # Its outcome was given: a request without ids asking the same again is a new call.
            with contextlib.suppress(DexError):
                await asyncio.to_thread(self.unanswered.forget_task, record.key)
        return task_of(record, result, poll_interval=self.poll_interval, where=where)

    async def cancel(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        record = await self.owned_record(ctx, params.task_id)
        identity = self.identity_of(ctx)
        if record.status is CallStatus.AWAITING_APPROVAL:
            try:
                record = await self.client.reject(
                    record.key, identity.name, "cancelled by the MCP client (tasks/cancel)"
                )
                log.info("%s cancelled %s before approval: rejected", identity.name, record.key)
                return _cancel_answer("rejected", "rejected before it ran; it never will")
            except ApprovalError:  # decided meanwhile, or its deadline passed: read again
                record = await self.client.get_call(record.key)
        if record.finished:
            return _cancel_answer(
                "already_ended", f"the call had already ended {record.status.value}"
            )
        return _cancel_answer(
            "may_still_run",
            "the call is queued or running on a worker and cannot be stopped from here; the "
            "tool may still take effect: follow the task for its outcome",
        )

    async def update(self, ctx: ServerRequestContext[Any], params: UpdateParams) -> dict[str, Any]:
        """`tasks/update`: the answer to the approval form of a call waiting for a person.

        The caller must own the call's session, or be an approver naming the call's full key
        (the web app shows approvers every waiting call); and must hold `approvals:decide`.
        Anyone else gets an error and the call keeps waiting. The decision is `Approvals`'
        (S6): a call decided meanwhile, by the web app, the CLI or another client, is an
        error here and changes nothing (S6.3)."""
        identity = self.identity_of(ctx)
        try:
            record = await self.owned_record(ctx, params.task_id)
        except MCPError:
            if not identity.may(Scope.APPROVALS_DECIDE):
                raise
            record = await self._any_record(params.task_id)
        if not identity.may(Scope.APPROVALS_DECIDE):
            log.warning("%s may not decide %s (no approvals:decide)", identity.name, record.key)
            raise MCPError(
                code=mcp_types.INVALID_REQUEST,
                message=(
                    f"{identity.name} may not decide approvals (needs the scope "
                    "approvals:decide); the call keeps waiting"
                ),
            )
        answer = params.input_responses.get(APPROVAL_INPUT)
        if not isinstance(answer, Mapping):
            return _update_answer("none", "no answer to the approval form: nothing decided")
        action = answer.get("action")
        content = answer.get("content") if isinstance(answer.get("content"), Mapping) else {}
        assert isinstance(content, Mapping)
        note = content.get("note") if isinstance(content.get("note"), str) else None
        decision = content.get("decision")
        try:
            if action == "accept" and decision == "approve":
                edit = content.get("arguments")
                edit = edit if isinstance(edit, str) and edit.strip() else None
                record = await self.client.approve(
                    record.key, identity.name, note or None, edit=edit
                )
                log.info("%s approved %s through tasks/update", identity.name, record.key)
                return _update_answer("approved", f"approved by {identity.name}")
            if action == "decline" or (action == "accept" and decision == "reject"):
                await self.client.reject(
                    record.key, identity.name, note or "rejected through MCP (tasks/update)"
                )
                log.info("%s rejected %s through tasks/update", identity.name, record.key)
                return _update_answer("rejected", f"rejected by {identity.name}")
        except (ApprovalError, InvalidEdit, InvalidId) as e:
            raise MCPError(code=mcp_types.INVALID_PARAMS, message=str(e)) from None
        if action == "cancel":
            return _update_answer("none", "the form was dismissed: nothing decided")
        raise MCPError(
            code=mcp_types.INVALID_PARAMS,
            message='answer the approval form with action "accept" and decision "approve" or '
            '"reject", or action "decline"',
        )

    async def _any_record(self, task_id: str) -> ToolCallRecord:
        """The call a full key names, for an approver (who may decide any waiting call)."""
        try:
            return await self.client.get_call(CallKey.parse(task_id).key)
        except (InvalidId, UnknownCall):
            raise MCPError(code=mcp_types.INVALID_PARAMS, message=_NO_SUCH_TASK) from None

    async def owned_record(self, ctx: ServerRequestContext[Any], task_id: str) -> ToolCallRecord:
        """The call `task_id` names if the caller owns its session; otherwise the same
        "not found" whether or not it exists (a task id is not a capability)."""
        if not speaks_tasks(ctx):
            raise MCPError(
                code=mcp_types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                message="Missing required client capability",
                data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
            )
        identity = self.identity_of(ctx)
        try:
            key = CallKey.parse(task_id)
            # The caller's own namespace, as for `tools/call`: the key it sent is its task id.
            session = scoped_session(identity, key.session_id)
            owner = None
            if session is not None:
                owner = await asyncio.to_thread(self.owners.owner, session)
            if owner != identity.name:
                raise MCPError(code=mcp_types.INVALID_PARAMS, message=_NO_SUCH_TASK)
            key = CallKey.of(session, key.turn_id, key.tool_call_id)
            return await self.client.get_call(key.key)
        except (InvalidId, UnknownCall) as e:  # a malformed id or an unknown call
            log.info("tasks: %s asked for %r: %s", identity.name, task_id, e)
            raise MCPError(code=mcp_types.INVALID_PARAMS, message=_NO_SUCH_TASK) from None


def _update_answer(decision: str, text: str) -> dict[str, Any]:
    return {"_meta": {DECISION_META_KEY: decision, "dex-celery/decision-message": text}}


def _cancel_answer(state: str, text: str) -> dict[str, Any]:
    return {"_meta": {CANCEL_META_KEY: state, "dex-celery/cancel-message": text}}


#: The notification of a task's status, as the tasks extension names it.
TASK_STATUS_METHOD = "notifications/tasks/status"
#: `_meta` key of each pushed status: 1, 2, ... on one subscription stream.
SEQUENCE_META_KEY = "dex-celery/sequence"
#: Seconds between two reads of the subscribed records when no event arrives (a safety net:
#: events wake the stream at once).
PUSH_RECHECK = 1.0


class _Notification(BaseModel):
    """A server notification the SDK has no type for (`session.send_notification` sends its
    `method` and `params` as they are)."""

    method: str
    params: dict[str, Any]


def _status_of(status: CallStatus) -> str:
    """The task status a dex status shows as (the table of docs/mcp.md)."""
    if status is CallStatus.AWAITING_APPROVAL:
        return "input_required"
    if status is CallStatus.REJECTED:
        return "cancelled"
    return "completed" if status.terminal else "working"


class TaskStatusPush:
    """`subscriptions/listen` with `tasksStatus`: status changes of the caller's tasks, pushed.

    The stream is woken by the deployment's events stream (`AgentEvents`, S7.3) and, failing
    that, every `PUSH_RECHECK` seconds; each wake reads the subscribed records. A change of a
    task's status seen in an event (the record may have moved on further already) is pushed as
    the record in that state, so a client sees `input_required`, `working` and `completed` in
    that order even when the call ran faster than one read. Ids the caller does not own are
    left out of the acknowledgement, as if they did not exist. The stream ends (gracefully)
    once every subscribed task has ended."""

    def __init__(self, tasks: TaskMethods, events: Any) -> None:
        self.tasks = tasks
        #: `AgentEvents`: `latest_position()` and `read(after, count=, block=)`.
        self.events = events

    async def __call__(
        self, ctx: ServerRequestContext[Any], params: ListenParams
    ) -> dict[str, Any]:
        subscription = ctx.request_id
        if subscription is None:
            raise MCPError(code=mcp_types.INVALID_REQUEST, message="listen needs a request id")
        asked = params.notifications.get("tasksStatus")
        if asked is not None and not speaks_tasks(ctx):
            raise MCPError(
                code=mcp_types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                message="Missing required client capability",
                data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
            )
        ids = [i for i in asked if isinstance(i, str)] if isinstance(asked, list) else []
        owned: dict[str, str] = {}  # the key of each task the caller owns -> the id it named
        for task_id in ids[:100]:
            with contextlib.suppress(MCPError):
                record = await self.tasks.owned_record(ctx, task_id)
                owned[record.key] = task_id
        meta = {SUBSCRIPTION_ID_META_KEY: subscription}
        position = await asyncio.to_thread(self.events.latest_position)
        await self._send(
            ctx,
            "notifications/subscriptions/acknowledged",
            {"notifications": {"tasksStatus": list(owned.values())}, "_meta": meta},
        )
        sent: dict[str, str] = {}
        sequence = 0
        seen: list[AgentEvent] = []
        while owned:
            for key in list(owned):
                records = await self._states(key, seen)
                for record in records:
                    status = _status_of(record.status)
                    if sent.get(key) == status:
                        continue
                    sent[key] = status
                    sequence += 1
                    task = await self._task(record)
                    task["_meta"] = {**task["_meta"], **meta, SEQUENCE_META_KEY: sequence}
                    await self._send(ctx, TASK_STATUS_METHOD, task)
                if sent.get(key) in ("completed", "cancelled"):
                    del owned[key]
            if not owned:
                break
            found = await asyncio.to_thread(
                self.events.read, position, count=100, block=PUSH_RECHECK
            )
            seen = [e for e in found if e.key in owned]
            if found:
                position = found[-1].position
        return {"resultType": "complete", "_meta": meta}

    async def _states(self, key: str, events: list[AgentEvent]) -> list[ToolCallRecord]:
        """The states to show of `key`, oldest first: each status its events passed through,
        then the record as it is now."""
        record = await self.tasks.client.get_call(key)
        states = []
        for event in events:
            if (
                event.key == key
                and isinstance(event.status, CallStatus)
                and _status_of(event.status) != _status_of(record.status)
            ):
                states.append(_as_of(record, event.status))
        return [*states, record]

    async def _task(self, record: ToolCallRecord) -> dict[str, Any]:
        result = await self.tasks.result_of(record) if record.finished else None
        return task_of(record, result, poll_interval=self.tasks.poll_interval)

    async def _send(
        self, ctx: ServerRequestContext[Any], method: str, params: dict[str, Any]
    ) -> None:
        notification = cast(
            mcp_types.ServerNotification, _Notification(method=method, params=params)
        )
        await ctx.session.send_notification(notification, related_request_id=ctx.request_id)


def _as_of(record: ToolCallRecord, status: CallStatus) -> ToolCallRecord:
    """`record` as it was while in `status`, for a status it has passed already."""
    if status.terminal:
        return record
    return dataclasses.replace(record, status=status, finished_at=None)
