"""Approvals in context (S12.1): the person deciding a framework's call sees what was asked.

In each supported framework, driven by its scripted model, a customer's message (which holds the
card number the tool then takes as a secret argument) leads to a `refund` that waits for
approval. The web approvals page, `calls show` (text and `--json`), the snapshot and the webhook
body all show the customer's request and what the model said, with the card number redacted.
No worker is needed: nothing runs while the call waits.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from dex_celery import CallStatus, Dex, EffectClass, Settings, ToolContext, ToolPolicy
from dex_celery.cli.main import main
from dex_celery.model.records import MessageRole
from dex_celery.web.app import WebApp
from dex_celery.web.auth import Credentials
from tests.support.web.webhook_receiver import approval_webhook

CARD = "4111-1111-1111-1111"
ASK = f"Please refund order 1002 to my card {CARD}, it arrived broken."
SAID = "I will refund order 1002 to your card."
ARGUMENTS = {"order": "1002", "card": CARD}


@pytest.fixture
def refund(dex: Dex) -> Dex:
    def refund(ctx: ToolContext, order: str, card: str) -> Any:
        return "refunded"

    dex.tool(
        "refund",
        policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, secret_arguments=("card",)),
    )(refund)
    return dex


def _pydantic_ai(dex: Dex) -> str:
    from pydantic_ai import Agent, DeferredToolRequests
    from pydantic_ai.messages import TextPart

    from dex_celery.integrations.frameworks.pydantic_ai import DexTools
    from dex_celery.testing.models.pydantic_ai import ScriptedModel, tool_call

    model = ScriptedModel([[TextPart(SAID), tool_call("refund", ARGUMENTS, "call_1")], "Done."])
    agent = Agent(model, capabilities=[DexTools(dex, ["refund"])],
                  output_type=[str, DeferredToolRequests])  # fmt: skip
    result = agent.run_sync(ASK, conversation_id="pai-ctx")
    assert isinstance(result.output, DeferredToolRequests)
    return "pai-ctx/turn-1/call_1"


def _langgraph(dex: Dex) -> str:
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from dex_celery.integrations.frameworks.langgraph import DexConversation, dex_tools
    from dex_celery.testing.models.langchain import ScriptedChatModel

    call = AIMessage(SAID, tool_calls=[{"name": "refund", "args": ARGUMENTS, "id": "call_1"}])
    model = ScriptedChatModel(turns=[call, AIMessage("Done.")])
    agent = create_agent(model, dex_tools(dex, ["refund"]), middleware=[DexConversation(dex)],
                         checkpointer=InMemorySaver())  # fmt: skip
    state = agent.invoke(
        {"messages": [HumanMessage(ASK)]}, {"configurable": {"thread_id": "lg-ctx"}}
    )
    assert "__interrupt__" in state
    return "lg-ctx/turn-1/call_1"


def _openai_agents(dex: Dex) -> str:
    from agents import Agent, Runner, set_trace_processors

    from dex_celery.integrations.frameworks.openai_agents import DexSession
    from dex_celery.testing.models.openai_agents import (
        ScriptedModel,
        assistant_message,
        function_call,
    )

    set_trace_processors([])
    model = ScriptedModel(
        [[assistant_message(SAID), function_call("refund", ARGUMENTS, call_id="call_1")]]
    )
    session = DexSession(dex, "sdk-ctx")
    agent = Agent(name="desk", model=model, tools=session.function_tools(["refund"]))
    result = asyncio.run(Runner.run(agent, ASK, session=session))
    assert result.interruptions
    return "sdk-ctx/turn-1/call_1"


def _google_adk(dex: Dex) -> str:
    from dex_celery.testing.models.google_adk import ScriptedLlm, text, tool_call
    from tests.support.frameworks.google_adk import Desk, confirmations

    model = ScriptedLlm(turns=[[text(SAID), tool_call("refund", ARGUMENTS, "call_1")], "Done."])
    asked = confirmations(Desk(dex, model, ["refund"], "adk-ctx").ask(ASK))
    assert asked["call_1"][1]["arguments"]["card"] == "***"
    return "adk-ctx/turn-1/call_1"


def _agent_framework(dex: Dex) -> str:
    from dex_celery.testing.models.agent_framework import ScriptedChatClient, text, tool_call
    from tests.support.frameworks.agent_framework import Desk, approvals

    client = ScriptedChatClient([[text(SAID), tool_call("refund", ARGUMENTS, "call_1")], "Done."])
    asked = approvals(Desk(dex, client, ["refund"], "maf-ctx").ask(ASK))
    assert asked["call_1"][1]["arguments"]["card"] == "***"
    return "maf-ctx/turn-1/call_1"


FRAMEWORKS: dict[str, Callable[[Dex], str]] = {
    "pydantic_ai": _pydantic_ai,
    "langgraph": _langgraph,
    "openai_agents": _openai_agents,
    "google_adk": _google_adk,
    "agent_framework": _agent_framework,
}


@pytest.fixture(params=sorted(FRAMEWORKS))
def waiting_call(request: pytest.FixtureRequest, refund: Dex) -> Iterator[str]:
    key = FRAMEWORKS[request.param](refund)
    assert refund.client().get_call(key).status is CallStatus.AWAITING_APPROVAL
    yield key


def test_the_person_deciding_sees_the_request_that_led_to_the_call(
    refund: Dex, waiting_call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import devtools.toolapp as toolapp

    dex, key = refund, waiting_call
    monkeypatch.setattr(toolapp, "dex", dex)
    shown_ask = ASK.replace(CARD, "***")
    session = key.split("/", 1)[0]

    snapshot = dex.client().get_agent_snapshot(session)
    user = [m for m in snapshot.messages if m.role is MessageRole.USER]
    assert [m.text for m in user] == [shown_ask] and user[0].mirrored

    credentials = Credentials.from_settings(Settings(web_users="alice:pw-a"))
    web = TestClient(WebApp(dex, credentials).build(), base_url="http://localhost",
                     follow_redirects=False)  # fmt: skip
    assert (
        web.post("/login", data={"name": "alice", "password": "pw-a", "next": "/"}).status_code
        == 303
    )
    page = web.get("/approvals").text
    assert "No user or assistant message before this call" not in page
    assert "refund order 1002 to my card ***" in page
    assert CARD not in page and CARD not in web.get(f"/calls/{key}").text

    runner = CliRunner()
    text = runner.invoke(main, ["--app", "devtools.toolapp:dex", "calls", "show", key])
    assert text.exit_code == 0, text.output
    assert shown_ask in text.output and CARD not in text.output
    shown = runner.invoke(main, ["--app", "devtools.toolapp:dex", "calls", "show", key,
                                 "--json"])  # fmt: skip
    conversation = json.loads(shown.output)["conversation"]
    assert [m["role"] for m in conversation][:1] == ["user"]
    assert conversation[0]["text"] == shown_ask
    if not key.startswith("sdk-"):  # the SDK saves the model's text after the turn ends
        assert [m["text"] for m in conversation if m["role"] == "assistant"] == [SAID]

    body = approval_webhook(dex)
    assert body["conversation"][0]["text"] == shown_ask
    assert CARD not in json.dumps(body)
