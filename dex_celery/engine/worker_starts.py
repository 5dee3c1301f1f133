"""Every start of a worker's main process, kept in Redis, so `dex-celery status` can say which
workers answer, since when, and how often each was started under its name.

A worker whose main process exits and is started again by its supervisor (`dex-celery dev`,
docker compose's restart policy, systemd's `Restart=always`: docs/operations.md) keeps its
Celery node name, so the count of starts under one name shows the restarts; the pid and the
uptime of the current life come from the worker itself (Celery's `inspect stats`).

One hash (`KeySpace.worker_starts`): node name -> JSON `{"pid", "started_at", "starts"}`,
written once per start by the worker's main process when it is ready (`worker_ready`), on the
ledger's clock (S10.1). Nothing reads it on the path of a call. Starts older than
`FORGET_AFTER` are dropped; `status` names silent nodes only within `SILENT_WINDOW`.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from dex_celery.errors import DexError

if TYPE_CHECKING:
    from dex_celery.engine.runtime import RuntimeSource

log = logging.getLogger("dex_celery.engine.worker_starts")

#: `status` lists a node that does not answer only if it started within this many seconds: a
#: worker that was retired (or a container replaced under a new name) fades from the report.
SILENT_WINDOW = 24 * 3600.0
#: A start recorded longer ago than this is dropped when another worker records its start, so
#: the hash does not grow with every container name a deployment ever had.
FORGET_AFTER = 30 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class WorkerStart:
    """The last start of one worker node, and how many starts its name has seen."""

    node: str
    pid: int
    started_at: float
    starts: int

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1)


def record_start(source: RuntimeSource, node: str, pid: int | None = None) -> WorkerStart | None:
    """Count one start of `node` (its main process is ready); None if Redis would not take it
    (a worker that starts while Redis is away still serves calls; only the count misses one)."""
    key = source.runtime.keys.worker_starts
    try:
        known = read_starts(source)
        previous = known.get(node)
        start = WorkerStart(
            node=node,
            pid=os.getpid() if pid is None else pid,
            started_at=source.runtime.ledger.now(),
            starts=(previous.starts if previous else 0) + 1,
        )
        source.runtime.redis.hset(
            key,
            node,
            json.dumps({"pid": start.pid, "started_at": start.started_at, "starts": start.starts}),
        )
        forgotten = [
            other
            for other, seen in known.items()
            if other != node and start.started_at - seen.started_at > FORGET_AFTER
        ]
        if forgotten:
            source.runtime.redis.hdel(key, *forgotten)
    except (redis.RedisError, DexError) as e:  # Redis away (the ledger's clock says so too)
        log.warning("could not record the start of worker %s: %s", node, e)
        return None
    return start


def read_starts(source: RuntimeSource) -> dict[str, WorkerStart]:
    """Node name -> its last recorded start (fields that do not parse are skipped)."""
    raw: dict[str, str] = source.runtime.redis.hgetall(source.runtime.keys.worker_starts)  # type: ignore[assignment]
    out: dict[str, WorkerStart] = {}
    for node, text in raw.items():
        try:
            value: dict[str, Any] = json.loads(text)
            out[node] = WorkerStart(
                node, int(value["pid"]), float(value["started_at"]), int(value["starts"])
            )
        except (ValueError, KeyError, TypeError):
            continue
    return out
