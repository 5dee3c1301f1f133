"""Call a dex tool as an MCP task, with the official `mcp` SDK's client (docs/mcp.md, "Calling a
dex tool as a task from Python").

The 2026-07-28 tasks extension lets a server answer a `tools/call` with a task instead of a
result; the `mcp` SDK (2.3.0) has no client for it yet. This helper is that client for
`dex-celery mcp` (and any server of the extension): `task_client` declares the tasks extension
and the outcome extension (docs/mcp-outcome-extension.md) on every request; `call_as_task`
sends the call with its idempotency key and follows the task with `tasks/get` at the
`pollIntervalMs` the server asks for, until it ends (or `wait` runs out); `cancel_task` sends
`tasks/cancel`. Every answer is a `TaskOutcome`, whose `outcome` says whether the tool ran
(`executed`), did not (`not_executed`), may have (`unknown`), or has no outcome yet
(`pending`): retry only on `not_executed`.

Errors are dex-celery's own (S11): `UnknownCall` for a task the server does not know (or will
not show this caller), `ToolError` for any other refusal of the server.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast

import anyio
import mcp_types
from mcp import Client, MCPError
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim, advertise
from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from dex_celery.errors import ToolError, UnknownCall
from dex_celery.integrations.mcp.outcome import OUTCOME_EXTENSION, Outcome, outcome_in
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY, TASKS_EXTENSION

__all__ = ["TaskOutcome", "call_as_task", "cancel_task", "get_task", "task_client"]

#: Task states after which nothing changes.
ENDED = frozenset({"completed", "cancelled", "failed"})
#: Seconds between two `tasks/get` when the server names no interval.
DEFAULT_POLL = 1.0

_LOOSE = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class _Task(mcp_types.Result):
    """A task as the wire shows it (`CreateTaskResult` and `tasks/get` answers)."""

    model_config = _LOOSE
    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class _TaskId(mcp_types.RequestParams):
    task_id: str = Field(alias="taskId")


class _Get(mcp_types.Request[_TaskId, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param: ClassVar[str | None] = "taskId"


class _Cancel(mcp_types.Request[_TaskId, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param: ClassVar[str | None] = "taskId"


class _Loose(mcp_types.Result):
    model_config = _LOOSE


async def _unresolved(result: _Task, ctx: ClaimContext) -> mcp_types.CallToolResult:
    raise ToolError("call_as_task follows tasks itself")  # pragma: no cover - never claimed


class _Tasks(ClientExtension):
    identifier = TASKS_EXTENSION

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=_Task, resolve=_unresolved)]


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """Where a call followed as a task stands.

    `status`: the task's (`working`, `input_required`, `completed`, `cancelled`), or `result`
    when the server answered with a plain result at once. `outcome`: the outcome extension's
    class (`Outcome`), `pending` until the call ended. `result`: the `CallToolResult` once it
    ended. `task`: the server's last answer as sent."""

    task_id: str | None
    status: str
    outcome: Outcome
    result: mcp_types.CallToolResult | None = None
    task: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.status in ENDED or self.status == "result"


def tasks_extension() -> ClientExtension:
    """The client's side of the tasks extension (declared on every request, task results
    admitted), for a `mcp.Client` built elsewhere (`mcp/client.McpServer.client`)."""
    return _Tasks()


def task_client(target: Any, **kwargs: Any) -> Client:
    """A `mcp.Client` of `target` (a URL, a stdio command, a transport) that declares the tasks
    extension and the outcome extension on every request."""
    return Client(target, extensions=[_Tasks(), advertise(OUTCOME_EXTENSION)], **kwargs)


def _outcome(task: Mapping[str, Any]) -> TaskOutcome:
    meta = task.get("_meta") if isinstance(task.get("_meta"), Mapping) else None
    result = None
    if isinstance(task.get("result"), Mapping):
        result = mcp_types.CallToolResult.model_validate(task["result"])
    status = str(task.get("status", ""))
    outcome = outcome_in(meta) or (Outcome.PENDING if status not in ENDED else Outcome.UNKNOWN)
    return TaskOutcome(str(task.get("taskId")), status, outcome, result, dict(task))


def _refused(e: MCPError, task_id: str | None) -> UnknownCall | ToolError:
    if "not found" in e.message.lower():
        return UnknownCall(f"no task {task_id!r} for this caller: {e.message}")
    return ToolError(f"the MCP server refused: {e.message}")


# --- the requests, raising the SDK's own errors (`mcp/remote_task` tells a broken connection
# from a refusal by them); the public functions below turn those into dex-celery's -------------


async def start_task(
    client: Client,
    tool: str,
    arguments: Mapping[str, Any],
    meta: mcp_types.RequestParamsMeta | None,
) -> TaskOutcome:
    """`tools/call` that admits a task: the created task, or (status `result`) the plain
    result of a call that ended at once. Raises the SDK's `MCPError` and transport errors."""
    first = await client.session.call_tool(tool, dict(arguments), meta=meta, allow_claimed=True)
    if isinstance(first, mcp_types.CallToolResult):
        outcome = outcome_in(first.meta) or (
            Outcome.EXECUTED if not first.is_error else Outcome.UNKNOWN
        )
        task_id = (first.meta or {}).get(IDEMPOTENCY_META_KEY)
        return TaskOutcome(task_id if isinstance(task_id, str) else None, "result", outcome, first)
    assert isinstance(first, _Task)
    return _outcome(first.model_dump(by_alias=True, mode="json", exclude_none=True))


async def read_task(client: Client, task_id: str) -> TaskOutcome:
    """`tasks/get`, raising the SDK's errors."""
    task = await client.session.send_request(_Get(params=_TaskId(taskId=task_id)), _Loose)
    return _outcome(task.model_dump(by_alias=True, mode="json", exclude_none=True))


async def request_cancel(client: Client, task_id: str) -> Mapping[str, Any]:
    """`tasks/cancel`, raising the SDK's errors."""
    ack = await client.session.send_request(_Cancel(params=_TaskId(taskId=task_id)), _Loose)
    return ack.model_dump(by_alias=True, mode="json", exclude_none=True)


def poll_interval(state: TaskOutcome) -> float:
    """Seconds until the next `tasks/get`: the task's `pollIntervalMs`, else `DEFAULT_POLL`."""
    interval = state.task.get("pollIntervalMs")
    if isinstance(interval, int | float) and 0 < interval <= 60_000:
        return float(interval) / 1000
    return DEFAULT_POLL


async def get_task(client: Client, task_id: str) -> TaskOutcome:
    """`tasks/get`: the task as it stands now."""
    try:
        return await read_task(client, task_id)
    except MCPError as e:
        raise _refused(e, task_id) from None


async def cancel_task(client: Client, task_id: str) -> Mapping[str, Any]:
    """`tasks/cancel`. With `dex-celery mcp`, `_meta["dex-celery/cancel"]` of the answer says
    what it did: `rejected` (it never runs), `already_ended`, or `may_still_run` (a queued or
    running call cannot be taken back: follow the task for its outcome)."""
    try:
        return await request_cancel(client, task_id)
    except MCPError as e:
        raise _refused(e, task_id) from None


async def call_as_task(
    client: Client,
    tool: str,
    arguments: Mapping[str, Any],
    *,
    key: str | None = None,
    wait: float | None = None,
) -> TaskOutcome:
    """Call `tool` and follow its task until it ends, or for `wait` seconds at most (then the
    outcome is `pending`: call `get_task` later, or call again with the same `key`, which is
    the same call). `key` is the call's idempotency key (`session/turn/call`, or any opaque
    text); sent again, it never runs the tool twice."""
    # `_meta` is an open map; the vendor key is an extra item of the TypedDict.
    meta = cast(mcp_types.RequestParamsMeta, {IDEMPOTENCY_META_KEY: key}) if key else None
    try:
        state = await start_task(client, tool, arguments, meta)
    except MCPError as e:
        raise _refused(e, None) from None
    deadline = None if wait is None else time.monotonic() + wait
    while not state.ended:
        pause = poll_interval(state)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return state
            pause = min(pause, left)
        await anyio.sleep(pause)  # the server's own polling interval (`pollIntervalMs`)
        assert state.task_id is not None
        state = await get_task(client, state.task_id)
    return state
