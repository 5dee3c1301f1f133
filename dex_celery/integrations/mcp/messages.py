"""The session's messages for an MCP client's agent: the prompt `dex-celery/session-messages`.

An agent that calls dex tools over MCP (a TypeScript agent of the Vercel AI SDK or Mastra,
docs/frameworks.md) keeps its conversation on the client side, where the server cannot see it.
A user message sent to its dex session (`send_user_message`, the reconcile beat job's reports
first of all, docs/reconcile.md) must still reach the model at the agent's next turn, exactly
once (S12.1). An MCP prompt is the protocol's way to hand a client messages meant for the
model's input, and every client library gets one with one call, so the agent asks for this
prompt before each model request and appends what it gets to its history.

Exactly once is read from the history itself, as for the Python frameworks
(`model/conversation.undelivered`): the client passes the user message texts its history holds
(argument `history`, a JSON array of strings) and gets the session's messages written through
dex that the history does not hold yet, oldest first. Nothing is marked "sent" on the server: a
turn that crashed before its history was saved is handed the message again, and a history that
holds it is never handed it twice.

Which session: the argument `session`, read in the caller's namespace as `tools/call` reads a
session id (`mcp/namespace`); without it, the session of calls without ids (`--session`). Only
the identity owning the session (`store/owners.py`) is handed its messages; any other session
answers as a session with no messages does, so the prompt tells nobody whether another's
session exists, and reading begins no session. A session in another principal's namespace is
refused, as for a call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

import mcp_types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from dex_celery.access import Identity
from dex_celery.errors import DexError
from dex_celery.integrations.conversation import Conversation
from dex_celery.integrations.mcp.namespace import scoped_session
from dex_celery.model.records import Message
from dex_celery.store.owners import SessionOwners

#: The prompt's name, and its arguments.
PROMPT_NAME = "dex-celery/session-messages"
SESSION_ARGUMENT = "session"
HISTORY_ARGUMENT = "history"
#: `_meta` key of the prompt's result: the dex message ids handed, in the messages' order.
MESSAGE_IDS_META_KEY = "dex-celery/message-ids"

PROMPT = mcp_types.Prompt(
    name=PROMPT_NAME,
    title="Messages for the model from the dex session",
    description=(
        "User messages sent to the dex session (reconcile reports first of all) that the "
        "agent's history does not hold yet, oldest first. Ask before each model request and "
        "append them to the history the model reads."
    ),
    arguments=[
        mcp_types.PromptArgument(
            name=HISTORY_ARGUMENT,
            description="JSON array of the user message texts the agent's history holds",
            required=False,
        ),
        mcp_types.PromptArgument(
            name=SESSION_ARGUMENT,
            description="the dex session id (default: the session of calls without ids)",
            required=False,
        ),
    ],
)


def held_texts(history: str | None) -> list[str]:
    """The user texts of the `history` argument; `MCPError` (invalid params) if it is not a
    JSON array of strings."""
    if history is None or history == "":
        return []
    try:
        texts = json.loads(history)
    except ValueError:
        texts = None
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise MCPError(
            code=mcp_types.INVALID_PARAMS,
            message=f"{HISTORY_ARGUMENT!r} must be a JSON array of the history's user texts",
        )
    return texts


def prompt_result(session_id: str, handed: Sequence[Message]) -> mcp_types.GetPromptResult:
    """The messages as the prompt's user messages, their dex ids in `_meta`."""
    return mcp_types.GetPromptResult(
        description=f"{len(handed)} message(s) of dex session {session_id!r} for the model",
        messages=[
            mcp_types.PromptMessage(
                role="user", content=mcp_types.TextContent(type="text", text=m.text or "")
            )
            for m in handed
        ],
        _meta={MESSAGE_IDS_META_KEY: [m.id for m in handed]},
    )


class SessionMessages:
    """`prompts/list` and `prompts/get` of `dex-celery mcp`."""

    def __init__(
        self,
        conversation: Conversation,
        owners: SessionOwners,
        *,
        identity_of: Callable[[ServerRequestContext[Any]], Identity],
        default_session: Callable[[Identity], str],
    ) -> None:
        self.conversation = conversation
        self.owners = owners
        self.identity_of = identity_of
        self.default_session = default_session

    async def list(
        self, ctx: ServerRequestContext[Any], params: mcp_types.PaginatedRequestParams | None
    ) -> mcp_types.ListPromptsResult:
        return mcp_types.ListPromptsResult(prompts=[PROMPT])

    async def get(
        self, ctx: ServerRequestContext[Any], params: mcp_types.GetPromptRequestParams
    ) -> mcp_types.GetPromptResult:
        if params.name != PROMPT_NAME:
            raise MCPError(code=mcp_types.INVALID_PARAMS, message=f"no prompt {params.name!r}")
        arguments = params.arguments or {}
        held = held_texts(arguments.get(HISTORY_ARGUMENT))
        identity = self.identity_of(ctx)
        asked = arguments.get(SESSION_ARGUMENT)
        try:
            session = scoped_session(identity, asked) if asked else self.default_session(identity)
        except DexError as e:
            raise MCPError(code=mcp_types.INVALID_PARAMS, message=str(e)) from None
        if session is None:
            raise MCPError(
                code=mcp_types.INVALID_PARAMS,
                message=f"the session {asked!r} is not one of yours",
            )
        try:
            owner = await asyncio.to_thread(self.owners.owner, session)
            handed = (
                await self.conversation.aundelivered(session, held)
                if owner == identity.name
                else []
            )
        except DexError as e:  # the database does not answer: say so, never "no messages"
            raise MCPError(code=mcp_types.INTERNAL_ERROR, message=f"error: {e}") from None
        return prompt_result(session, handed)
