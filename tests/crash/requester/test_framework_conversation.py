"""One conversation (S12.1) in each supported framework, after a real SIGKILL.

For Pydantic AI, LangGraph (`create_agent`), the OpenAI Agents SDK, Google ADK and the Microsoft
Agent Framework, driven by the scripted models of `dex_celery.testing.models`: a customer asks
for a refund; the
`non_idempotent_write` starts on a real prefork worker, which is SIGKILLed (main process and pool
children) mid-call, so the call ends `outcome_unknown` and the model reads that text. The reconcile beat job's pass
(`reconcile_once`, with an outcome check) sends the report to the session; the agent's next run
hands the model the report (asserted on what the scripted model was sent), the model answers
without calling the tool again, and the tool's own log shows one run. A second reconcile pass
sends nothing; a run resumed from the history saved before the report reaches the model once,
and one resumed from the history saved after it does not see it twice.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.processes import Worker
from dex_celery import (
    OUTCOME_UNKNOWN_TOOL_RESULT,
    AsyncDexClient,
    Dex,
    MessageRole,
)
from tests.support.apps import seed_example
from tests.support.faults.crash import lines
from tests.support.frameworks import checks
from tests.support.frameworks.checks import REPORT, killed_mid_call

pytestmark = pytest.mark.crash

TOOL = "slow_non_idempotent_write"
ARGUMENTS = {"seconds": 60, "value": {"order": 1002, "cents": 999}}
ASK = "Please refund 999 cents on order 1002."
FOLLOW_UP = "Did my refund go through?"


def _one_run(key: str) -> None:
    """The tool's own log: it started once, and never again."""
    assert len(lines(key, "start")) == 1


# --- Pydantic AI -------------------------------------------------------------------------------


def test_pydantic_ai_model_reads_the_reconciliation_report_once(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    from pydantic_ai import Agent

    from dex_celery.integrations.frameworks.pydantic_ai import DexTools
    from dex_celery.testing.models.pydantic_ai import ScriptedModel, tool_call

    dex.register_outcome_check(TOOL, checks.report_check)
    worker = start_worker()
    model = ScriptedModel(
        [
            [tool_call(TOOL, ARGUMENTS, "call_refund")],
            "I could not confirm the refund; I will not try it again until it is checked.",
            "Yes: the order system says the refund went through.",
        ]
    )
    agent = Agent(model, capabilities=[DexTools(dex, [TOOL])])
    key = "conv-refund/turn-1/call_refund"

    first = killed_mid_call(worker, key, lambda: agent.run_sync(ASK, conversation_id="conv-refund"))
    assert OUTCOME_UNKNOWN_TOOL_RESULT in str(model.tool_results()["call_refund"])
    checks.reconcile_reports(dex, key)

    second = agent.run_sync(FOLLOW_UP, message_history=first.all_messages())
    assert second.output.startswith("Yes")
    assert len(checks.reports(model.user_texts())) == 1  # the model read the report, once
    assert model.user_texts()[0] == ASK and FOLLOW_UP in model.user_texts()
    assert [c.key for c in dex.client().get_agent_snapshot("conv-refund").tool_calls] == [key]
    _one_run(key)

    # Resumed from the history saved after the report: not handed it again.
    agent.run_sync("Thanks.", message_history=second.all_messages())
    assert len(checks.reports(model.user_texts())) == 1
    # Resumed from the history saved before it (that run's history was lost): handed it once.
    agent.run_sync(FOLLOW_UP, message_history=first.all_messages())
    assert len(checks.reports(model.user_texts())) == 1
    _one_run(key)


def test_the_seeds_function_reports_a_pydantic_ai_session(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    """The seed's `report_unknown_outcomes`, verbatim but for its import, on a framework
    session: it finds the call, builds the key, sends the report; a rerun sends nothing."""
    from pydantic_ai import Agent

    from dex_celery.integrations.frameworks.pydantic_ai import DexTools
    from dex_celery.testing.models.pydantic_ai import ScriptedModel, tool_call

    worker = start_worker()
    model = ScriptedModel([[tool_call(TOOL, ARGUMENTS, "call_seed")], "Checking.", "Done."])
    agent = Agent(model, capabilities=[DexTools(dex, [TOOL])])
    key = "conv-seed/turn-1/call_seed"
    first = killed_mid_call(worker, key, lambda: agent.run_sync(ASK, conversation_id="conv-seed"))

    asked: list[tuple[str, str]] = []

    async def check(call_key: str, arguments_json: str) -> str:
        asked.append((call_key, arguments_json))
        return REPORT

    client = AsyncDexClient(dex)
    sent = asyncio.run(seed_example.report_unknown_outcomes(client, "conv-seed", check))
    assert sent == [f"{REPORT} (tool call {key})"]
    assert [k for k, _ in asked] == [key]
    assert asyncio.run(seed_example.report_unknown_outcomes(client, "conv-seed", check)) == []

    snapshot = dex.client().get_agent_snapshot("conv-seed")
    users = [m for m in snapshot.messages if m.role is MessageRole.USER]
    assert [m.text for m in users if m.mirrored] == [ASK]  # the framework's own request
    agent.run_sync(FOLLOW_UP, message_history=first.all_messages())
    assert checks.reports(model.user_texts()) == [f"{REPORT} (tool call {key})"]
    _one_run(key)


@pytest.fixture
def no_trace_export() -> Iterator[None]:
    from agents import set_trace_processors

    set_trace_processors([])
    yield


# --- LangGraph ---------------------------------------------------------------------------------


def test_langgraph_model_reads_the_reconciliation_report_once(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from dex_celery.integrations.frameworks.langgraph import DexConversation, dex_tools
    from dex_celery.testing.models.langchain import ScriptedChatModel, tool_call

    dex.register_outcome_check(TOOL, checks.report_check)
    worker = start_worker()
    model = ScriptedChatModel(
        turns=[
            tool_call(TOOL, ARGUMENTS, "call_refund"),
            AIMessage("I could not confirm the refund; I will not try it again until checked."),
            AIMessage("Yes: the order system says the refund went through."),
        ]
    )
    saver = InMemorySaver()
    agent = create_agent(
        model, dex_tools(dex, [TOOL]), middleware=[DexConversation(dex)], checkpointer=saver
    )
    config: Any = {"configurable": {"thread_id": "thread-refund"}}
    key = "thread-refund/turn-1/call_refund"

    killed_mid_call(worker, key, lambda: agent.invoke({"messages": [HumanMessage(ASK)]}, config))
    tool_outputs = model.tool_results()
    assert OUTCOME_UNKNOWN_TOOL_RESULT in tool_outputs["call_refund"]
    before_report = saver.get_tuple(config)
    assert before_report is not None
    checks.reconcile_reports(dex, key)

    state = agent.invoke({"messages": [HumanMessage(FOLLOW_UP)]}, config)
    assert str(state["messages"][-1].content).startswith("Yes")
    assert len(checks.reports(model.user_texts())) == 1
    assert model.user_texts()[0] == ASK and FOLLOW_UP in model.user_texts()
    assert [c.key for c in dex.client().get_agent_snapshot("thread-refund").tool_calls] == [key]
    # The checkpoint keeps the report: the next turn of the thread is not handed it again.
    agent.invoke({"messages": [HumanMessage("Thanks.")]}, config)
    assert len(checks.reports(model.user_texts())) == 1

    # Resumed from the checkpoint saved before the report (a lost turn): handed it once.
    forked: Any = {
        "configurable": {"thread_id": "thread-refund", **before_report.config["configurable"]}
    }
    agent.invoke({"messages": [HumanMessage(FOLLOW_UP)]}, forked)
    assert len(checks.reports(model.user_texts())) == 1
    _one_run(key)


# --- OpenAI Agents SDK -------------------------------------------------------------------------


def test_openai_agents_model_reads_the_reconciliation_report_once(
    dex: Dex,
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
    no_trace_export: None,
) -> None:
    from agents import Agent, Runner, SQLiteSession

    from dex_celery.integrations.frameworks.openai_agents import DexSession
    from dex_celery.testing.models.openai_agents import (
        ScriptedModel,
        assistant_message,
        function_call,
    )

    dex.register_outcome_check(TOOL, checks.report_check)
    worker = start_worker()
    model = ScriptedModel(
        [
            [function_call(TOOL, ARGUMENTS, call_id="call_refund")],
            [assistant_message("I could not confirm the refund; I will not try it again.")],
            [assistant_message("Yes: the order system says the refund went through.")],
            [assistant_message("You are welcome.")],
        ]
    )
    stored = SQLiteSession("sdk-refund")
    session = DexSession(dex, "sdk-refund", stored)
    agent = Agent(name="desk", model=model, tools=session.function_tools([TOOL]))
    key = "sdk-refund/turn-1/call_refund"

    killed_mid_call(worker, key, lambda: asyncio.run(Runner.run(agent, ASK, session=session)))
    assert OUTCOME_UNKNOWN_TOOL_RESULT in model.tool_results()["call_refund"]
    saved_before_report = asyncio.run(stored.get_items())
    checks.reconcile_reports(dex, key)

    result = asyncio.run(Runner.run(agent, FOLLOW_UP, session=session))
    assert str(result.final_output).startswith("Yes")
    assert len(checks.reports(model.user_texts())) == 1
    assert model.user_texts()[0] == ASK and model.user_texts()[-1] == FOLLOW_UP
    assert [c.key for c in dex.client().get_agent_snapshot("sdk-refund").tool_calls] == [key]
    # The stored history keeps the report: the next run is not handed it again.
    asyncio.run(Runner.run(agent, "Thanks.", session=session))
    assert len(checks.reports(model.user_texts())) == 1

    # A session restored from the items saved before the report (a lost run): handed it once.
    restored = SQLiteSession("sdk-refund-restored")
    asyncio.run(restored.add_items(saved_before_report))
    replay = ScriptedModel([[assistant_message("Yes, it went through.")]])
    again = DexSession(dex, "sdk-refund", restored)
    replayed = Agent(name="desk", model=replay, tools=again.function_tools([TOOL]))
    asyncio.run(Runner.run(replayed, FOLLOW_UP, session=again))
    assert len(checks.reports(replay.user_texts())) == 1
    _one_run(key)


# --- Google ADK --------------------------------------------------------------------------------


def test_google_adk_model_reads_the_reconciliation_report_once(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event, tmp_path: Path
) -> None:
    """In a session service that keeps events in a database (read back in timestamp order), the
    report is stored where the model read it: after the user's question, before the reply."""
    from google.adk.sessions import DatabaseSessionService

    from dex_celery.testing.models.google_adk import ScriptedLlm, tool_call
    from tests.support.frameworks.google_adk import Desk, final_text, texts

    dex.register_outcome_check(TOOL, checks.report_check)
    worker = start_worker()
    yes = "Yes: the order system says the refund went through."
    model = ScriptedLlm(
        turns=[
            [tool_call(TOOL, ARGUMENTS, "call_refund")],
            "I could not confirm the refund; I will not try it again until it is checked.",
            yes,
        ]
    )
    stored = DatabaseSessionService(f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}")
    desk = Desk(dex, model, [TOOL], "adk-refund", stored)
    key = "adk-refund/turn-1/call_refund"

    killed_mid_call(worker, key, lambda: desk.ask(ASK))
    assert OUTCOME_UNKNOWN_TOOL_RESULT in model.tool_results()["call_refund"]
    saved_before_report = desk.events()
    checks.reconcile_reports(dex, key)

    assert final_text(desk.ask(FOLLOW_UP)) == yes
    assert len(checks.reports(model.user_texts())) == 1
    assert model.user_texts()[0] == ASK and FOLLOW_UP in model.user_texts()
    assert [c.key for c in dex.client().get_agent_snapshot("adk-refund").tool_calls] == [key]
    saved = texts(desk.events())
    (report,) = checks.reports(saved)
    assert saved.index(FOLLOW_UP) < saved.index(report) < saved.index(yes)
    # The session's events keep the report: the next run is not handed it again, and its model
    # reads the conversation in the order it happened.
    desk.ask("Thanks.")
    assert len(checks.reports(model.user_texts())) == 1
    assert checks.reports(texts(desk.events())) == [report]
    read = ["".join(p.text or "" for p in c.parts or []) for c in model.seen[-1]]
    assert read.index(FOLLOW_UP) < read.index(report) < read.index(yes) < read.index("Thanks.")

    # A session restored from the events saved before the report (a lost run): handed it once.
    restored = Desk(dex, model, [TOOL], "adk-refund")
    restored.restore(saved_before_report)
    restored.ask(FOLLOW_UP)
    assert len(checks.reports(model.user_texts())) == 1
    _one_run(key)


# --- Microsoft Agent Framework -----------------------------------------------------------------


def test_agent_framework_model_reads_the_reconciliation_report_once(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    """The report goes into the next run's input: the model reads it after the user's new
    message, and the session's history stores it there, before the reply."""
    from dex_celery.testing.models.agent_framework import ScriptedChatClient, tool_call
    from tests.support.frameworks.agent_framework import Desk, texts

    dex.register_outcome_check(TOOL, checks.report_check)
    worker = start_worker()
    yes = "Yes: the order system says the refund went through."
    client = ScriptedChatClient(
        [
            [tool_call(TOOL, ARGUMENTS, "call_refund")],
            "I could not confirm the refund; I will not try it again until it is checked.",
            yes,
            "You are welcome.",
        ]
    )
    desk = Desk(dex, client, [TOOL], "maf-refund")
    key = "maf-refund/turn-1/call_refund"

    killed_mid_call(worker, key, lambda: desk.ask(ASK))
    assert OUTCOME_UNKNOWN_TOOL_RESULT in client.tool_results()["call_refund"]
    saved_before_report = desk.snapshot()
    checks.reconcile_reports(dex, key)

    assert desk.ask(FOLLOW_UP).text == yes
    assert len(checks.reports(client.user_texts())) == 1
    assert client.user_texts()[0] == ASK and FOLLOW_UP in client.user_texts()
    read = client.user_texts()
    (report,) = checks.reports(read)
    assert read.index(FOLLOW_UP) < read.index(report)
    assert [c.key for c in dex.client().get_agent_snapshot("maf-refund").tool_calls] == [key]
    stored = texts(desk.history())
    assert stored.index(FOLLOW_UP) < stored.index(report) < stored.index(yes)
    # The history keeps the report: the next run is not handed it again.
    desk.ask("Thanks.")
    assert len(checks.reports(client.user_texts())) == 1
    assert checks.reports(texts(desk.history())) == [report]

    # A session restored from the snapshot saved before the report (a lost run): handed it once.
    restored = Desk(dex, client, [TOOL], "maf-refund", snapshot=saved_before_report)
    restored.ask(FOLLOW_UP)
    assert len(checks.reports(client.user_texts())) == 1
    _one_run(key)
