"""A request re-sent after its HTTP response stream broke is the same call (docs/mcp.md).

The 2026-07-28 revision has a client whose response stream broke re-send the request with a new
JSON-RPC id. `dex-celery mcp` over streamable HTTP, behind a TCP proxy the test cuts while the
tool runs: the SDK's client loses its stream, a new client sends the same request again, and
the answer is the first call's outcome; the tool's own log shows one run. With the idempotency
key in `_meta` the key says which call it is; without ids, the rule for unanswered requests
does (the same caller, tool and arguments while the outcome was not given).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
from mcp import Client
from sqlalchemy import select

from devtools.processes import Worker, wait_for
from dex_celery import CallStatus, Dex
from dex_celery.integrations.mcp.outcome import OUTCOME_META_KEY
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY
from dex_celery.store.schema import tool_calls
from dex_celery.testing.tcpproxy import TcpProxy
from tests.support.faults.crash import lines, wait_started
from tests.support.mcp.server import _server, _text

WRITE = "slow_non_idempotent_write"  # a non-idempotent write that needs no approval


def _keys(dex: Dex) -> list[str]:
    with dex.store.engine.connect() as conn:
        rows = conn.execute(select(tool_calls.c.key).where(tool_calls.c.tool_name == WRITE))
        return [str(r.key) for r in rows]


@pytest.mark.parametrize("ids", ["key_in_meta", "no_ids"])
def test_a_request_resent_after_a_broken_stream_is_one_call_and_one_run(
    ids: str, dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    meta = {IDEMPOTENCY_META_KEY: "resend/t1/charge"} if ids == "key_in_meta" else None
    arguments = {"seconds": 3}

    async def first(url: str, broken: list[BaseException]) -> None:
        try:
            async with Client(url) as mcp:
                answered = await mcp.call_tool(WRITE, arguments, meta=meta)
            raise AssertionError(f"answered before the cut: {_text(answered)}")
        except BaseException as e:  # the broken stream, however the SDK reports it
            if isinstance(e, anyio.get_cancelled_exc_class() | AssertionError):
                raise
            broken.append(e)

    async def scenario(url: str, proxy: TcpProxy) -> tuple[list[BaseException], Any]:
        broken: list[BaseException] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(first, url, broken)
            await anyio.to_thread.run_sync(
                lambda: wait_for(
                    lambda: len(_keys(dex)) == 1 or bool(broken), timeout=30, what="the call"
                )
            )
            assert not broken, f"the first request failed before the cut: {broken!r}"
            (key,) = _keys(dex)
            await anyio.to_thread.run_sync(lambda: wait_started(key))
            assert proxy.cut() >= 1  # the response stream breaks while the tool runs
            # The link comes back once the kernel has let go of the listening port.
            await anyio.to_thread.run_sync(
                lambda: wait_for(proxy.restored, timeout=10, what="the link back")
            )
        # A new client (a new JSON-RPC id) sends the same request again.
        async with Client(url) as mcp:
            again = await mcp.call_tool(WRITE, arguments, meta=meta)
        return broken, again

    with _server("http", env) as target:
        port = urlsplit(target).port
        assert port is not None
        with TcpProxy(port) as proxy:
            broken, again = anyio.run(
                scenario, target.replace(f":{port}/", f":{proxy.port}/"), proxy
            )

    assert broken, "the first request's stream did not break"
    (key,) = _keys(dex)  # one call
    assert again.meta[IDEMPOTENCY_META_KEY] == key
    assert not again.is_error, _text(again)
    assert again.meta[OUTCOME_META_KEY] == "executed"
    assert dex.client().get_call(key).status is CallStatus.SUCCEEDED
    assert [a for a, _, _ in lines(key, "start")] == [1]  # one run


def test_a_request_resent_to_a_new_stdio_server_process_is_the_same_call(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """Over stdio a broken pipe ends the server process: the client re-sends to a new one (as
    the Inspector's CLI does for every command). Without `--session` every process of the same
    user serves one session (`mcp-<user>@localhost`), so the re-sent request without ids is the
    call still waiting for approval, not a second one."""
    start_worker()

    async def ask(target: Any) -> Any:
        async with Client(target) as mcp:
            return await mcp.call_tool("guarded_write", {"value": "charge-7"})

    with _server("stdio", env) as target:
        first = anyio.run(ask, target)
        again = anyio.run(ask, target)
    key = first.meta[IDEMPOTENCY_META_KEY]
    assert key.startswith("mcp-") and key.split("/")[0].endswith("@localhost")
    assert again.meta[IDEMPOTENCY_META_KEY] == key
    assert [c.key for c in dex.client().pending_approvals()] == [key]
    assert lines(key, "start") == []
