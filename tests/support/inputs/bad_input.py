"""What bad input must leave behind: nothing in SQL, nothing on the broker."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import redis
from sqlalchemy import func, select

from dex_celery import (
    Dex,
)
from dex_celery.store.schema import messages, sessions, tool_calls

#: The default queue Celery publishes attempts to (a Redis list on the broker).
BROKER_QUEUE = "celery"


def sql_rows(dex: Dex) -> dict[str, int]:
    with dex.store.engine.connect() as conn:
        return {
            table.name: int(conn.execute(select(func.count()).select_from(table)).scalar_one())
            for table in (sessions, messages, tool_calls)
        }


def redis_keys(dex: Dex, client: redis.Redis) -> list[str]:
    return sorted(cast(list[str], list(client.scan_iter(match=f"{dex.keys.prefix}:*"))))


def assert_nothing_written(dex: Dex, client: redis.Redis) -> None:
    """S9.3: no half-written record anywhere."""
    assert sql_rows(dex) == {"dex_sessions": 0, "dex_messages": 0, "dex_tool_calls": 0}
    assert redis_keys(dex, client) == []
    assert client.llen(BROKER_QUEUE) == 0
    assert client.xlen(dex.keys.events) == 0
    assert client.dbsize() == 0, sorted(cast(list[str], client.keys("*")))


def state(dex: Dex, client: redis.Redis, log_dir: Path) -> dict[str, Any]:
    """Everything a bad input could half-write, as comparable values."""
    with dex.store.engine.connect() as conn:
        sql = {
            t.name: sorted(tuple(str(v) for v in r) for r in conn.execute(select(t)))
            for t in (sessions, messages, tool_calls)
        }
    ledger = {}
    for name in cast(list[str], sorted(client.scan_iter(match=f"{dex.keys.call('*')}"))):
        fields = cast(dict[str, str], client.hgetall(name))
        fields.pop("refused", None)
        ledger[name] = fields
    k = dex.keys
    indexes = {
        i: client.zrange(i, 0, -1, withscores=True)
        for i in (k.queue_index, k.lease_index, k.close_index, k.unrecorded_index)
    }
    logs = sorted(
        (p.name, p.read_text()) for p in log_dir.glob("*.log") if not p.name.startswith("worker-")
    )
    return {
        "sql": sql,
        "ledger": ledger,
        "indexes": indexes,
        "events": client.xlen(k.events),
        "tool_logs": logs,
    }
