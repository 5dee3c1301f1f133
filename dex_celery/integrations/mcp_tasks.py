"""dex calls as MCP tasks: the tasks extension (`io.modelcontextprotocol/tasks`, 2026-07-28).

A client that declares the extension in its request's capabilities may get, instead of a
`CallToolResult`, a task for a call that cannot finish at once (it waits for a person's
approval, or is queued or running past `--task-after` seconds). The task's id is the call's
idempotency key, so the task is the call's record seen through MCP, kept as long as the record
(`ttlMs` null) and the same for every server process:

- `tasks/get` reports the record as it moves: `working` while it waits for approval (with the
  deadline) or runs; `completed` with the call's `CallToolResult` (its text and the outcome
  field of `mcp_outcome`) once it ended `succeeded`, `failed` or `outcome_unknown`;
  `cancelled` once it was rejected (it did not run). Every state carries `_meta` with the dex
  status, the outcome field and the key.
- `tasks/cancel` of a call waiting for approval rejects it, recorded with who asked (the
  caller's identity as the server knows it); of a call already queued or running it changes
  nothing, and its answer says so: the tool may still take effect.

A task id is not a capability: only the identity owning the call's session, in its own
namespace (`mcp_namespace`), may read or cancel it (`store/owners.py`), and any other id answers "no such task", whether or not it exists.
Clients that do not declare the extension (and every client of an older revision) get the
answers of `mcp_server` as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import mcp_types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from dex_celery.access import Identity
from dex_celery.client.dex_client import AsyncDexClient
from dex_celery.errors import ApprovalError, DexError, InvalidId, UnknownCall
from dex_celery.integrations.mcp_client import IDEMPOTENCY_META_KEY
from dex_celery.integrations.mcp_namespace import scoped_session
from dex_celery.integrations.mcp_outcome import OUTCOME_META_KEY, STATUS_META_KEY, outcome_of
from dex_celery.integrations.mcp_unanswered import UnansweredCalls
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.model.times import format_utc
from dex_celery.store.owners import SessionOwners

log = logging.getLogger("dex_celery.mcp")

#: The extension's identifier, in the client's per-request capabilities and the server's.
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
#: `_meta` key of a task: the approval deadline of a waiting call.
DEADLINE_META_KEY = "dex-celery/approval-deadline"
#: `_meta` key of a `tasks/cancel` answer: `rejected`, `already_ended` or `may_still_run`.
CANCEL_META_KEY = "dex-celery/cancel"

_NO_SUCH_TASK = "Failed to retrieve task: Task not found"
#: Seconds between two `tasks/get` a client is asked to keep (`pollIntervalMs`): a person's
#: decision or a worker's end is seen within about that.
POLL_INTERVAL = 1.0


class TaskParams(mcp_types.RequestParams):
    """`tasks/get` and `tasks/cancel` params."""

    task_id: str = Field(alias="taskId")


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
        record = await self._owned_record(ctx, params.task_id)
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
        record = await self._owned_record(ctx, params.task_id)
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

    async def _owned_record(self, ctx: ServerRequestContext[Any], task_id: str) -> ToolCallRecord:
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


def _cancel_answer(state: str, text: str) -> dict[str, Any]:
    return {"_meta": {CANCEL_META_KEY: state, "dex-celery/cancel-message": text}}
