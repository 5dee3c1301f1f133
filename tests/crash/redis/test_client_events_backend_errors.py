"""Following events while Redis goes away raises a dex-celery error, not redis-py's (issue 19:
"no public call raises a third-party exception"; the `DexClient` docstring promises
`RedisUnavailable` for every method).

`DexClient.events` and `AsyncDexClient.events` hand back iterators: the reads happen on
`next()`, after the method returned, so the client's translation of backend errors must cover
the iteration too. A real redis-server of the test's own is killed mid-iteration.
"""

from __future__ import annotations

import anyio
import pytest

from devtools.processes import RedisServer
from dex_celery import Dex
from dex_celery.errors import RedisUnavailable


def test_iterating_events_when_redis_dies_raises_redis_unavailable(
    own_dex: Dex, own_redis: RedisServer
) -> None:
    client = own_dex.client()
    client.request_call("s1", "t1", "c1", "echo", {"x": 1})
    events = client.events("0", follow=True, timeout=30)
    first = next(events)
    assert first.key == "s1/t1/c1"
    own_redis.kill()
    with pytest.raises(RedisUnavailable):
        for _ in events:
            pass


def test_async_iterating_events_when_redis_dies_raises_redis_unavailable(
    own_dex: Dex, own_redis: RedisServer
) -> None:
    from dex_celery.client.dex_client import AsyncDexClient

    client = AsyncDexClient(own_dex)
    own_dex.client().request_call("s1", "t1", "c1", "echo", {"x": 1})

    async def scenario() -> None:
        events = client.events("0", follow=True, timeout=30)
        first = await events.__anext__()
        assert first.key == "s1/t1/c1"
        own_redis.kill()
        with pytest.raises(RedisUnavailable):
            async for _ in events:
                pass

    anyio.run(scenario)
