"""TypeScript agents over MCP (docs/frameworks.md, "Vercel AI SDK (TypeScript, over MCP)" and
"Mastra (TypeScript, over MCP)"): the docs' example `turn` of each framework, driven by a
scripted model under node, calls dex tools of a real `dex-celery mcp --transport http` (with a
token) that a real prefork worker runs: a read runs once; a write that asks a person waits,
and once approved in dex the same call runs, once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from devtools.processes import Worker
from dex_celery import CallStatus, Dex
from tests.support.crash import lines
from tests.support.ts_agents import FRAMEWORKS, MISSING, NODE, mcp_http, session_of, tool_call, turn

pytestmark = pytest.mark.skipif(not NODE.exists(), reason=MISSING)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_ts_agent_runs_a_dex_tool_once(
    framework: str,
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    tmp_path: Path,
) -> None:
    start_worker()
    tool = "dex_echo" if framework == "mastra" else "echo"
    with mcp_http(env, "desk") as url:
        done = turn(
            framework, url, tmp_path, "t1", "Look up order A.",
            [tool_call(tool, {"query": "order A"}, "call_read"), "Found it."],
        )  # fmt: skip
    (call,) = dex.client().get_agent_snapshot(session_of("desk")).tool_calls
    assert call.status is CallStatus.SUCCEEDED
    assert len(lines(call.key, "start")) == 1
    assert "order A" in done.tool_results()[0]
    assert done.messages()[-1]["role"] == "assistant"
