"""The ledger scripts of every call on a worker's hot path: `claim` and `finish` (the pool),
`recorded` (the outcome recorder).

A pool process runs `claim` before and `finish` after every tool, and nothing else of the
ledger's per call (docs/benchmarks.md, section 15); the recorder runs `recorded` for each
outcome it wrote, a batch in one round trip (section 17). Through redis-py's generic machinery
each costs far more client CPU than the round trip itself: the connection pool's pid
check, lock and `poll` of the socket at every checkout, the packing of every argument through
the encoder, `Script`'s bookkeeping and the reply callbacks. Here each script's command is packed
once per process (its SHA, key count and the shard's fixed key names are bytes ready to send);
per call only the call's own key and arguments are encoded, the command goes out in one
`sendall` on a connection this process holds, and the reply is read by the connection's own
parser (hiredis when installed) and turned into the same field dict `protocol.decode` makes.

What does not change: the scripts, their keys and arguments (byte for byte what
`Script.__call__` would send), a script missing from Redis's cache (loaded, then sent again),
redis-py's own retry of a command whose connection broke (the connection's `Retry`; each of the
three answers a repeat as the first: `claim.lua` for the same fence, `finish.lua` and
`recorded.lua` as noops), the time-outs
and TLS or Sentinel of the connection (it comes from the client's own pool). A Redis Cluster
client routes by slot and keeps the generic path (`HotScripts.usable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

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
_CLAIM_KEYS = ("queue_index", "lease_index", "close_index", "events", "epoch", "clock", "freeze")
_FINISH_KEYS = (
    "queue_index",
    "lease_index",
    "close_index",
    "unrecorded_index",
    "events",
    "epoch",
    "clock",
)


#: `recorded`'s keys after the call's own hash.
_RECORDED_KEYS = ("unrecorded_index", "events", "epoch", "clock")


class HotScripts:
    """`claim`, `finish` and `recorded` packed once per process, sent on connections the
    process holds.

    Thread-safe without a lock: each call takes a connection off a free list and puts it back
    (a list's `pop` and `append` are atomic), so one thread (prefork) reuses one connection and
    a threads or gevent pool holds at most as many as ran at once. A connection that failed is
    closed and dropped; the next call takes a new one from the client's pool. A forked child
    starts with an empty list (`forks.after_fork`): the parent's sockets are never used.
    """

    def __init__(self, client: redis.Redis, keys: KeySpace, scripts: dict[str, Script]) -> None:
        self.client = client
        self.keys = keys
        self.claim = _Packed("claim", scripts["claim"], keys, _CLAIM_KEYS, 6)
        self.finish = _Packed("finish", scripts["finish"], keys, _FINISH_KEYS, 8)
        self.recorded = _Packed("recorded", scripts["recorded"], keys, _RECORDED_KEYS, 5)
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
        return self.run_many(packed, [(key, args)])[0]

    def run_many(
        self, packed: _Packed, calls: Sequence[tuple[str, Sequence[str | int | float]]]
    ) -> list[dict[str, str]]:
        """Run one packed script per `(key, args)`, all in one round trip (a pipeline, not a
        transaction; each script is still atomic). Only for scripts whose repeat answers as
        the first did (`_attempt`)."""
        commands = [self._command(packed, key, args) for key, args in calls]
        return [_fields(packed, reply) for reply in self._send(packed, commands)]

    def _command(self, packed: _Packed, key: str, args: Sequence[str | int | float]) -> bytes:
        shard = self.keys.shard_of(key)
        call = self.keys.shard(shard).call(key).encode()
        parts = [packed.head, _bulk(call), packed.tails[shard]]
        parts.extend(_arg(a) for a in args)
        return b"".join(parts)

    def _send(self, packed: _Packed, commands: list[bytes]) -> list[Any]:
        try:
            conn = self._free.pop()
            held = True
        except IndexError:
            conn = self.client.connection_pool.get_connection()
            held = False
        try:
            replies = self._attempt(packed, conn, commands, held)
        except BaseException:
            conn.disconnect()
            self.client.connection_pool.release(conn)  # closed: the pool may reconnect it
            raise
        self._free.append(conn)  # every reply was read: the connection is in step
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                raise LedgerError(f"ledger script {packed.name} failed: {reply}") from reply
        return replies

    def _attempt(self, packed: _Packed, conn: Any, commands: list[bytes], held: bool) -> list[Any]:
        try:
            replies = self._with_retry(conn, commands)
            if any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
                # Redis lost its script cache (a restart): load the script and send them all
                # again (any that did run answers its repeat as before: `run_many`).
                self.client.script_load(packed.script.script)
                replies = self._with_retry(conn, commands)
            return replies
        except (redis.ConnectionError, OSError):
            if not held:
                raise
            # A held connection the server closed while it was idle (a restart, `timeout`, a
            # failover): redis-py's pool would have seen it at checkout (its `poll`) and
            # reconnected before sending; here it shows on this call, so the call is sent once
            # more on a new connection. Safe either way: a claim repeated with the same fence
            # holds as the first, a repeated finish is a noop, and so is a repeated `recorded`
            # (`claim.lua`, `finish.lua`, `recorded.lua`).
            conn.disconnect()
            return self._attempt(packed, conn, commands, held=False)

    @staticmethod
    def _with_retry(conn: Any, commands: list[bytes]) -> list[Any]:
        """One round trip, repeated by the connection's own `Retry` after a broken connection
        (redis-py's behaviour for every command; each script answers a repeat alike)."""
        return cast(
            list[Any],
            conn.retry.call_with_retry(
                lambda: _round_trip(conn, commands), lambda _error: conn.disconnect()
            ),
        )


def _round_trip(conn: Any, commands: list[bytes]) -> list[Any]:
    """Send `commands` at once and read one reply each; a script's error is its reply (every
    reply is read, so the connection stays in step for the next call)."""
    # One buffer, one `sendall`: redis-py writes each item of a list with its own (the
    # recorder's `recorded` pipeline of 100 outcomes made 100 system calls).
    conn.send_packed_command([b"".join(commands)])
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(conn.read_response())
        except redis.ResponseError as e:
            replies.append(e)
    return replies


def _fields(packed: _Packed, reply: Any) -> dict[str, str]:
    """A script's reply (field/value pairs) as the dict `protocol.decode` makes."""
    if not isinstance(reply, list) or len(reply) % 2:
        raise LedgerError(f"ledger script {packed.name} answered {reply!r}, not field/value pairs")
    it = iter(reply)
    fields = {_text(k): _text(v) for k, v in zip(it, it, strict=True)}
    if "kind" not in fields:
        raise LedgerError(f"ledger script {packed.name} answered without a kind: {reply!r}")
    return fields


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
