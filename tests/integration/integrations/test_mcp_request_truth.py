"""`dex-celery mcp` tells an MCP client the truth when a request fails after its insert (S11.2).

With the ledger's Redis out of memory, a write requested by a client that sends no ids cannot
claim its place in the shared map of unanswered calls, so nothing is recorded and the answer
says Redis refused; once memory is freed, asking again runs the write once. (A request whose
insert was committed before Redis refused answers `in_flight` with its key:
tests/crash/requester/test_request_truth.py covers that path through the client.) A real `dex-celery mcp` over stdio, the SDK's client,
a real redis-server with `maxmemory` and `noeviction`, a real worker and the tool's own log.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import redis
from mcp import Client

from devtools.processes import Worker
from dex_celery import CallStatus, Dex
from dex_celery.integrations.mcp.server import STATUS_META_KEY
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY
from tests.support.faults.crash import count_calls, lines, wait_finished
from tests.support.faults.request_truth import (
    dex_on,
    fill_until_out_of_memory,
    small_redis,
    sweeping,
)
from tests.support.mcp.server import _server, _text

WRITE = "slow_non_idempotent_write"


def test_mcp_client_without_ids_is_told_the_truth_when_redis_is_full_and_asking_again_runs_it_once(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    with small_redis(tmp_path) as server:
        own, own_env = dex_on(env, server)
        start_worker(extra_env=own_env)
        fillers: list[str] = []

        async def scenario(target: Any) -> dict[str, Any]:
            seen: dict[str, Any] = {}
            async with Client(target) as mcp:
                # The server binds its ledger on its first call, while Redis has room.
                seen["warm"] = await mcp.call_tool("echo", {"x": 1})
                fillers.extend(await anyio.to_thread.run_sync(fill_until_out_of_memory, server))
                seen["first"] = await mcp.call_tool(WRITE, {"seconds": 0})
                seen["calls_after_first"] = await anyio.to_thread.run_sync(count_calls, own)
                await anyio.to_thread.run_sync(
                    lambda: redis.Redis.from_url(server.url).delete(*fillers)
                )
                with sweeping(own):
                    seen["again"] = await mcp.call_tool(WRITE, {"seconds": 0})
            return seen

        with _server("stdio", own_env) as target:
            seen = anyio.run(scenario, target)

        assert not seen["warm"].is_error, _text(seen["warm"])
        first = seen["first"]
        text = _text(first)
        assert first.is_error
        # A request without ids first claims its place in the shared map of unanswered calls
        # (in the ledger's Redis, so every `dex-celery mcp` process agrees on one call). With
        # Redis full that claim fails before anything is recorded: the answer says Redis
        # refused, and no call exists that could run later (S11.2).
        assert first.meta[STATUS_META_KEY] == "refused", text
        assert "maxmemory" in text or "Redis" in text, text
        assert seen["calls_after_first"] == 1  # only the warm-up read

        again = seen["again"]
        key = again.meta[IDEMPOTENCY_META_KEY]
        done = wait_finished(own, key)
        assert done.status is CallStatus.SUCCEEDED, (done.status, done.error)
        assert [a for a, _pid, _k in lines(key, "start")] == [1]
        assert count_calls(own) == 2  # the warm-up read and the one write
