"""The agent-loop helper: run one model turn's tool calls and hand back the tool results.

Plug it into your own loop: after the model answers with OpenAI-style tool calls
(`{"id", "type": "function", "function": {"name", "arguments"}}`), call

    results = run_tool_calls(client, session_id, turn_id, message["tool_calls"])
    history += [message, *results]

Every call is requested in one batch (one SQL transaction, S2.3: asking again with the same ids
returns the same calls and runs nothing twice), then waited for. Each result is
`{"role": "tool", "tool_call_id", "content"}`, where `content` is the text the session history
keeps for the call (S4.4): the tool's JSON result, `Error: ...` (the did-not-run sentence where it
applies, S4.2), the rejection, or `OUTCOME_UNKNOWN_TOOL_RESULT` (S4.5). A failed or unknown call
is a result for the model to read, not an exception. If the wait runs out (`CallTimeout`), call
again with the same tool calls to keep waiting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dex_celery.dispatch import CallRequest
from dex_celery.errors import InvalidRequest
from dex_celery.outcomes import tool_output
from dex_celery.records import ToolCallRecord

if TYPE_CHECKING:
    from dex_celery.client import AsyncDexClient, DexClient

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


def build_requests(
    session_id: str, turn_id: str, tool_calls: Sequence[object]
) -> tuple[list[ModelToolCall], list[CallRequest]]:
    """Parse every tool call before anything is recorded; duplicate ids are refused."""
    if isinstance(tool_calls, str | bytes | Mapping):
        raise InvalidRequest("tool_calls must be a list of tool calls")
    parsed = [ModelToolCall.parse(raw) for raw in tool_calls]
    seen: set[str] = set()
    for call in parsed:
        if call.id in seen:
            raise InvalidRequest(f"tool call id {call.id!r} appears twice in one turn")
        seen.add(call.id)
    requests = [
        CallRequest(session_id, turn_id, call.id, call.name, _arguments(call)) for call in parsed
    ]
    return parsed, requests


def _arguments(call: ModelToolCall) -> str | Mapping[str, Any]:
    # Text is parsed (and refused if it is not a JSON object) by the dispatcher (S9.3).
    return call.arguments if isinstance(call.arguments, str) else dict(call.arguments)


def _results(
    parsed: Sequence[ModelToolCall], records: Sequence[ToolCallRecord]
) -> list[dict[str, str]]:
    by_id = {r.tool_call_id: r for r in records}
    return [tool_result_message(call.id, by_id[call.id]) for call in parsed]


def run_tool_calls(
    client: DexClient,
    session_id: str,
    turn_id: str,
    tool_calls: Sequence[object],
    *,
    timeout: float = DEFAULT_TURN_TIMEOUT,
) -> list[dict[str, str]]:
    """Request a turn's tool calls in one batch, wait for all, return their result messages."""
    parsed, requests = build_requests(session_id, turn_id, tool_calls)
    if not parsed:
        return []
    records = client.request_calls(requests)
    done = client.wait([r.key for r in records], timeout=timeout)
    return _results(parsed, done)


async def run_tool_calls_async(
    client: AsyncDexClient,
    session_id: str,
    turn_id: str,
    tool_calls: Sequence[object],
    *,
    timeout: float = DEFAULT_TURN_TIMEOUT,
) -> list[dict[str, str]]:
    """`run_tool_calls` for an async agent loop."""
    parsed, requests = build_requests(session_id, turn_id, tool_calls)
    if not parsed:
        return []
    records = await client.request_calls(requests)
    done = await client.wait([r.key for r in records], timeout=timeout)
    return _results(parsed, done)
