"""A private Redis: the redis-server `dex-celery dev` or `demo` starts for itself.

Such a server listens on loopback only and keeps its data in a temporary folder removed when
its stack stops, so the ledger it held is gone for good once nothing answers at its address.
The stack marks the server (`mark`), every process of the stack reads the mark with its ledger
check, and the database's binding records it (`LedgerOrigin.PRIVATE`): the next stack on the
same database may then start a new ledger by itself (docs/ledger.md, "One database, one
ledger"). A configured Redis never carries the mark.
"""

from __future__ import annotations

import re
import socket
from dataclasses import replace

import redis

from dex_celery.ledger.keys import KeySpace

#: The key a private Redis carries, outside every ledger's prefix (the stack starts the server
#: before any app names its prefix); its value is the name of the host whose stack started it.
MARK_KEY = "dex-celery:private-redis"
#: Seconds a look at a gone private Redis may take: it was on loopback, so a refusal is at once.
PROBE_TIMEOUT = 1.0

_HOST_PORT_DB = re.compile(r"^(?P<host>[^\s:/]+):(?P<port>\d+)/(?P<db>\d+)$")


def this_host() -> str:
    return socket.gethostname()


def mark(client: redis.Redis) -> None:
    """Mark a redis-server the stack has just started as private (before any process uses it)."""
    client.set(MARK_KEY, this_host())


def bound_ledger_answers(location: str, ledger_id: str, keys: KeySpace) -> bool:
    """Does a Redis at `location` (`host:port/db prefix`, as `guard.ledger_location` writes it)
    still hold the ledger `ledger_id`? Nothing answering, or a server that answers without it
    (its port reused by another server), means the ledger is gone."""
    where, _, prefix = location.partition(" ")
    found = _HOST_PORT_DB.match(where)
    if found is None:
        # Not a host:port address (a socket, a Sentinel, a cluster): never a private Redis,
        # and nothing this look can rule out.
        return True
    client = redis.Redis(
        host=found["host"],
        port=int(found["port"]),
        db=int(found["db"]),
        socket_connect_timeout=PROBE_TIMEOUT,
        socket_timeout=PROBE_TIMEOUT,
        decode_responses=True,
    )
    try:
        held = client.get(replace(keys, prefix=prefix or keys.prefix).ledger_id)
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()
    return held == ledger_id
