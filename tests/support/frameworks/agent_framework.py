"""Running a Microsoft Agent Framework agent in the tests: an `Agent` with the `DexTools`
context provider on the scripted chat client, one `AgentSession` (kept in memory, or restored
from a saved `to_dict()` snapshot as a session store would), and the framework's own approval
answers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from agent_framework import Agent, AgentResponse, AgentSession, Content, Message

from dex_celery import Dex
from dex_celery.integrations.frameworks.agent_framework import SHOWN, DexTools, decision
from dex_celery.testing.models.agent_framework import ScriptedChatClient


class Desk:
    """One Agent Framework session of an agent whose tools are dex tools."""

    def __init__(
        self,
        dex: Dex,
        client: ScriptedChatClient,
        names: Sequence[str],
        session_id: str,
        snapshot: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        self.agent = Agent(client, context_providers=[DexTools(dex, names, **options)])
        self.session = (
            AgentSession.from_dict(snapshot)
            if snapshot is not None
            else self.agent.create_session(session_id=session_id)
        )

    def ask(self, text: str) -> AgentResponse:
        """A user message, run to the end of the run (or its approval requests)."""
        return asyncio.run(self.agent.run(text, session=self.session))

    def answer(self, *responses: Content) -> AgentResponse:
        """The framework's answers to approval requests, as the next run's input."""
        message = Message(role="user", contents=list(responses))
        return asyncio.run(self.agent.run(message, session=self.session))

    def snapshot(self) -> dict[str, Any]:
        """The session as a session store saves it."""
        return self.session.to_dict()

    def history(self) -> list[Message]:
        """The messages the default history provider stored, in order."""
        stored: list[Message] = self.session.state["in_memory"]["messages"]
        return list(stored)


def approvals(result: AgentResponse) -> dict[str, tuple[Content, dict[str, Any]]]:
    """`call id -> (approval request, what dex shows the person)` of a run's requests."""
    out = {}
    for request in result.user_input_requests:
        call = request.function_call
        if request.type == "function_approval_request" and call is not None and call.call_id:
            out[call.call_id] = (request, dict(request.additional_properties[SHOWN]))
    return out


def answer(
    request: Content, approved: bool, *, decided_by: str | None = None, reason: str | None = None
) -> Content:
    return decision(request, approved, decided_by=decided_by, reason=reason)


def texts(messages: Sequence[Message]) -> list[str]:
    """The texts of messages, in order."""
    return [m.text for m in messages if m.text]
