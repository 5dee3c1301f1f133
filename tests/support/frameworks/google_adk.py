"""Running a Google ADK agent in the tests: a resumable `App` with dex tools and the
`DexConversation` plugin, one session (in memory, or in ADK's `DatabaseSessionService`, which
reads events back in timestamp order), and ADK's own confirmation answer."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Sequence
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.apps import App, ResumabilityConfig
from google.adk.events.event import Event
from google.adk.runners import Runner
from google.adk.sessions import BaseSessionService, InMemorySessionService
from google.genai import types

from dex_celery import Dex
from dex_celery.integrations.frameworks.google_adk import (
    CONFIRMATION_CALL,
    DexConversation,
    dex_adk_tools,
)
from dex_celery.testing.models.google_adk import ScriptedLlm

APP = "desk"
USER = "customer"


class Desk:
    """One ADK session of an agent whose tools are dex tools."""

    def __init__(
        self,
        dex: Dex,
        model: ScriptedLlm,
        names: Sequence[str],
        session_id: str,
        sessions: BaseSessionService | None = None,
        **options: Any,
    ) -> None:
        agent = LlmAgent(name="desk", model=model, tools=list(dex_adk_tools(dex, names, **options)))
        with warnings.catch_warnings():  # ADK marks resumability experimental; it is ours
            warnings.simplefilter("ignore", UserWarning)
            resumable = ResumabilityConfig(is_resumable=True)
        app = App(
            name=APP,
            root_agent=agent,
            plugins=[DexConversation(dex)],
            resumability_config=resumable,
        )
        self.sessions = sessions or InMemorySessionService()
        self.runner = Runner(app=app, session_service=self.sessions)
        self.session_id = session_id

    async def _run(self, message: types.Content | None, invocation_id: str | None) -> list[Event]:
        session = await self.sessions.get_session(
            app_name=APP, user_id=USER, session_id=self.session_id
        )
        if session is None:
            await self.sessions.create_session(
                app_name=APP, user_id=USER, session_id=self.session_id
            )
        return [
            event
            async for event in self.runner.run_async(
                user_id=USER,
                session_id=self.session_id,
                new_message=message,
                invocation_id=invocation_id,
            )
        ]

    def ask(self, text: str) -> list[Event]:
        """A user message, run to the end of the invocation (or its pause)."""
        return asyncio.run(
            self._run(types.Content(role="user", parts=[types.Part(text=text)]), None)
        )

    def resume(self, invocation_id: str) -> list[Event]:
        """Resume an invocation from the session's saved events."""
        return asyncio.run(self._run(None, invocation_id))

    def answer(self, confirmation_id: str, confirmed: bool, **payload: Any) -> list[Event]:
        """ADK's own answer to a confirmation request."""
        response = types.FunctionResponse(
            name=CONFIRMATION_CALL,
            id=confirmation_id,
            response={"confirmed": confirmed, "payload": payload},
        )
        message = types.Content(role="user", parts=[types.Part(function_response=response)])
        return asyncio.run(self._run(message, None))

    def restore(self, events: Sequence[Event]) -> None:
        """A new session holding `events`, as a session service would have saved them."""

        async def restore() -> None:
            session = await self.sessions.create_session(
                app_name=APP, user_id=USER, session_id=self.session_id
            )
            for event in events:
                await self.sessions.append_event(session, event.model_copy())

        asyncio.run(restore())

    def events(self) -> list[Event]:
        session = asyncio.run(
            self.sessions.get_session(app_name=APP, user_id=USER, session_id=self.session_id)
        )
        assert session is not None
        return list(session.events)


def confirmations(events: Sequence[Event]) -> dict[str, tuple[str, dict[str, Any]]]:
    """`original call id -> (confirmation call id, payload)` of ADK's confirmation requests."""
    out = {}
    for event in events:
        for call in event.get_function_calls():
            if call.name == CONFIRMATION_CALL and call.id and call.args:
                original = call.args["originalFunctionCall"]
                payload = call.args["toolConfirmation"]["payload"]
                out[original["id"]] = (call.id, payload)
    return out


def texts(events: Sequence[Event]) -> list[str]:
    """The texts of a session's events, in the order the session service gives them."""
    return [
        "".join(p.text or "" for p in e.content.parts or [])
        for e in events
        if e.content is not None and any(p.text for p in e.content.parts or [])
    ]


def final_text(events: Sequence[Event]) -> str:
    """The model's last text of a run."""
    texts = [
        "".join(p.text or "" for p in e.content.parts or [])
        for e in events
        if e.content is not None and e.content.role == "model"
    ]
    return next((t for t in reversed(texts) if t), "")
