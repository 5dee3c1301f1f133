"""A replicated Redis under Sentinel for failover tests: a primary, replicas, one Sentinel.

All real processes on free ports in the test's own folder. One Sentinel with quorum 1 is enough
to detect the primary's death and promote a replica (a majority of one); production runs three.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import redis

from devtools.processes import RedisServer, free_port, wait_for
from dex_celery.processes.parent_death import popen_with_parent_death

MASTER_NAME = "dexmaster"
#: Start a full resynchronisation at once (Redis waits 5 s by default for more replicas).
FAST_SYNC = ("--repl-diskless-sync-delay", "0")
#: Sentinel declares a server down after this long without an answer. Long on purpose: the tests
#: start the failover themselves (`SentinelServer.fail_over`) once they have killed the primary,
#: so a loaded machine's slow answers never set off a second, unasked failover of the replica
#: just promoted.
DOWN_AFTER_MS = 30000


def sentinel_binary() -> list[str]:
    """`redis-sentinel` (Debian package redis-sentinel), else `redis-server --sentinel`."""
    binary = shutil.which("redis-sentinel")
    if binary is not None:
        return [binary]
    server = shutil.which("redis-server")
    if server is None:
        raise RuntimeError("neither redis-sentinel nor redis-server is on the PATH")
    return [server]


@dataclass
class SentinelServer:
    directory: Path
    master_port: int
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> SentinelServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.directory}\n"
            f"logfile {self.directory / 'sentinel.log'}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master_port} 1\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} 10000\n"
            f"sentinel parallel-syncs {MASTER_NAME} 2\n"
        )
        command = sentinel_binary()
        args = [*command, str(conf)]
        if not command[0].endswith("redis-sentinel"):
            args.append("--sentinel")
        self.process = popen_with_parent_death(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, decode_responses=True)
        wait_for(lambda: _master(client) is not None, timeout=30, what="Sentinel to start")
        return self

    @property
    def url(self) -> str:
        return f"sentinel://127.0.0.1:{self.port}"

    def fail_over(self) -> None:
        """`SENTINEL FAILOVER`: promote a replica now, as Sentinel does once it finds the primary
        down. Refused while a failover is under way or no replica qualifies yet; ask again."""
        with contextlib.suppress(redis.RedisError):
            redis.Redis(port=self.port).execute_command("SENTINEL", "FAILOVER", MASTER_NAME)

    def master_port_now(self) -> int | None:
        return _master(redis.Redis(port=self.port, decode_responses=True))

    def log(self) -> str:
        path = self.directory / "sentinel.log"
        return path.read_text() if path.exists() else ""

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


def _master(client: redis.Redis) -> int | None:
    try:
        reply = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
    except redis.RedisError:
        return None
    return int(reply[1]) if reply else None


@dataclass
class ReplicatedRedis:
    """Primary + `replicas` replicas (all with `appendonly yes`, `appendfsync always`) and one
    Sentinel watching them."""

    directory: Path
    replicas: int = 1
    primary: RedisServer | None = None
    followers: list[RedisServer] = field(default_factory=list)
    sentinel: SentinelServer | None = None

    def start(self) -> ReplicatedRedis:
        self.primary = RedisServer(
            self.directory / "primary", appendonly=True, appendfsync="always", extra_args=FAST_SYNC
        ).start()
        for i in range(self.replicas):
            self.followers.append(
                RedisServer(
                    self.directory / f"replica-{i}",
                    appendonly=True,
                    appendfsync="always",
                    extra_args=(*FAST_SYNC, "--replicaof", "127.0.0.1", str(self.primary.port)),
                ).start()
            )
        self.wait_replicated(self.primary, self.replicas)
        self.sentinel = SentinelServer(self.directory / "sentinel", self.primary.port).start()
        sentinel = redis.Redis(port=self.sentinel.port, decode_responses=True)
        wait_for(
            lambda: len(_replicas_known(sentinel)) == self.replicas,
            timeout=30,
            what="Sentinel to discover the replicas",
        )
        return self

    @staticmethod
    def wait_replicated(server: RedisServer, count: int, *, timeout: float = 30) -> None:
        """Wait until `count` replicas hold every write `server` acknowledged so far.

        A probe `PUBLISH` (replicated like a write, touching no key) then `WAIT` on the same
        connection: replicas that acknowledge the probe hold everything written before it. A
        comparison of offsets in `INFO` would need a quiet second (replicas report their offset
        once a second) that a busy ledger never gives.
        """
        client = redis.Redis(port=server.port)

        def in_sync() -> bool:
            pipe = client.pipeline(transaction=False)
            pipe.publish("test-replication-probe", "sync")
            pipe.execute_command("WAIT", count, 1000)
            _, acked = pipe.execute()
            return int(acked) >= count

        wait_for(in_sync, timeout=timeout, what=f"{count} replica(s) in sync with {server.port}")

    def server_on(self, port: int) -> RedisServer:
        return next(s for s in [self.primary, *self.followers] if s is not None and s.port == port)

    def pause(self, server: RedisServer) -> None:
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)

    def resume(self, server: RedisServer) -> None:
        if server.process is not None and server.process.poll() is None:
            os.kill(server.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        for server in self.followers:
            self.resume(server)
        with contextlib.suppress(Exception):
            if self.sentinel is not None:
                self.sentinel.kill()
        for server in [self.primary, *self.followers]:
            if server is not None:
                server.kill()


def _replicas_known(client: redis.Redis) -> list[object]:
    try:
        return list(client.execute_command("SENTINEL", "REPLICAS", MASTER_NAME))
    except redis.RedisError:
        return []
