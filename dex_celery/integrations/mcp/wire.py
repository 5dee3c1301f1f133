"""What dex-celery's MCP client and server agree on, and the texts an attempt's errors read.

One module both sides import, so no module reaches into another's private names: the `_meta`
keys every `tools/call` carries, the tasks extension's identifier, the resend rules of an
attempt whose connection broke (answered at once, `client.py`, or followed as a task,
`remote_task.py`), and the one-line texts of an SDK error or a tool result.
"""

from __future__ import annotations

import mcp_types
from mcp import MCPError

#: The `_meta` key of every `tools/call` a worker sends: the call's idempotency key
#: (`session/turn/call`, the same for every attempt, S2.1). Vendor-prefixed, since MCP has no
#: standard key for it; `dex-celery mcp` reads the same key to take a caller's ids.
IDEMPOTENCY_META_KEY = "dex-celery/idempotency-key"
#: The `_meta` key carrying the attempt number (1, 2, ...), for the server's logs.
ATTEMPT_META_KEY = "dex-celery/attempt"
#: The tasks extension's identifier (2026-07-28), in a client's per-request capabilities and a
#: server's: served by `tasks.py`, followed as a client by `remote_task.py`.
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

#: How many times in a row a broken connection is opened again and the same key sent again
#: before the attempt is lost (S4.3).
RESENDS = 5
#: The first wait (seconds) before a resend; it doubles each time, up to two seconds.
RESEND_BACKOFF = 0.25


def connection_broke(error: MCPError) -> bool:
    """The SDK's error for a connection that closed or a request that timed out: no answer
    came, so a server that was sent the request may or may not have acted on it."""
    return error.code in (mcp_types.CONNECTION_CLOSED, mcp_types.REQUEST_TIMEOUT)


def result_texts(result: mcp_types.CallToolResult) -> str:
    """The text blocks of a tool result, one per line."""
    return "\n".join(b.text for b in result.content if isinstance(b, mcp_types.TextContent))


def describe(e: BaseException) -> str:
    """One line for an error that may be an exception group from the SDK's task groups."""
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(describe(inner) for inner in e.exceptions)
    if isinstance(e, MCPError):
        return f"MCP error {e.code}: {e.message}"
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
