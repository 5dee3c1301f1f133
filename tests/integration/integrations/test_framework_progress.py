"""Long calls are not silent (S12.1): a framework call that waits reports its progress where
the framework's user sees it: LangGraph's custom stream events, the callback of the Pydantic AI,
Agents SDK, ADK and Agent Framework adapters, and a log line. A real prefork worker runs a 2 s
read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from devtools.processes import Worker
from dex_celery import CallStatus, Dex
from dex_celery.integrations.frameworks import calls as framework_calls
from dex_celery.integrations.frameworks.calls import CallProgress

READ = ("slow_read", {"seconds": 2, "value": "found"})


@pytest.fixture(autouse=True)
def often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(framework_calls, "PROGRESS_EVERY", 0.3)


def test_langgraph_streams_the_progress_of_a_long_call(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, HumanMessage

    from dex_celery.integrations.frameworks.langgraph import PROGRESS_EVENT, dex_tools
    from dex_celery.testing.models.langchain import ScriptedChatModel, tool_call

    start_worker()
    model = ScriptedChatModel(turns=[tool_call(*READ, "call_long"), AIMessage("Found it.")])
    agent = create_agent(model, dex_tools(dex, [READ[0]]))
    events = [
        chunk[PROGRESS_EVENT]
        for chunk in agent.stream(
            {"messages": [HumanMessage("Look it up.")]},
            {"configurable": {"thread_id": "lg-long"}},
            stream_mode="custom",
        )
        if PROGRESS_EVENT in chunk
    ]
    assert events, "no progress was streamed"
    assert {e["key"] for e in events} == {"lg-long/turn-1/call_long"}
    assert {e["status"] for e in events} <= {"pending", "running"}
    assert events[-1]["waited"] >= events[0]["waited"] > 0
    assert dex.client().get_call("lg-long/turn-1/call_long").status is CallStatus.SUCCEEDED
    assert model.tool_results()["call_long"] == '"found"'


def test_pydantic_ai_reports_progress_to_its_callback_and_the_log(
    dex: Dex, start_worker: Callable[..., Worker], caplog: pytest.LogCaptureFixture
) -> None:
    from pydantic_ai import Agent

    from dex_celery.integrations.frameworks.pydantic_ai import DexTools
    from dex_celery.testing.models.pydantic_ai import ScriptedModel, tool_call

    start_worker()
    seen: list[CallProgress] = []
    model = ScriptedModel([[tool_call(*READ, "call_long")], "Found it."])
    agent: Agent[None, Any] = Agent(
        model, capabilities=[DexTools(dex, [READ[0]], progress=seen.append)]
    )
    caplog.set_level("INFO", logger="dex_celery.integrations.frameworks.calls")
    assert agent.run_sync("Look it up.", conversation_id="pai-long").output == "Found it."
    assert seen and {p.key for p in seen} == {"pai-long/turn-1/call_long"}
    assert all(p.timeout == 300.0 and p.tool == READ[0] for p in seen)
    assert any("pai-long/turn-1/call_long" in r.getMessage() for r in caplog.records)


def test_google_adk_reports_progress_to_its_callback(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    from dex_celery.testing.models.google_adk import ScriptedLlm, tool_call
    from tests.support.frameworks.google_adk import Desk, final_text

    start_worker()
    seen: list[CallProgress] = []
    model = ScriptedLlm(turns=[[tool_call(*READ, "call_long")], "Found it."])
    desk = Desk(dex, model, [READ[0]], "adk-long", progress=seen.append)
    assert final_text(desk.ask("Look it up.")) == "Found it."
    assert seen and {p.key for p in seen} == {"adk-long/turn-1/call_long"}
    assert all(p.timeout == 300.0 and p.tool == READ[0] for p in seen)
    assert model.tool_results()["call_long"] == '"found"'


def test_agent_framework_reports_progress_to_its_callback(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    from dex_celery.testing.models.agent_framework import ScriptedChatClient, tool_call
    from tests.support.frameworks.agent_framework import Desk

    start_worker()
    seen: list[CallProgress] = []
    client = ScriptedChatClient([[tool_call(*READ, "call_long")], "Found it."])
    desk = Desk(dex, client, [READ[0]], "maf-long", progress=seen.append)
    assert desk.ask("Look it up.").text == "Found it."
    assert seen and {p.key for p in seen} == {"maf-long/turn-1/call_long"}
    assert all(p.timeout == 300.0 and p.tool == READ[0] for p in seen)
    assert client.tool_results()["call_long"] == '"found"'
