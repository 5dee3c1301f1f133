"""The two ledger scripts of every attempt (`claim`, `finish`) on a worker's hot path.

A pool process runs `claim` before and `finish` after every tool, and nothing else of the
ledger's per call (docs/benchmarks.md, section 15). Through redis-py's generic machinery each
of the two costs far more client CPU than the round trip itself: the connection pool's pid
check, lock and `poll` of the socket at every checkout, the packing of every argument through
the encoder, `Script`'s bookkeeping and the reply callbacks. Here each script's command is packed
once per process (its SHA, key count and the shard's fixed key names are bytes ready to send);
per call only the call's own key and arguments are encoded, the command goes out in one
`sendall` on a connection this process holds, and the reply is read by the connection's own
parser (hiredis when installed) and turned into the same field dict `protocol.decode` makes.

What does not change: the scripts, their keys and arguments (byte for byte what
`Script.__call__` would send), a script missing from Redis's cache (loaded, then sent again),
redis-py's own retry of a command whose connection broke (the connection's `Retry`; both scripts
answer a repeat of the same fence's call as the first: `claim.lua`, `finish.lua`), the time-outs
and TLS or Sentinel of the connection (it comes from the client's own pool). A Redis Cluster
client routes by slot and keeps the generic path (`HotScripts.usable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis.commands.core import Script

from dex_celery.errors import LedgerError
from dex_celery.forks import after_fork, keep_inherited
from dex_celery.ledger.keys import KeySpace


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _arg(value: str | int | float) -> bytes:
    """One argument as RESP bulk bytes, encoded as redis-py's `Encoder` encodes it (a float
    by `repr`, an int by `str`, text as UTF-8)."""
    if isinstance(value, str):
        data = value.encode()
    elif isinstance(value, float):
        data = repr(value).encode()
    else:
        data = str(value).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


class _Packed:
    """One script's command, packed once: `EVALSHA sha numkeys <call key> <fixed keys...>`
    per shard, followed at send time by the per-call arguments."""

    def __init__(
        self, name: str, script: Script, keys: KeySpace, fixed: Sequence[str], args: int
    ) -> None:
        self.name = name
        self.script = script
        numkeys = 1 + len(fixed)
        count = 3 + numkeys + args
        self.head = b"*%d\r\n" % count + _bulk(b"EVALSHA") + _bulk(script.sha.encode())
        self.head += _bulk(str(numkeys).encode())
        #: Per shard: the fixed keys after the call's own, packed.
        self.tails = [
            b"".join(_bulk(getattr(shard, name).encode()) for name in fixed)
            for shard in keys.all_shards
        ]


#: The fixed keys of each script after the call's own hash, in the order its `KEYS` has them.
_CLAIM_KEYS = ("queue_index", "lease_index", "close_index", "events", "epoch", "clock")
_FINISH_KEYS = (
    "queue_index",
    "lease_index",
    "close_index",
    "unrecorded_index",
    "events",
    "epoch",
    "clock",
)


class HotScripts:
    """`claim` and `finish` packed once per process, sent on connections the process holds.

    Thread-safe without a lock: each call takes a connection off a free list and puts it back
    (a list's `pop` and `append` are atomic), so one thread (prefork) reuses one connection and
    a threads or gevent pool holds at most as many as ran at once. A connection that failed is
    closed and dropped; the next call takes a new one from the client's pool. A forked child
    starts with an empty list (`forks.after_fork`): the parent's sockets are never used.
    """

    def __init__(self, client: redis.Redis, keys: KeySpace, scripts: dict[str, Script]) -> None:
        self.client = client
        self.keys = keys
        self.claim = _Packed("claim", scripts["claim"], keys, _CLAIM_KEYS, 5)
        self.finish = _Packed("finish", scripts["finish"], keys, _FINISH_KEYS, 8)
        self._free: list[Any] = []
        after_fork(self._drop_inherited)

    @staticmethod
    def usable(client: redis.Redis) -> bool:
        """A single-node client (a plain URL or Sentinel's master) whose pool hands out
        redis-py's own socket connections: a cluster client routes per slot, and a stand-in
        server's connections (fakeredis, in unit tests) take commands, not packed bytes; both
        keep the generic path."""
        pool = getattr(client, "connection_pool", None)
        connection = getattr(pool, "connection_class", None)
        return (
            isinstance(client, redis.Redis)
            and isinstance(connection, type)
            and connection.__module__.split(".")[0] == "redis"
        )

    def _drop_inherited(self) -> None:
        keep_inherited(self._free)
        self._free = []

    def run(self, packed: _Packed, key: str, args: Sequence[str | int | float]) -> dict[str, str]:
        """Run one packed script for call `key`; the reply as `protocol.decode` gives it."""
        shard = self.keys.shard_of(key)
        call = self.keys.shard(shard).call(key).encode()
        parts = [packed.head, _bulk(call), packed.tails[shard]]
        parts.extend(_arg(a) for a in args)
        reply = self._send(packed, b"".join(parts))
        if not isinstance(reply, list) or len(reply) % 2:
            raise LedgerError(
                f"ledger script {packed.name} answered {reply!r}, not field/value pairs"
            )
        it = iter(reply)
        fields = {_text(k): _text(v) for k, v in zip(it, it, strict=True)}
        if "kind" not in fields:
            raise LedgerError(f"ledger script {packed.name} answered without a kind: {reply!r}")
        return fields

    def _send(self, packed: _Packed, command: bytes) -> Any:
        try:
            conn = self._free.pop()
            held = True
        except IndexError:
            conn = self.client.connection_pool.get_connection()
            held = False
        try:
            reply = self._attempt(packed, conn, command, held)
        except redis.ResponseError as e:
            self._free.append(conn)  # Redis answered: the connection is fine
            raise LedgerError(f"ledger script {packed.name} failed: {e}") from e
        except BaseException:
            conn.disconnect()
            self.client.connection_pool.release(conn)  # closed: the pool may reconnect it
            raise
        self._free.append(conn)
        return reply

    def _attempt(self, packed: _Packed, conn: Any, command: bytes, held: bool) -> Any:
        try:
            return self._with_retry(conn, command)
        except redis.exceptions.NoScriptError:
            # Redis lost its script cache (a restart): load the script, send the call again.
            self.client.script_load(packed.script.script)
            return self._with_retry(conn, command)
        except (redis.ConnectionError, OSError):
            if not held:
                raise
            # A held connection the server closed while it was idle (a restart, `timeout`, a
            # failover): redis-py's pool would have seen it at checkout (its `poll`) and
            # reconnected before sending; here it shows on this call, so the call is sent once
            # more on a new connection. Safe either way: a claim repeated with the same fence
            # holds as the first, and a repeated finish is a noop (`claim.lua`, `finish.lua`).
            conn.disconnect()
            return self._attempt(packed, conn, command, held=False)

    @staticmethod
    def _with_retry(conn: Any, command: bytes) -> Any:
        """One round trip, repeated by the connection's own `Retry` after a broken connection
        (redis-py's behaviour for every command; both scripts answer a repeat alike)."""
        return conn.retry.call_with_retry(
            lambda: _round_trip(conn, command), lambda _error: conn.disconnect()
        )


def _round_trip(conn: Any, command: bytes) -> Any:
    conn.send_packed_command((command,))
    return conn.read_response()


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
