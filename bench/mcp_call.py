"""Cost of one MCP tool attempt on a worker: the tool body of `dex.add_mcp_server`, called
directly, against the test MCP server over stdio (a server process started per attempt) and over
streamable HTTP (one running server).

    .venv/bin/python -m bench.mcp_call --calls 10
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from devtools.processes import ROOT, free_port, wait_for
from dex_celery.integrations.mcp_client import McpServer, McpToolFunction
from dex_celery.model.ids import CallKey
from dex_celery.tools.tool import ToolContext

#: `devtools.mcp_tools_server.LOG_ENV` (not imported: that module builds its server, and
#: with it the MCP SDK's logging set-up, on import).
LOG_ENV = "DEX_TEST_MCP_LOG"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _measure(name: str, body: McpToolFunction, calls: int) -> None:
    ctx = ToolContext(CallKey.of("bench", "t", "c"), 1)
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        body(ctx, order_id="A")
        seconds.append(time.perf_counter() - start)
    print(f"{name}: median {statistics.median(seconds):.3f}s, min {min(seconds):.3f}s per attempt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=10)
    calls = parser.parse_args().calls
    env = {"PYTHONPATH": str(ROOT), LOG_ENV: tempfile.mkdtemp(prefix="dex-bench-mcp-")}
    command = (sys.executable, "-m", "devtools.mcp_tools_server")
    _measure(
        "stdio", McpToolFunction(McpServer("stdio", command=command, env=env), "lookup"), calls
    )
    port = free_port()
    server = subprocess.Popen(
        [*command, "--http", str(port)],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _listening(port), timeout=30, what="the MCP HTTP server")
        url = f"http://127.0.0.1:{port}/mcp"
        _measure("http", McpToolFunction(McpServer("http", url=url), "lookup"), calls)
    finally:
        server.kill()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
