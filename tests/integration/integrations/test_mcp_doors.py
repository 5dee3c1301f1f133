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
from dex_celery.integrations.mcp_client import IDEMPOTENCY_META_KEY
from tests.support.crash import lines
from tests.support.netns import namespace

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
                 "meta": {IDEMPOTENCY_META_KEY: own}},
                # 6: the rival by the three ids; 7: the owner follows its call again
                {"url": url, "headers": bearer("rival-tok"), "tool": WRITE, "arguments": write,
                 "meta": {"dex-celery/session-id": "own", "dex-celery/turn-id": "t1",
                          "dex-celery/tool-call-id": "c1"}},
                {"url": url, "headers": bearer("agent-tok"), "tool": WRITE, "arguments": write,
                 "meta": {IDEMPOTENCY_META_KEY: own}},
                # 8: the rival without ids: a call in a session of its own; 9: a person (Basic)
                {"url": url, "headers": bearer("rival-tok"), "tool": WRITE,
                 "arguments": {"seconds": 0.1, "value": "rival"}},
                {"url": url, "headers": {"Authorization": "Basic YWxpY2U6cHctYQ=="}},
            ]  # fmt: skip
            out = ns.run([sys.executable, "-m", "tests.support.mcp_door_client", json.dumps(steps)],
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
    for rival in (seen[5], seen[6]):
        assert rival["ok"] and rival["is_error"], rival
        assert "not one of yours" in rival["text"] and "mine" not in rival["text"], rival
    assert seen[7]["text"] == '"mine"'
    assert len(lines(own, "start")) == 1  # the write ran once, for its owner only
    assert client.get_call(own).status is CallStatus.SUCCEEDED

    theirs = seen[8]
    assert theirs["ok"] and theirs["text"] == '"rival"', theirs
    key = theirs["meta"][IDEMPOTENCY_META_KEY]
    assert key.startswith("door.rival/"), key
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
        assert keys[0].startswith("door.agent/") and keys[1].startswith("door.rival/")
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
