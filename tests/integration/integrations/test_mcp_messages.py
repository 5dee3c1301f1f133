"""The prompt `dex-celery/session-messages` (docs/mcp.md, "Messages for the agent"), asked with
the `mcp` SDK's client of a real `dex-celery mcp --transport http` with tokens: it hands the
session's messages written through dex that the given history does not hold, oldest first, each
once however often asked (read from the history, S12.1); only to the session's owner; a session
in another caller's namespace and a history that is not a JSON array of texts are refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from devtools.processes import Worker
from dex_celery import Dex
from dex_celery.integrations.mcp.messages import MESSAGE_IDS_META_KEY, PROMPT_NAME
from tests.support.mcp.ts_agents import TOKEN, mcp_http, session_of


async def ask(url: str, token: str, **arguments: str) -> Any:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(url, http_client=http)) as mcp:
        listed = await mcp.list_prompts()
        assert [p.name for p in listed.prompts] == [PROMPT_NAME]
        try:
            return await mcp.get_prompt(PROMPT_NAME, arguments)
        except MCPError as e:  # the JSON-RPC error, as the caller reads it
            return e


def texts(result: Any) -> list[str]:
    return [m.content.text for m in result.messages]


def test_the_session_messages_reach_the_owner_once_per_history(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    with mcp_http(env, "desk") as url:
        assert texts(anyio.run(lambda: ask(url, TOKEN))) == []  # no session yet: nothing
        # The agent's first call begins its session (`--session` in its namespace).
        anyio.run(_call_echo, url)
        client = dex.client()
        client.send_user_message(session_of("desk"), "report one")
        client.send_user_message(session_of("desk"), "report two")
        client.send_user_message(session_of("desk"), "report one")
        got = anyio.run(lambda: ask(url, TOKEN))
        assert texts(got) == ["report one", "report two", "report one"]
        assert len(got.meta[MESSAGE_IDS_META_KEY]) == 3
        held = json.dumps(["hi", "report one", "report two"])
        assert texts(anyio.run(lambda: ask(url, TOKEN, history=held))) == ["report one"]
        held = json.dumps(["report one", "report two", "report one"])
        assert texts(anyio.run(lambda: ask(url, TOKEN, history=held))) == []
        # Named explicitly, in the caller's namespace: the same session.
        named = anyio.run(lambda: ask(url, TOKEN, session="desk"))
        assert texts(named) == ["report one", "report two", "report one"]
        # Another caller: its own namespace's `desk`, which holds nothing of the agent's.
        assert texts(anyio.run(lambda: ask(url, "rival-tok", session="desk"))) == []
        refused = anyio.run(lambda: ask(url, "rival-tok", session=session_of("desk")))
        assert isinstance(refused, MCPError) and "not one of yours" in str(refused)
        bad = anyio.run(lambda: ask(url, TOKEN, history='{"not": "a list"}'))
        assert isinstance(bad, MCPError) and "JSON array" in str(bad)


async def _call_echo(url: str) -> None:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
    async with http, Client(streamable_http_client(url, http_client=http)) as mcp:
        result = await mcp.call_tool("echo", {"x": 1})
        assert not result.is_error
