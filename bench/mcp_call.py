"""Cost of one MCP tool attempt's body on a worker, before and after warm sessions, against a
native dex tool's body in the same run.

- `native`: a plain dex tool body returning the same answer (the floor);
- `cold`: what every attempt did before `integrations/mcp/sessions`: start and greet the server, call, close;
- `warm`: the tool body of `dex.add_mcp_server` on this process's warm session (ping + call).

Servers: the project's test server (`devtools.mcp_tools_server`, tool `lookup`) and the
third-party `mcp-server-time` from PyPI (tool `get_current_time`), both over stdio.

    .venv/bin/python -m bench.mcp_call --calls 50
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from devtools.processes import ROOT
from dex_celery.integrations.mcp.client import McpServer, McpToolFunction, run_sync
from dex_celery.model.ids import CallKey
from dex_celery.tools.tool import ToolContext

#: `devtools.mcp_tools_server.LOG_ENV` (not imported: that module builds its server, and
#: with it the MCP SDK's logging set-up, on import).
LOG_ENV = "DEX_TEST_MCP_LOG"


def _median_ms(body: Callable[[], Any], calls: int) -> float:
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        body()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds) * 1e3


def _cold(server: McpServer, tool: str, arguments: dict[str, Any]) -> Any:
    async def once() -> Any:
        async with server.client() as client:
            return await client.call_tool(tool, arguments)

    return run_sync(once())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--cold-calls", type=int, default=10)
    args = parser.parse_args()
    ctx = ToolContext(CallKey.of("bench", "t", "c"), 1)

    def native(ctx: ToolContext, order_id: str) -> dict[str, str]:
        return {"order_id": order_id, "status": "open"}

    native_ms = _median_ms(lambda: native(ctx, order_id="A"), args.calls)
    env = {"PYTHONPATH": str(ROOT), LOG_ENV: tempfile.mkdtemp(prefix="dex-bench-mcp-")}
    servers = [
        (
            McpServer("test", command=(sys.executable, "-m", "devtools.mcp_tools_server"), env=env),
            "lookup",
            {"order_id": "A"},
        ),
        (
            McpServer("time", command=(sys.executable, "-m", "mcp_server_time")),
            "get_current_time",
            {"timezone": "Europe/Paris"},
        ),
    ]
    print(f"native dex tool body: median {native_ms:.3f} ms")
    for server, tool, arguments in servers:
        cold = _median_ms(functools.partial(_cold, server, tool, arguments), args.cold_calls)
        body = McpToolFunction(server, tool)
        body(ctx, **arguments)  # opens the warm session
        warm = _median_ms(functools.partial(body, ctx, **arguments), args.calls)
        print(
            f"{server.name} {tool}: cold (a server per attempt) {cold:.1f} ms, "
            f"warm {warm:.2f} ms (warm - native {warm - native_ms:.2f} ms, "
            f"cold/warm {cold / warm:.0f}x)"
        )


if __name__ == "__main__":
    main()
