"""Running a CrewAI crew in the tests: one agent whose tools are dex tools, one task, the
scripted `ScriptedLLM`, offline (CrewAI's telemetry and tracing off before it is imported)."""

from __future__ import annotations

import os

for _name, _value in (
    ("CREWAI_DISABLE_TELEMETRY", "true"),
    ("CREWAI_DISABLE_TRACKING", "true"),
    ("CREWAI_TRACING_ENABLED", "false"),
    ("OTEL_SDK_DISABLED", "true"),
):
    os.environ.setdefault(_name, _value)

from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.events.event_bus import crewai_event_bus  # noqa: E402
from crewai.flow.flow import Flow, start  # noqa: E402
from crewai.flow.persistence import SQLiteFlowPersistence, persist  # noqa: E402
from crewai.state.checkpoint_config import CheckpointConfig  # noqa: E402

from devtools.processes import wait_for  # noqa: E402
from dex_celery import Dex  # noqa: E402
from dex_celery.errors import UnknownSession  # noqa: E402
from dex_celery.integrations.frameworks.crewai import dex_crewai_tools  # noqa: E402
from dex_celery.testing.models.crewai import ScriptedLLM  # noqa: E402


def crew(dex: Dex, model: ScriptedLLM, names: Sequence[str], ask: str, **options: Any) -> Crew:
    """A crew of one agent with the named dex tools and one task asking `ask`."""
    agent = Agent(
        role="order desk",
        goal="answer the customer",
        backstory="You run the order desk's tools.",
        llm=model,
        tools=dex_crewai_tools(dex, names, **options),
        max_iter=8,
    )
    task = Task(description=ask, expected_output="a short answer", agent=agent)
    return Crew(agents=[agent], tasks=[task])


def session(team: Crew) -> str:
    """The dex session of the crew's only task (`<crew id>.<task id>`)."""
    return f"{team.id}.{team.tasks[0].id}"


def key_of(dex: Dex, session_id: str, tool: str, call_id: str, timeout: float = 60) -> str:
    """The key of the session's latest call of `tool` with the model's `call_id`, once one is
    recorded (its turn id names the kickoff that made it, so only the run knows it beforehand)."""

    def recorded() -> str | None:
        try:
            calls = dex.client().get_agent_snapshot(session_id).tool_calls
        except UnknownSession:
            return None
        keys = [c.key for c in calls if (c.tool_name, c.tool_call_id) == (tool, call_id)]
        return keys[-1] if keys else None

    wait_for(lambda: recorded() is not None, timeout=timeout, what=f"a record of {call_id}")
    key = recorded()
    assert key is not None
    return key


def checkpointed(team: Crew, folder: Path) -> Crew:
    """`team`, checkpointed under `folder` (CrewAI's JSON files) once its task has started: when
    each agent's model is first asked, before it answers.

    The checkpoint is written by CrewAI's own `RuntimeState.checkpoint`, on the crew's thread,
    after the event bus has run every handler of what came before. CrewAI's `on_events`
    checkpoints are written from the bus's thread pool while the crew goes on; their serializer
    read the crew's event record as the crew added to it, and on a loaded machine it failed
    ("dictionary changed size during iteration", raised past CrewAI's own handler) and left no
    checkpoint. Here nothing adds to the record while it is written: the crew waits in its
    model, and the bus is idle."""
    for agent in team.agents:
        _checkpoints_before_its_first_answer(agent.llm, folder)
    return team


def _checkpoints_before_its_first_answer(model: Any, folder: Path) -> None:
    call = model.call
    written: list[str] = []

    def checkpointing_call(*args: Any, **kwargs: Any) -> Any:
        if not written:
            assert crewai_event_bus.flush(timeout=60), "CrewAI's event handlers did not finish"
            state = crewai_event_bus.runtime_state
            assert state is not None, "CrewAI attached no runtime state to the running crew"
            written.append(state.checkpoint(str(folder)))
        return call(*args, **kwargs)

    object.__setattr__(model, "call", checkpointing_call)  # the model is a pydantic model


def resumed(
    dex: Dex, folder: Path, model: ScriptedLLM, names: Sequence[str], **options: Any
) -> Crew:
    """The crew restored from its last checkpoint under `folder`, as a new process would: CrewAI
    keeps the crew's and the task's ids, not the model or the tools, which are attached again."""
    (path,) = sorted(p for p in folder.rglob("*.json"))[-1:]
    team = Crew.from_checkpoint(CheckpointConfig(restore_from=str(path)))
    tools = dex_crewai_tools(dex, names, **options)
    for agent in team.agents:
        agent.llm = model
        agent.tools = tools
    for task in team.tasks:
        task.tools = tools
    return team


def desk_flow(agent: Agent, ask: str, db_path: Path) -> Flow[Any]:
    """A flow, persisted to SQLite at `db_path`, whose one step runs `agent` on its own
    (`Agent.kickoff`): its dex calls belong to the flow's id."""

    @persist(SQLiteFlowPersistence(db_path=str(db_path)))
    class Desk(Flow[dict[str, Any]]):
        @start()
        def answer(self) -> str:
            return str(agent.kickoff(ask).raw)

    return Desk()
