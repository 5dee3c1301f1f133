"""Each CrewAI test starts from the CrewAI state of a new process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def crewai_state_of_its_own() -> Iterator[None]:
    """CrewAI keeps its runtime state and its execution context (event scopes, flow id) in the
    calling thread's context variables, and a crew restored from a checkpoint writes the
    checkpoint's context there (`Crew.from_checkpoint`). Left over, the next test's flow ran
    inside the restored crew's scopes and its agent's calls lost the flow's id. Restored after
    each test, as a new process would start."""
    from crewai.context import apply_execution_context, capture_execution_context
    from crewai.events.event_bus import crewai_event_bus

    before = capture_execution_context()
    yield
    apply_execution_context(before)
    crewai_event_bus.reset_runtime_state()
