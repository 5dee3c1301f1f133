"""A real MCP server for the tests, built with the `mcp` SDK's own `MCPServer` class.

One tool per kind of annotation (read-only, idempotent, additive, destructive, none at all, a
title only), plus two that hold until released so a test can kill the server mid-call. Every
tool appends `<tool> <pid> <idempotency key>` to `$DEX_TEST_MCP_LOG/calls.log` before it answers:
the server's own witness of what ran and which key it received in the request's `_meta`.

    python -m devtools.mcp_tools_server                 # stdio
    python -m devtools.mcp_tools_server --http PORT
    python -m devtools.mcp_tools_server --http PORT --stateful   # sessions, ended by DELETE

Over stateful HTTP the server also writes down the session id of every `lookup` call
(`sessions.log`) and of every session a client ended with `DELETE` (`closed.log`): how a test
tells a session closed by its client from one dropped with the client's process.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from starlette.types import ASGIApp, Receive, Scope, Send

from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY

LOG_ENV = "DEX_TEST_MCP_LOG"

server = MCPServer("dex-test-tools")


def log_dir() -> Path:
    path = Path(os.environ.get(LOG_ENV, "/tmp/dex-test-mcp-log"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def calls() -> list[tuple[str, int, str]]:
    """`(tool, server pid, idempotency key)` of every call any server process answered."""
    path = log_dir() / "calls.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(t, int(p), k) for t, p, k in (line.split(" ", 2) for line in lines)]


def _note(tool: str, ctx: Context) -> None:
    meta: dict[str, Any] = dict(ctx.request_context.meta or {})
    key = meta.get(IDEMPOTENCY_META_KEY, "-")
    with (log_dir() / "calls.log").open("a") as f:
        f.write(f"{tool} {os.getpid()} {key}\n")
    if "traceparent" in meta:
        with (log_dir() / "traceparents.log").open("a") as f:
            f.write(f"{key} {meta['traceparent']}\n")


def traceparents() -> dict[str, str]:
    """The W3C `traceparent` each call's request carried in `_meta`, by idempotency key."""
    path = log_dir() / "traceparents.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return dict(line.split(" ", 1) for line in lines)


#: The request header the HTTP tests send through `add_mcp_server(headers=...)`.
HEADER = "x-dex-test"


def headers_seen() -> list[str]:
    """Values of `HEADER` the `lookup` tool saw, one line per call that had one."""
    path = log_dir() / "headers.log"
    return path.read_text().splitlines() if path.exists() else []


def _hold(tool: str) -> None:
    """Wait for `<log>/release`; the test kills this server process meanwhile."""
    (log_dir() / f"holding-{tool}-{os.getpid()}").write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log_dir() / "release").exists():
        time.sleep(0.05)


#: Set to `changed` in the server's environment, or written to `<log>/variant` before a server
#: process starts: `lookup` gets another definition (an extra argument, no read-only hint), as a
#: server updated under a running deployment would.
VARIANT_ENV = "DEX_TEST_MCP_VARIANT"


def variant() -> str:
    path = log_dir() / "variant"
    return os.environ.get(VARIANT_ENV) or (path.read_text().strip() if path.exists() else "")


def starts() -> list[int]:
    """The pid of every server process started (one line each, written at start)."""
    path = log_dir() / "starts.log"
    return [int(p) for p in path.read_text().split()] if path.exists() else []


if variant() == "changed":

    @server.tool(annotations=ToolAnnotations(read_only_hint=False))
    def lookup(order_id: str, ctx: Context, verbose: bool = False) -> dict[str, Any]:
        """Read an order (now with more detail on request)."""
        _note("lookup", ctx)
        return {"order_id": order_id, "status": "open", "verbose": verbose}

else:

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def lookup(order_id: str, ctx: Context) -> dict[str, Any]:
        """Read an order."""
        _note("lookup", ctx)
        return _lookup(order_id, ctx)


def _lookup(order_id: str, ctx: Context) -> dict[str, Any]:
    request = ctx.request_context.request
    value = request.headers.get(HEADER) if request is not None else None
    if value:
        with (log_dir() / "headers.log").open("a") as f:
            f.write(value + "\n")
    session = request.headers.get(SESSION_HEADER) if request is not None else None
    if session:
        with (log_dir() / "sessions.log").open("a") as f:
            f.write(session + "\n")
    return {"order_id": order_id, "status": "open"}


@server.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=True))
def set_status(order_id: str, status: str, ctx: Context) -> dict[str, Any]:
    """Set an order's status (repeating it changes nothing more)."""
    _note("set_status", ctx)
    return {"order_id": order_id, "status": status}


@server.tool(annotations=ToolAnnotations(destructive_hint=False))
def add_note(order_id: str, text: str, ctx: Context) -> str:
    """Append a note (additive, not idempotent: missing hints take MCP's defaults)."""
    _note("add_note", ctx)
    return f"note added to {order_id}"


@server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
def cancel(order_id: str, ctx: Context) -> str:
    """Cancel an order."""
    _note("cancel", ctx)
    return f"cancelled {order_id}"


@server.tool()
def bare(value: int, ctx: Context) -> int:
    """No annotations at all: MCP's defaults make it a destructive, non-idempotent write."""
    _note("bare", ctx)
    return value


@server.tool(annotations=ToolAnnotations(title="Titled only"))
def titled(ctx: Context) -> str:
    """Annotations without a single hint."""
    _note("titled", ctx)
    return "ok"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def slow_lookup(ctx: Context) -> str:
    """A read that holds until released (killed mid-call by the test)."""
    _note("slow_lookup", ctx)
    _hold("slow_lookup")
    return "looked up"


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def slow_cancel(ctx: Context) -> str:
    """A destructive write that holds until released (killed mid-call by the test)."""
    _note("slow_cancel", ctx)
    _hold("slow_cancel")
    return "cancelled"


#: Set to `1` in the server's environment: the server lists one more tool, `added_later`.
EXTRA_TOOL_ENV = "DEX_TEST_MCP_EXTRA_TOOL"

if os.environ.get(EXTRA_TOOL_ENV) == "1":

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def added_later(ctx: Context) -> str:
        """A tool the server gained after the first workers started."""
        _note("added_later", ctx)
        return "new"


#: Set to `1` in the server's environment: the server exits at start while `<log>/fail-start`
#: exists (a server that worked once and then broke).
FAIL_START_ENV = "DEX_TEST_MCP_FAIL_START"


#: The streamable HTTP transport's session header (stateful servers only).
SESSION_HEADER = "mcp-session-id"


def lookup_sessions() -> list[str]:
    """The HTTP session id of each `lookup` call (stateful HTTP only), one per call."""
    path = log_dir() / "sessions.log"
    return path.read_text().splitlines() if path.exists() else []


def closed_sessions() -> list[str]:
    """The HTTP session ids clients ended with `DELETE` (stateful HTTP only)."""
    path = log_dir() / "closed.log"
    return path.read_text().splitlines() if path.exists() else []


def _noting_deletes(app: ASGIApp) -> ASGIApp:
    """`app`, writing down the session id of every `DELETE` (a client closing its session)."""

    async def noted(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "DELETE":
            headers = dict(scope["headers"])
            with (log_dir() / "closed.log").open("a") as f:
                f.write(headers.get(SESSION_HEADER.encode(), b"-").decode() + "\n")
        await app(scope, receive, send)

    return noted


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP on PORT")
    parser.add_argument("--stateful", action="store_true", help="HTTP with sessions (see above)")
    args = parser.parse_args()
    with (log_dir() / "starts.log").open("a") as f:
        f.write(f"{os.getpid()}\n")
    if os.environ.get(FAIL_START_ENV) == "1" and (log_dir() / "fail-start").exists():
        raise SystemExit(3)  # a server that no longer starts
    if args.http is None:
        server.run("stdio")
    elif args.stateful:
        # A server of the handshake era (no `server/discover`): clients fall back to
        # `initialize`, which opens a session with an id, ended by the client's `DELETE`.
        server._lowlevel_server._request_handlers.pop("server/discover")
        app = _noting_deletes(server.streamable_http_app(stateless_http=False))
        uvicorn.run(app, host="127.0.0.1", port=args.http, log_level="warning")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http, stateless_http=True)


if __name__ == "__main__":
    main()
