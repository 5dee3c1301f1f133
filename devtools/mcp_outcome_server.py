"""A third-party-style MCP server of the outcome extension (docs/mcp-outcome-extension.md), built
with the `mcp` SDK's own `MCPServer` and nothing of dex-celery's server: what another project
implementing the extension would write, for the tests of dex-celery's client side.

It advertises `dex-celery/outcome`, keeps one call per idempotency key (a re-sent key waits for
the first send's run and answers its outcome, across server processes: the state is in files)
and states each answer's outcome. Every run appends `start <key>` and `end <key>` to
`$DEX_TEST_MCP_LOG/outcome-runs.log`, the server's own witness of what ran.

- `charge(amount)`: a write; holds while `<log>/hold` exists until `<log>/release` does (a test
  cuts the connection meanwhile), then answers `executed`.
- `refuse(amount)`: never runs; answers `isError` with `not_executed`.
- `vague(amount)`: answers `isError` with `unknown` (it lost track of a downstream write).

With `$DEX_TEST_OUTCOME_OFF=1` it neither advertises the extension nor states outcomes: a
server of plain MCP, for the fallback tests.

    python -m devtools.mcp_outcome_server --http PORT
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from mcp.server.extension import Extension
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from devtools.mcp_tools_server import LOG_ENV, log_dir

#: The extension's identifier and `_meta` keys, spelled out as another project would.
EXTENSION = "dex-celery/outcome"
KEY = "dex-celery/idempotency-key"
OUTCOME = "dex-celery/outcome"
OFF_ENV = "DEX_TEST_OUTCOME_OFF"

__all__ = ["LOG_ENV", "runs"]


def _on() -> bool:
    return os.environ.get(OFF_ENV) != "1"


class OutcomeExtension(Extension):
    identifier = EXTENSION

    def settings(self) -> dict[str, Any]:
        return {"version": "2026-12-06", "outcomes": ["executed", "not_executed", "unknown"]}


server = MCPServer("outcome-test-server", extensions=[OutcomeExtension()] if _on() else [])


def runs() -> list[tuple[str, str]]:
    """`(start|end, key)` of every run any server process made."""
    path = log_dir() / "outcome-runs.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(kind, key) for kind, key in (line.split(" ", 1) for line in lines)]


def _log(kind: str, key: str) -> None:
    with (log_dir() / "outcome-runs.log").open("a") as f:
        f.write(f"{kind} {key}\n")


def _answer(text: str, outcome: str, key: str, *, error: bool) -> CallToolResult:
    meta = {OUTCOME: outcome, KEY: key} if _on() else None
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=error, _meta=meta)


def _key(ctx: Context) -> str:
    return str(dict(ctx.request_context.meta or {}).get(KEY, "-"))


def _files(key: str) -> tuple[Path, Path]:
    folder = log_dir() / "outcome-calls"
    folder.mkdir(exist_ok=True)
    digest = hashlib.sha256(key.encode()).hexdigest()
    return folder / f"{digest}.running", folder / f"{digest}.json"


def _same_call(key: str) -> CallToolResult | None:
    """The answer of the call `key` already is (waiting for a run in progress), or None if the
    key is new (it is then claimed for this request)."""
    running, done = _files(key)
    try:
        running.touch(exist_ok=False)
        return None
    except FileExistsError:
        pass
    deadline = time.monotonic() + 60
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    stored = json.loads(done.read_text())
    return _answer(stored["text"], stored["outcome"], key, error=stored["error"])


@server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
def charge(amount: int, ctx: Context) -> CallToolResult:
    """Charge `amount`: one run per idempotency key."""
    key = _key(ctx)
    if _on() and key != "-" and (again := _same_call(key)) is not None:
        return again
    _log("start", key)
    if (log_dir() / "hold").exists():
        deadline = time.monotonic() + 60
        while not (log_dir() / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    _log("end", key)
    text = f"charged {amount}"
    _files(key)[1].write_text(json.dumps({"text": text, "outcome": "executed", "error": False}))
    return _answer(text, "executed", key, error=False)


@server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
def refuse(amount: int, ctx: Context) -> CallToolResult:
    """Refuses every call before it runs (over a limit)."""
    return _answer(f"refused: {amount} is over the limit", "not_executed", _key(ctx), error=True)


@server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
def vague(amount: int, ctx: Context) -> CallToolResult:
    """Lost track of its downstream write."""
    _log("start", _key(ctx))
    return _answer("the bank did not answer", "unknown", _key(ctx), error=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, required=True, help="serve streamable HTTP on PORT")
    args = parser.parse_args()
    server.run("streamable-http", host="127.0.0.1", port=args.http, stateless_http=True)


if __name__ == "__main__":
    main()
