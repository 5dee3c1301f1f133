"""TypeScript agents over MCP (docs/frameworks.md, "Vercel AI SDK (TypeScript, over MCP)" and
"Mastra (TypeScript, over MCP)"): the docs' example `turn` of each framework, driven by a
scripted model under node, calls dex tools of a real `dex-celery mcp --transport http` (with a
token) that a real prefork worker runs: a read runs once; a write that asks a person waits,
and once approved in dex the same call runs, once."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.processes import ROOT, Worker
from dex_celery import CallStatus, Dex
from tests.support.faults.crash import lines
from tests.support.mcp.ts_agents import (
    FRAMEWORKS,
    JS,
    MISSING,
    NODE,
    mcp_http,
    session_of,
    tool_call,
    turn,
)

needs_node = pytest.mark.skipif(not NODE.exists(), reason=MISSING)


@pytest.fixture
def desk(env: dict[str, str], start_worker: Callable[..., Worker]) -> Iterator[str]:
    """A worker and `dex-celery mcp --transport http --session desk`: its URL."""
    start_worker()
    with mcp_http(env, "desk") as url:
        yield url


@needs_node
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_ts_agent_runs_a_dex_tool_once(
    framework: str, dex: Dex, desk: str, tmp_path: Path
) -> None:
    tool = "dex_echo" if framework == "mastra" else "echo"
    done = turn(
        framework, desk, tmp_path, "t1", "Look up order A.",
        [tool_call(tool, {"query": "order A"}, "call_read"), "Found it."],
    )  # fmt: skip
    (call,) = dex.client().get_agent_snapshot(session_of("desk")).tool_calls
    assert call.status is CallStatus.SUCCEEDED
    assert len(lines(call.key, "start")) == 1
    assert "order A" in done.tool_results()[0]
    assert done.messages()[-1]["role"] == "assistant"


@needs_node
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_ts_agents_call_waits_for_approval_in_dex_and_then_runs_once(
    framework: str, dex: Dex, desk: str, tmp_path: Path
) -> None:
    """The write asks a person (S1.3): the model reads that it waits and has not run; approved
    in dex, the model's next call of the same tool with the same arguments is that call (a
    request without ids while its outcome was not given, docs/mcp.md) and runs it, once."""
    tool = "dex_guarded_write" if framework == "mastra" else "guarded_write"
    asked = turn(
        framework, desk, tmp_path, "t1", "Write ok.",
        [tool_call(tool, {"value": "ok"}, "call_a"), "It waits for a person."],
    )  # fmt: skip
    (key,) = [c.key for c in dex.client().get_agent_snapshot(session_of("desk")).tool_calls]
    assert dex.client().get_call(key).status is CallStatus.AWAITING_APPROVAL
    assert "waiting for a person's approval and has not run" in asked.tool_results()[0]
    assert lines(key, "start") == []
    dex.client().approve(key, "ops@example.com")
    done = turn(
        framework, desk, tmp_path, "t2", "Approved: go on.",
        [tool_call(tool, {"value": "ok"}, "call_b"), "Written."],
        asked.history,
    )  # fmt: skip
    record = dex.client().get_call(key)
    assert record.status is CallStatus.SUCCEEDED
    assert record.approval is not None and record.approval.decided_by == "ops@example.com"
    assert '"ok"' in done.tool_results()[0].replace("\\", "")
    assert [c.key for c in dex.client().get_agent_snapshot(session_of("desk")).tool_calls] == [key]
    assert len(lines(key, "start")) == 1


def test_the_docs_show_the_examples_the_tests_run() -> None:
    """Each `ts` block of docs/frameworks.md is the example file it names, as the tests run it."""
    text = (ROOT / "docs" / "frameworks.md").read_text()
    blocks = re.findall(r"^```ts\n(// file: (\S+)\n.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert sorted(name for _, name in blocks) == [
        "ai-sdk-agent.ts",
        "history.ts",
        "mastra-agent.ts",
    ]
    for block, name in blocks:
        assert block == (JS / "examples" / name).read_text(), name
