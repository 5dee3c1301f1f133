"""Issue 19, finding 2: `dex-celery mcp --transport http` as a network door. The SDK's own MCP
client, run in a network namespace this test makes (so it calls from 10.213.x.2, not loopback),
against the real server bound to the host's veth address, with a real worker running the tools.

- without credentials the server refuses to listen beyond loopback;
- with them, an anonymous caller, a token without `tools:call`, a forged `Host` and a foreign
  `Origin` are refused before anything is recorded;
- a call key is not a capability: another identity sending the key and arguments of a call it
  did not make gets a refusal, not the call's result, and nothing runs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from devtools.processes import ROOT, Worker, free_port, wait_for
from dex_celery import CallStatus, Dex
from dex_celery.access import Identity
from dex_celery.integrations.mcp.namespace import namespace_of
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY
from tests.support.faults.crash import lines
from tests.support.faults.netns import namespace

DEX_CELERY = str(ROOT / ".venv" / "bin" / "dex-celery")
APP = ["--app", "devtools.toolapp:dex", "mcp", "--transport", "http"]
WRITE = "slow_non_idempotent_write"  # a non-idempotent write that needs no approval
TOKENS = "agent:agent-tok:tools:call,rival:rival-tok:tools:call,prom:prom-tok"


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


@contextmanager
def mcp_server(env: dict[str, str], host: str, **extra: str) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [DEX_CELERY, *APP, "--host", host, "--port", str(port), "--session", "door"],
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT), **extra},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: _listening(host, port) or process.poll() is not None,
            timeout=30,
            what="dex-celery mcp to listen",
        )
        assert process.poll() is None, process.communicate()[1]
        yield f"http://{host}:{port}/mcp"
    finally:
        process.kill()
        process.wait(timeout=10)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_mcp_http_from_another_address_is_a_locked_door(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    with namespace() as ns:
        # No credentials: refuses the veth address, with one error line (it used to listen on
        # any address without a word).
        open_bind = subprocess.run(
            [DEX_CELERY, *APP, "--host", ns.host_ip, "--port", str(free_port())],
            cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert open_bind.returncode != 0
        assert open_bind.stderr.startswith("error: refusing to serve the MCP server on")
        assert len(open_bind.stderr.splitlines()) == 1

        start_worker()
        # The bind address (one IP) is answered as a Host without DEX_ALLOWED_HOSTS.
        with mcp_server(env, ns.host_ip, DEX_WEB_TOKENS=TOKENS, DEX_WEB_USERS="alice:pw-a") as url:
            port = url.rsplit(":", 1)[1].split("/")[0]
            own, anon = "own/t1/c1", "anon/t1/c1"
            # What the agent's key becomes in its namespace (the key its answers give back).
            owned = f"{namespace_of(Identity('agent', via='token'))}:{own}"
            write = {"seconds": 0.1, "value": "mine"}
            steps: list[dict[str, Any]] = [
                # 0: anonymous, 1: a read-only token, 2: a forged Host, 3: a foreign Origin
                {"url": url, "tool": WRITE, "arguments": write, "meta": {IDEMPOTENCY_META_KEY: anon}},
                {"url": url, "headers": bearer("prom-tok"), "tool": WRITE, "arguments": write,
                 "meta": {IDEMPOTENCY_META_KEY: anon}},
                {"url": url, "headers": {**bearer("agent-tok"), "Host": f"rebind.attacker.example:{port}"},
                 "tool": WRITE, "arguments": write, "meta": {IDEMPOTENCY_META_KEY: anon}},
                {"url": url, "headers": {**bearer("agent-tok"), "Origin": "http://evil.example"},
                 "tool": WRITE, "arguments": write, "meta": {IDEMPOTENCY_META_KEY: anon}},
                # 4: the owner's write runs; 5: a rival with its key and arguments is refused
                {"url": url, "headers": bearer("agent-tok"), "tool": WRITE, "arguments": write,
                 "meta": {IDEMPOTENCY_META_KEY: own}},
                {"url": url, "headers": bearer("rival-tok"), "tool": WRITE, "arguments": write,
                 "meta": {IDEMPOTENCY_META_KEY: owned}},
                # 6: the rival by the three ids; 7: the owner follows its call again
                {"url": url, "headers": bearer("rival-tok"), "tool": WRITE, "arguments": write,
                 "meta": {"dex-celery/session-id": owned.split("/")[0], "dex-celery/turn-id": "t1",
                          "dex-celery/tool-call-id": "c1"}},
                {"url": url, "headers": bearer("agent-tok"), "tool": WRITE, "arguments": write,
                 "meta": {IDEMPOTENCY_META_KEY: own}},
                # 8: the rival without ids: a call in a session of its own; 9: a person (Basic)
                {"url": url, "headers": bearer("rival-tok"), "tool": WRITE,
                 "arguments": {"seconds": 0.1, "value": "rival"}},
                {"url": url, "headers": {"Authorization": "Basic YWxpY2U6cHctYQ=="}},
            ]  # fmt: skip
            out = ns.run([sys.executable, "-m", "tests.support.mcp.door_client", json.dumps(steps)],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    seen = [json.loads(line) for line in out.splitlines()]
    assert len(seen) == len(steps), out
    for refused in seen[:4]:
        assert refused["ok"] is False, refused
    assert "401" in seen[0]["error"] or "auth" in seen[0]["error"].lower(), seen[0]
    client = dex.client()
    with pytest.raises(LookupError):
        client.get_call(anon)  # none of the refused callers recorded anything

    mine = seen[4]
    assert mine["ok"] and not mine["is_error"] and mine["text"] == '"mine"', mine
    assert mine["meta"][IDEMPOTENCY_META_KEY] == owned
    for rival in (seen[5], seen[6]):
        assert rival["ok"] and rival["is_error"], rival
        assert "not one of yours" in rival["text"] and "mine" not in rival["text"], rival
    assert seen[7]["text"] == '"mine"'
    assert len(lines(owned, "start")) == 1  # the write ran once, for its owner only
    assert client.get_call(owned).status is CallStatus.SUCCEEDED

    theirs = seen[8]
    assert theirs["ok"] and theirs["text"] == '"rival"', theirs
    key = theirs["meta"][IDEMPOTENCY_META_KEY]
    assert key.startswith(f"{namespace_of(Identity('rival', via='token'))}:door/"), key
    assert WRITE in seen[9]["tools"]


def test_mcp_loopback_refuses_foreign_hosts_and_others_sessions(
    dex: Dex, env: dict[str, str]
) -> None:
    """On loopback without credentials (everyone is the OS user): a forged `Host` is refused
    (the SDK only checked it for some binds, and never with `--host localhost` spelled
    otherwise), and a session begun in-process is nobody's over MCP. With credentials, two
    callers sending the same tool and arguments without ids never share a call."""
    inproc = dex.client().request_call("inproc", "t1", "c1", "guarded_write", {"value": 1}).key

    async def call(url: str, headers: dict[str, str], tool: str, args: dict[str, Any],
                   meta: dict[str, Any] | None = None) -> Any:  # fmt: skip
        http = create_mcp_http_client(headers=headers)
        async with http, Client(streamable_http_client(url, http_client=http)) as mcp:
            return await mcp.call_tool(tool, args, meta=meta)

    def text(result: Any) -> str:
        return "\n".join(block.text for block in result.content)

    with mcp_server(env, "127.0.0.1") as url:
        port = url.rsplit(":", 1)[1].split("/")[0]
        with pytest.raises(BaseException) as refused:  # the SDK wraps it in groups
            anyio.run(call, url, {"Host": f"rebind.attacker.example:{port}"}, "echo", {"x": 1})
        assert "MCPError" in repr(refused.value) or "421" in repr(refused.value)
        # What the SDK client saw, over plain HTTP: 421 before any MCP handling.
        raw = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                         headers={"Host": f"rebind.attacker.example:{port}",
                                  "Accept": "application/json, text/event-stream"})  # fmt: skip
        assert raw.status_code == 421, raw.text
        answer = anyio.run(call, url, {}, "guarded_write", {"value": 1},
                           {IDEMPOTENCY_META_KEY: inproc})  # fmt: skip
        assert answer.is_error and "not one of yours" in text(answer)

    with mcp_server(env, "127.0.0.1", DEX_WEB_TOKENS=TOKENS) as url:
        first = anyio.run(call, url, bearer("agent-tok"), "guarded_write", {"value": "same"})
        second = anyio.run(call, url, bearer("rival-tok"), "guarded_write", {"value": "same"})
        keys = first.meta[IDEMPOTENCY_META_KEY], second.meta[IDEMPOTENCY_META_KEY]
        assert keys[0] != keys[1]
        assert keys[0].startswith(f"{namespace_of(Identity('agent', via='token'))}:door/")
        assert keys[1].startswith(f"{namespace_of(Identity('rival', via='token'))}:door/")
        assert first.meta["dex-celery/status"] == "awaiting_approval"
        # Guessing tokens is throttled like guessing passwords: 5 wrong, then 429.
        listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        accept = {"Accept": "application/json, text/event-stream"}
        codes = [
            httpx.post(url, json=listing, headers={**accept, **bearer(f"guess-{i}")}).status_code
            for i in range(12)
        ]
        assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}, codes
    assert dex.client().get_call(inproc).status is CallStatus.AWAITING_APPROVAL


def test_no_caller_can_take_another_callers_session(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """Sessions are namespaced by the authenticated principal (docs/security.md): a caller that
    names, before its owner does, the session another caller's calls without ids go to (it was
    `<--session>.<name>`, easy to guess) used to own it, and every later call of the victim
    without ids was refused. Now the rival's names land in its own namespace, the victim's calls
    keep working, and naming a session in the victim's namespace is refused, recording nothing."""

    async def call(url: str, token: str, args: dict[str, Any],
                   meta: dict[str, Any] | None = None) -> Any:  # fmt: skip
        http = create_mcp_http_client(headers=bearer(token))
        async with http, Client(streamable_http_client(url, http_client=http)) as mcp:
            return await mcp.call_tool("echo", args, meta=meta)

    def text(result: Any) -> str:
        return "\n".join(block.text for block in result.content)

    def ids(session: str, call: str) -> dict[str, str]:
        return {"dex-celery/session-id": session, "dex-celery/turn-id": "t1",
                "dex-celery/tool-call-id": call}  # fmt: skip

    start_worker()
    with mcp_server(env, "127.0.0.1", DEX_WEB_TOKENS=TOKENS) as url:
        # The rival names the session the agent's id-less calls used to go to.
        squat = anyio.run(call, url, "rival-tok", {"x": "squat"}, ids("door.agent", "c1"))
        assert squat.meta["dex-celery/status"] != "refused", text(squat)
        # The agent's own calls without ids still work, and their session is the agent's.
        mine = anyio.run(call, url, "agent-tok", {"x": "mine"})
        assert not mine.is_error, text(mine)
        key = mine.meta[IDEMPOTENCY_META_KEY]
        session = key.split("/")[0]
        assert session != "door.agent" and session != squat.meta[IDEMPOTENCY_META_KEY].split("/")[0]
        # Naming the agent's real session (learnt from a key) is refused, and records nothing.
        stolen = anyio.run(call, url, "rival-tok", {"x": "stolen"}, ids(session, "c9"))
        assert stolen.is_error and "not one of yours" in text(stolen), text(stolen)
        with pytest.raises(LookupError):
            dex.client().get_call(f"{session}/t1/c9")
        # The same explicit ids given by two callers are two calls, each in its own namespace.
        same = [anyio.run(call, url, tok, {"x": tok}, ids("shared", "c1"))
                for tok in ("agent-tok", "rival-tok")]  # fmt: skip
        keys = [r.meta[IDEMPOTENCY_META_KEY] for r in same]
        assert keys[0] != keys[1] and all(not r.is_error for r in same), [text(r) for r in same]
        assert '"x": "agent-tok"' in text(same[0]) and '"x": "rival-tok"' in text(same[1])
        # Asking again with the returned key is the same call (namespacing is idempotent).
        again = anyio.run(
            call, url, "agent-tok", {"x": "agent-tok"}, {IDEMPOTENCY_META_KEY: keys[0]}
        )
        assert again.meta[IDEMPOTENCY_META_KEY] == keys[0] and text(again) == text(same[0])
