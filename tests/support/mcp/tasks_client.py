"""The client side of the MCP tasks extension, for tests: the `mcp` SDK 2.3.0 ships the task
types of 2025-11-25 only, so a 2026-07-28 client declares the extension itself (a
`ClientExtension` whose claim admits `resultType: "task"`) and sends `tasks/get` and
`tasks/cancel` (and `tasks/update`) as its own requests (`Mcp-Name` set to the task id, as the extension requires
over HTTP)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import anyio
import mcp_types
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from dex_celery.integrations.mcp.tasks import (
    APPROVAL_INPUT,
    TASK_STATUS_METHOD,
    TASKS_EXTENSION,
    ListenParams,
    TaskParams,
    UpdateParams,
)

_LOOSE = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class CreatedTask(mcp_types.Result):
    """A `CreateTaskResult` (2026-07-28 tasks extension)."""

    model_config = _LOOSE
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None


class TaskState(mcp_types.Result):
    """A `tasks/get` answer (a `DetailedTask`)."""

    model_config = _LOOSE
    task_id: str
    status: str
    status_message: str | None = None
    result: dict[str, Any] | None = None


class UpdateTask(mcp_types.Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param: ClassVar[str | None] = "taskId"


class CancelAnswer(mcp_types.Result):
    """A `tasks/cancel` acknowledgement (dex-celery says in `_meta` what it did)."""

    model_config = _LOOSE


class GetTask(mcp_types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param: ClassVar[str | None] = "taskId"


class CancelTask(mcp_types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param: ClassVar[str | None] = "taskId"


async def _no_resolve(result: CreatedTask, ctx: ClaimContext) -> mcp_types.CallToolResult:
    raise AssertionError("tests call with allow_claimed=True and follow the task themselves")


class PushedStatus(BaseModel):
    """The params of a `notifications/tasks/status` (a whole `DetailedTask`)."""

    model_config = _LOOSE
    task_id: str
    status: str
    meta: dict[str, Any] = Field(default_factory=dict, alias="_meta")


class Tasks(ClientExtension):
    identifier = TASKS_EXTENSION

    def __init__(self, pushed: list[PushedStatus] | None = None) -> None:
        self.pushed = pushed

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=_no_resolve)]

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        pushed = self.pushed
        if pushed is None:
            return ()

        async def keep(params: PushedStatus) -> None:
            pushed.append(params)

        return [
            NotificationBinding(method=TASK_STATUS_METHOD, params_type=PushedStatus, handler=keep)
        ]


def tasks_client(target: Any, *, pushed: list[PushedStatus] | None = None, **kwargs: Any) -> Client:
    """A `Client` of `target` that declares the tasks extension on every request; pushed task
    statuses it receives are appended to `pushed`."""
    return Client(target, extensions=[Tasks(pushed)], **kwargs)


class ListenTasks(mcp_types.Request[ListenParams, Literal["subscriptions/listen"]]):
    method: Literal["subscriptions/listen"] = "subscriptions/listen"


async def listen_tasks(client: Client, task_ids: list[str]) -> mcp_types.Result:
    """`subscriptions/listen` for `task_ids`; returns when the server ends the stream (every
    subscribed task ended). The statuses arrive on the client's `pushed` list."""
    params = ListenParams(notifications={"tasksStatus": task_ids})
    return await client.session.send_request(
        ListenTasks(params=params), mcp_types.Result, request_read_timeout_seconds=120
    )


async def call(
    client: Client, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None
) -> CreatedTask | mcp_types.CallToolResult:
    result = await client.session.call_tool(tool, arguments, meta=meta, allow_claimed=True)
    assert isinstance(result, CreatedTask | mcp_types.CallToolResult), result
    return result


async def get_task(client: Client, task_id: str) -> TaskState:
    return await client.session.send_request(GetTask(params=TaskParams(taskId=task_id)), TaskState)


async def cancel_task(client: Client, task_id: str) -> CancelAnswer:
    return await client.session.send_request(
        CancelTask(params=TaskParams(taskId=task_id)), CancelAnswer
    )


async def update_task(client: Client, task_id: str, answer: dict[str, Any]) -> CancelAnswer:
    """`tasks/update` with `answer` (an `ElicitResult`) to the approval form."""
    params = UpdateParams(taskId=task_id, inputResponses={APPROVAL_INPUT: answer})
    return await client.session.send_request(UpdateTask(params=params), CancelAnswer)


def approve(note: str = "", arguments: str = "") -> dict[str, Any]:
    """The approval form's answer that approves (with edited arguments, as JSON text)."""
    content = {"decision": "approve", "note": note}
    if arguments:
        content["arguments"] = arguments
    return {"action": "accept", "content": content}


async def wait_task(client: Client, task_id: str, *, timeout: float = 60) -> TaskState:
    """Poll `tasks/get` until the task leaves `working` (a task waiting for a person is
    `input_required`: only its decision moves it on)."""
    with anyio.fail_after(timeout):
        while True:
            state = await get_task(client, task_id)
            if state.status != "working":
                return state
            await anyio.sleep(0.2)
