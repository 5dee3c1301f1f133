"""Ended calls counted as they end (`dex_call_counts`), so metrics never scan history.

Every write that ends calls (the worker's batched outcomes, and the single outcome writes of the
sweeper, the approvals and the dispatcher) calls `count_ended` in its own transaction, after its
conditional UPDATEs: only calls that really ended there are counted, and the count commits or
rolls back with them, so the counts equal a grouped scan of the ended calls at every commit.
Terminal statuses never change, so nothing is ever subtracted. Groups are upserted in one sorted
order, last in the transaction, so two writers cannot deadlock on them and the row locks are
held only until the commit; `shard` (by process) keeps concurrent writers off each other's rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.engine.interfaces import DBAPICursor

    from dex_celery.store.hot import HotStatements

#: Rows per (tool, effect, status): one per writer process, by pid.
SHARDS = 8

#: One ended call: (tool name, effect class, terminal status, attempts).
Ended = tuple[str, str, str, int]


def count_ended(
    conn: Connection | DBAPICursor, hot: HotStatements, ended: Iterable[Ended], *, sign: int = 1
) -> None:
    """Add the calls this transaction ended to their counts: one upsert per group, in sorted
    order, in this process's shard (a read sums the shards). `sign=-1` subtracts them (history
    prune removing calls)."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for tool, effect, status, attempts in ended:
        total = groups.setdefault((tool, effect, status), [0, 0, 0])
        total[0] += 1
        total[1] += attempts
        total[2] += max(attempts - 1, 0)
    if not groups:
        return
    shard = os.getpid() % SHARDS
    hot.count_ended.execute_many(
        conn,
        [
            {
                "b_tool": tool,
                "b_effect": effect,
                "b_status": status,
                "b_shard": shard,
                "b_calls": sign * calls,
                "b_attempts": sign * attempts,
                "b_retries": sign * retries,
            }
            for (tool, effect, status), (calls, attempts, retries) in sorted(groups.items())
        ],
    )
