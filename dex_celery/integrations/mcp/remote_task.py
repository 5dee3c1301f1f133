"""A dex tool of `dex.add_mcp_server` called as a task of its server (docs/mcp.md, "dex-celery as
a client of servers of the newest revision").

A server that advertises the 2026-07-28 tasks extension (`io.modelcontextprotocol/tasks`;
`dex-celery mcp` does) may answer a long `tools/call` with a task. For such a server one
attempt of the dex tool is (with the requests of `mcp/task_call`):

- `tools/call` with the call's idempotency key: the server creates the task, or answers at
  once. A connection that broke before the answer is opened again and the same key sent again:
  a server of the outcome extension (docs/mcp-outcome-extension.md) answers with the same task.
- `tasks/get` of that task id at the server's `pollIntervalMs` until it ends. A connection that
  broke meanwhile is opened again and the same task id asked for: the tool is never sent twice.
  After `RESENDS` failed reopenings in a row the attempt is lost (`ToolLost`, S4.3).
- A task `input_required` (with `dex-celery mcp`: the remote call waits for a person's
  approval there) is logged as waiting, and the attempt keeps following it.
- Shortly before the attempt's start-to-close limit (`ToolContext.time_left`, S5.1;
  `CANCEL_MARGIN`) a task still going is sent `tasks/cancel` and asked for once more. The
  attempt ends by what the server then says: the result of a task that completed meanwhile;
  "did not run" (S4.2) if it states `not_executed` (`dex-celery mcp` rejects a call still
  waiting for approval); otherwise lost (`ToolLost`): a write becomes `outcome_unknown` (S4.5),
  since a task that may have started may still take effect.

How an ended task ends the attempt:

| task status           | the server states an outcome (outcome extension) | it states none |
|-----------------------|-------------------------------------------------|----------------|
| `completed`           | as for a `tools/call` answer (`McpToolFunction._settle`) | its result, or a tool error if `isError` |
| `cancelled`           | `not_executed`: failed, "did not run"; else lost | lost           |
| `failed`              | `not_executed`: "did not run"; `unknown`: lost; else a tool error | a tool error |

Pushed task status (`subscriptions/listen`) is not used: polling is what every server of the
extension answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import mcp_types
from mcp import Client, MCPError

from dex_celery.errors import RetryableToolError, ToolError, ToolLost
from dex_celery.integrations.mcp.outcome import Outcome, outcome_in
from dex_celery.integrations.mcp.sessions import pool
from dex_celery.integrations.mcp.task_call import (
    ENDED,
    TaskOutcome,
    poll_interval,
    read_task,
    request_cancel,
    start_task,
)
from dex_celery.integrations.mcp.wire import (
    RESEND_BACKOFF,
    RESENDS,
    connection_broke,
    describe,
    result_texts,
)
from dex_celery.model.outcomes import DID_NOT_RUN
from dex_celery.tools.tool import ToolContext

if TYPE_CHECKING:
    from dex_celery.integrations.mcp.client import McpToolFunction

log = logging.getLogger("dex_celery.mcp")

_T = TypeVar("_T")

#: Seconds before the attempt's time limit at which a task still going is cancelled (at most a
#: quarter of the time the attempt had when the call began), so `tasks/cancel` and the last
#: `tasks/get` are answered before the limit fences the attempt.
CANCEL_MARGIN = 2.0
#: Seconds the cancellation near the limit may take, at most (`tasks/cancel`, `tasks/get`).
CANCEL_TIMEOUT = 1.5

#: Best-effort cancellations sent after the attempt itself was cancelled (kept referenced).
_stragglers: set[asyncio.Task[None]] = set()


class RemoteTaskCall:
    """One attempt of an MCP tool whose server advertises the tasks extension."""

    def __init__(
        self,
        function: McpToolFunction,
        ctx: ToolContext,
        client: Client,
        arguments: Mapping[str, Any],
        meta: mcp_types.RequestParamsMeta,
        states_outcome: bool,
    ) -> None:
        self.function = function
        self.server = function.server
        self.ctx = ctx
        self.client = client
        self.arguments = dict(arguments)
        self.meta = meta
        #: The server advertises the outcome extension: its stated outcomes decide.
        self.states_outcome = states_outcome
        self.task_id: str | None = None
        left = ctx.time_left()
        #: When a task still going is cancelled (monotonic clock); None without a time limit.
        self.cancel_at = (
            None if left is None else time.monotonic() + left - min(CANCEL_MARGIN, left / 4)
        )

    @property
    def name(self) -> str:
        return self.function.tool_name

    async def run(self) -> Any:
        try:
            state = await self._create()
            self.task_id = state.task_id
            if state.status == "result":
                return self._ended(state)
            log.info(
                "MCP server %s: %s runs as task %s", self.server.name, self.name, state.task_id
            )
            shown = None
            while not state.ended:
                if state.status != shown:
                    self._report(state)
                    shown = state.status
                pause = poll_interval(state)
                if self.cancel_at is not None:
                    left = self.cancel_at - time.monotonic()
                    if left <= 0:
                        return await self._cancel_near_limit(state)
                    pause = min(pause, left)
                await anyio.sleep(pause)  # the server's own interval (`pollIntervalMs`)
                state = await self._get(state)
            return self._ended(state)
        except asyncio.CancelledError:
            # The attempt was fenced or hit the soft time limit: tell the server, best-effort.
            if self.task_id is not None:
                straggler = asyncio.get_running_loop().create_task(self._cancel_quietly())
                _stragglers.add(straggler)
                straggler.add_done_callback(_stragglers.discard)
            raise

    # --- requests, across broken connections -------------------------------------------------

    async def _create(self) -> TaskOutcome:
        """`tools/call`, sent again with the same key after a broken connection."""
        try:
            return await self._reconnecting(
                lambda client: start_task(client, self.name, self.arguments, self.meta),
                "sending tools/call with its key again",
            )
        except MCPError as error:
            if self.states_outcome:
                raise self.function._error_outcome(error) from error
            raise self.function._refused(error) from error

    async def _get(self, state: TaskOutcome) -> TaskOutcome:
        """`tasks/get` of the same task, asked again after a broken connection."""
        task_id = state.task_id
        assert task_id is not None
        try:
            return await self._reconnecting(
                lambda client: read_task(client, task_id), f"asking for task {task_id} again"
            )
        except MCPError as error:  # it answered, but not with the task: it may have run
            raise ToolLost(
                f"MCP server {self.server.name!r} no longer answers for task {task_id!r} of "
                f"{self.name!r} ({describe(error)}); the tool may or may not have run"
            ) from error

    async def _reconnecting(self, request: Callable[[Client], Awaitable[_T]], again: str) -> _T:
        """`request` on this process's session of the server; a broken connection is opened
        again and `request` sent again, `RESENDS` times in a row at most, and never past the
        point where the task is to be cancelled. An error answer (`MCPError` other than a
        broken connection) is raised as it is."""
        sessions = pool()
        failures = 0
        while True:
            session = sessions.current(self.server)
            try:
                return await request(self.client)
            except asyncio.CancelledError:
                raise
            except MCPError as error:
                if not connection_broke(error):
                    raise
                sessions.discard(self.server, session)
                broken: BaseException = error
            except Exception as e:
                sessions.discard(self.server, session)
                broken = e
            while True:
                failures += 1
                late = self.cancel_at is not None and time.monotonic() >= self.cancel_at
                if failures > RESENDS or late:
                    raise self.function._lost(broken) from broken
                log.info(
                    "MCP server %s: the connection broke during %s (%s); %s",
                    self.server.name,
                    self.name,
                    describe(broken),
                    again,
                )
                await anyio.sleep(min(RESEND_BACKOFF * 2 ** (failures - 1), 2.0))
                try:
                    self.client = await sessions.session(self.server)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    broken = e

    # --- ends ---------------------------------------------------------------------------------

    def _report(self, state: TaskOutcome) -> None:
        """A task waiting for input (a remote approval) is reported as waiting: logged when it
        starts to, and the attempt keeps following it until its time limit."""
        if state.status == "input_required":
            log.warning(
                "MCP server %s: task %s of %s waits for input there (a remote approval: %s); "
                "this attempt keeps waiting until its time limit",
                self.server.name,
                state.task_id,
                self.name,
                state.task.get("statusMessage") or "no message",
            )
        else:
            log.info(
                "MCP server %s: task %s of %s is %s", self.server.name, state.task_id, self.name,
                state.status,
            )  # fmt: skip

    def _stated(self, state: TaskOutcome) -> Outcome | None:
        """The outcome the server states for the task (None without the outcome extension)."""
        if not self.states_outcome:
            return None
        meta = state.task.get("_meta")
        stated = outcome_in(meta if isinstance(meta, Mapping) else None)
        if state.result is not None:
            stated = outcome_in(state.result.meta) or stated
        return stated

    def _ended(self, state: TaskOutcome) -> Any:
        """The attempt's end from an ended task, or from a plain result (table above)."""
        stated = self._stated(state)
        message = str(state.task.get("statusMessage") or "")
        if state.status in ("completed", "result"):
            if state.result is None:
                raise ToolLost(
                    f"MCP server {self.server.name!r} says task {state.task_id!r} of "
                    f"{self.name!r} completed but sent no result; it may or may not have run"
                )
            if self.states_outcome:
                return self.function._settle(state.result, stated)
            return self.function._value(state.result)
        if state.status == "cancelled":
            if stated is Outcome.NOT_EXECUTED:
                raise self._did_not_run(f"its task was cancelled ({message or 'no reason given'})")
            raise ToolLost(
                f"MCP server {self.server.name!r} cancelled task {state.task_id!r} of "
                f"{self.name!r} ({message or 'no reason given'}); it may or may not have run"
            )
        # `failed`
        detail = result_texts(state.result) if state.result is not None else message
        if stated is Outcome.NOT_EXECUTED:
            raise RetryableToolError(
                f"{DID_NOT_RUN}: MCP server {self.server.name!r} says {self.name!r} was not "
                f"executed ({detail or 'no reason given'})"
            )
        if stated is Outcome.UNKNOWN:
            raise ToolLost(
                f"MCP server {self.server.name!r} says task {state.task_id!r} of {self.name!r} "
                f"failed with an unknown outcome: it may or may not have taken effect ({detail})"
            )
        if state.result is not None:
            return self.function._value(state.result)  # `isError`: the tool error it states
        raise ToolError(
            f"MCP server {self.server.name!r}: task {state.task_id!r} of {self.name!r} "
            f"failed ({message or 'no reason given'})"
        )

    def _did_not_run(self, why: str) -> ToolError:
        # Not retryable: the same key names the same cancelled task on the server.
        return ToolError(
            f"{DID_NOT_RUN}: MCP server {self.server.name!r} says {self.name!r} was not "
            f"executed: {why}"
        )

    async def _cancel_near_limit(self, state: TaskOutcome) -> Any:
        """`tasks/cancel` shortly before the attempt's time limit, then the task as it is now."""
        task_id = state.task_id
        assert task_id is not None
        answer = "no answer"
        with anyio.move_on_after(CANCEL_TIMEOUT):
            try:
                ack = await request_cancel(self.client, task_id)
                meta = ack.get("_meta") if isinstance(ack.get("_meta"), Mapping) else {}
                assert isinstance(meta, Mapping)
                answer = str(meta.get("dex-celery/cancel") or "acknowledged")
                state = await read_task(self.client, task_id)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # what was seen last stands: it may still run
                answer = f"{answer}; then {describe(e)}"
        log.warning(
            "MCP server %s: task %s of %s was %s near the attempt's time limit; tasks/cancel: %s",
            self.server.name,
            task_id,
            self.name,
            state.status,
            answer,
        )
        if state.status in ENDED and state.status != "cancelled":
            return self._ended(state)  # it ended meanwhile: its own outcome
        if self._stated(state) is Outcome.NOT_EXECUTED:
            raise self._did_not_run(
                f"its task was cancelled near the attempt's time limit before it ran ({answer})"
            )
        waiting = ""
        if state.status == "input_required":
            waiting = " waiting for input there (a remote approval)"
        raise ToolLost(
            f"task {task_id!r} of {self.name!r} on MCP server {self.server.name!r} was still "
            f"{state.status}{waiting} near the attempt's time limit; tasks/cancel was sent "
            f"(answer: {answer}), but the tool may or may not take effect"
        )

    async def _cancel_quietly(self) -> None:
        assert self.task_id is not None
        with anyio.move_on_after(CANCEL_TIMEOUT):
            try:
                await request_cancel(self.client, self.task_id)
            except Exception as e:
                log.info("MCP server %s: tasks/cancel of %s: %s", self.server.name, self.task_id,
                         describe(e))  # fmt: skip
