"""The agent-loop helper: run one model turn's tool calls and hand back the tool results.

Plug it into your own loop: after the model answers with OpenAI-style tool calls
(`{"id", "type": "function", "function": {"name", "arguments"}}`), call

    results = run_tool_calls(client, session_id, turn_id, message["tool_calls"])
    history += [message, *results]

Every valid call is requested in one batch (one SQL transaction, S2.3: asking again with the same
ids returns the same calls and runs nothing twice), then waited for. A call that cannot be
requested (arguments that are not JSON or do not fit the tool's signature, an unknown tool, a bad
id, ids reused for another call) gets its own `Error: ...` message and is not recorded; the
other calls of the turn run. Only a turn that cannot be answered call by call (not a list, a call
without an id, one id twice) raises. Each result is
`{"role": "tool", "tool_call_id", "content"}`, where `content` is the text the session history
keeps for the call (S4.4): the tool's JSON result, `Error: ...` (the did-not-run sentence where it
applies, S4.2), the rejection, or `OUTCOME_UNKNOWN_TOOL_RESULT` (S4.5). A failed or unknown call
is a result for the model to read, not an exception. If the wait runs out (`CallTimeout`), call
again with the same tool calls to keep waiting. If the request itself raises `RequestInFlight`
(the calls are recorded, or may be, but Redis or the database failed before they were started),
call again with the same tool calls too: the same ids follow the same calls (S11.2).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dex_celery.engine import CallRequest
from dex_celery.errors import CallConflict, DexError, InvalidRequest
from dex_celery.model.outcomes import tool_output
from dex_celery.model.records import ToolCallRecord

if TYPE_CHECKING:
    from dex_celery.client.dex_client import AsyncDexClient, DexClient
    from dex_celery.engine import Dispatcher

#: Default seconds to wait for a turn's calls (a call waiting for approval can take longer).
DEFAULT_TURN_TIMEOUT = 300.0


@dataclass(frozen=True, slots=True)
class ModelToolCall:
    """One tool call as the model wrote it."""

    id: str
    name: str
    arguments: str | Mapping[str, Any]

    @classmethod
    def parse(cls, raw: object) -> ModelToolCall:
        """Read `{"id", "function": {"name", "arguments"}}`; `InvalidRequest` for anything else."""
        if not isinstance(raw, Mapping):
            raise InvalidRequest(f"a tool call must be an object, got {type(raw).__name__}")
        function = raw.get("function")
        if not isinstance(function, Mapping):
            raise InvalidRequest(f"tool call {raw.get('id')!r} has no 'function' object")
        call_id, name = raw.get("id"), function.get("name")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidRequest(f"a tool call has no 'id' (got {call_id!r})")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"tool call {call_id!r} has no function name")
        arguments = function.get("arguments")
        if arguments is None or arguments == "":
            arguments = "{}"
        if not isinstance(arguments, str | Mapping):
            raise InvalidRequest(
                f"the arguments of tool call {call_id!r} must be JSON text or an object"
            )
        return cls(call_id, name, arguments)


def tool_result_message(tool_call_id: str, record: ToolCallRecord) -> dict[str, str]:
    """The message to append to the model's input for one ended call."""
    return {
        "role": "tool",
        "tool_call_id": tool_call_id,
        "content": tool_output(record.status, record.result, record.error or ""),
    }


@dataclass(frozen=True, slots=True)
class TurnPlan:
    """A turn's tool calls split into requests to record and calls refused one by one."""

    ids: tuple[str, ...]  # every tool call id, in the model's order
    requests: tuple[CallRequest, ...]
    refused: Mapping[str, str]  # tool call id -> why (the text of its error message)


def plan_turn(
    dispatcher: Dispatcher, session_id: str, turn_id: str, tool_calls: Sequence[object]
) -> TurnPlan:
    """Check each call on its own (nothing is written); only a turn without usable ids raises."""
    if isinstance(tool_calls, str | bytes | Mapping):
        raise InvalidRequest("tool_calls must be a list of tool calls")
    ids: list[str] = []
    requests: list[CallRequest] = []
    refused: dict[str, str] = {}
    for raw in tool_calls:
        call_id = raw.get("id") if isinstance(raw, Mapping) else None
        if not isinstance(call_id, str) or not call_id:
            raise InvalidRequest(f"a tool call has no 'id' (got {call_id!r})")
        if call_id in ids:
            raise InvalidRequest(f"tool call id {call_id!r} appears twice in one turn")
        ids.append(call_id)
        try:
            call = ModelToolCall.parse(raw)
            request = CallRequest(session_id, turn_id, call.id, call.name, _arguments(call))
            dispatcher.check(request)
        except DexError as e:
            refused[call_id] = str(e)
            continue
        requests.append(request)
    return TurnPlan(tuple(ids), tuple(requests), refused)


def _arguments(call: ModelToolCall) -> str | Mapping[str, Any]:
    # Text is parsed (and refused if it is not a JSON object) by the dispatcher (S9.3).
    return call.arguments if isinstance(call.arguments, str) else dict(call.arguments)


def refused_message(tool_call_id: str, reason: str) -> dict[str, str]:
    """The message of a call that was refused at request time: it did not run."""
    return {
        "role": "tool",
        "tool_call_id": tool_call_id,
        "content": f"Error: the call was refused and did not run: {reason}",
    }


def _request(client: DexClient, plan: TurnPlan) -> tuple[list[ToolCallRecord], dict[str, str]]:
    """All valid calls in one batch; if ids were reused for another call (found only against
    the store), each call on its own, so only the conflicting ones are refused."""
    refused = dict(plan.refused)
    if not plan.requests:
        return [], refused
    try:
        return client.request_calls(list(plan.requests)), refused
    except CallConflict:
        records = []
        for request in plan.requests:
            try:
                records.extend(client.request_calls([request]))
            except CallConflict as e:
                refused[request.tool_call_id] = str(e)
        return records, refused


def _results(
    plan: TurnPlan, refused: Mapping[str, str], records: Sequence[ToolCallRecord]
) -> list[dict[str, str]]:
    by_id = {r.tool_call_id: r for r in records}
    return [
        refused_message(i, refused[i]) if i in refused else tool_result_message(i, by_id[i])
        for i in plan.ids
    ]


def run_tool_calls(
    client: DexClient,
    session_id: str,
    turn_id: str,
    tool_calls: Sequence[object],
    *,
    timeout: float = DEFAULT_TURN_TIMEOUT,
) -> list[dict[str, str]]:
    """Request a turn's tool calls in one batch, wait for all, return their result messages."""
    plan = plan_turn(client.source.runtime.dispatcher, session_id, turn_id, tool_calls)
    if not plan.ids:
        return []
    records, refused = _request(client, plan)
    done = client.wait([r.key for r in records], timeout=timeout) if records else []
    return _results(plan, refused, done)


async def run_tool_calls_async(
    client: AsyncDexClient,
    session_id: str,
    turn_id: str,
    tool_calls: Sequence[object],
    *,
    timeout: float = DEFAULT_TURN_TIMEOUT,
) -> list[dict[str, str]]:
    """`run_tool_calls` for an async agent loop."""
    sync = client.sync
    plan = await asyncio.to_thread(
        plan_turn, sync.source.runtime.dispatcher, session_id, turn_id, tool_calls
    )
    if not plan.ids:
        return []
    records, refused = await asyncio.to_thread(_request, sync, plan)
    done = await client.wait([r.key for r in records], timeout=timeout) if records else []
    return _results(plan, refused, done)
