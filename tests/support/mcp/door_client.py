"""An MCP client run as its own process (inside a test's network namespace): each step of the
JSON plan on argv[1] connects with the SDK's streamable HTTP client, with the step's headers,
and calls one tool; one JSON line per step on stdout says what came back.

`python -m tests.support.mcp.door_client '[{"url": ..., "headers": {...}, "tool": ...,
"arguments": {...}, "meta": {...}}]'`
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def step(plan: dict[str, Any]) -> dict[str, Any]:
    http = create_mcp_http_client(headers=plan.get("headers") or {})
    try:
        async with http, Client(streamable_http_client(plan["url"], http_client=http)) as mcp:
            if plan.get("tool") is None:
                tools = await mcp.list_tools()
                return {"ok": True, "tools": sorted(t.name for t in tools.tools)}
            result = await mcp.call_tool(
                plan["tool"], plan.get("arguments") or {}, meta=plan.get("meta") or None
            )
            return {
                "ok": True,
                "is_error": result.is_error,
                "text": "\n".join(getattr(b, "text", "") for b in result.content),
                "meta": dict(result.meta or {}),
            }
    except BaseException as e:  # the refusal, however the SDK reports it
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


async def main(plans: list[dict[str, Any]]) -> None:
    for plan in plans:
        with anyio.fail_after(60):
            print(json.dumps(await step(plan)), flush=True)


if __name__ == "__main__":
    anyio.run(main, json.loads(sys.argv[1]))
