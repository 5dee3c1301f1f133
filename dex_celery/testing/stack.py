"""One test's stack for the user's own app: a real Celery worker (and beat) on the kit's private
Redis and throwaway database, and the faults dex-celery survives, driven against it.

Every fault is a real one: `kill_at` SIGKILLs the worker's processes while one of them stands at
a named point of an attempt (dex_celery/engine/attempt/pause_points.py), `roll_back_redis` SIGKILLs
redis-server and starts it again from an older snapshot, `cut_redis_link` resets the worker's
TCP connections to Redis (a proxy between them). The record is then read from SQL and the tool
body's runs from the side-effect counter (`dex_celery.testing.effects`).
"""

from __future__ import annotations

import itertools
import os
import signal
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from dex_celery.app import Dex
from dex_celery.engine import (
    PAUSE_AT_ENV,
    PAUSE_DIR_ENV,
    PausePoint,
)
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.settings import env_name
from dex_celery.testing import assertions
from dex_celery.testing.processes import CeleryProcess, RedisServer, wait_for
from dex_celery.testing.tcpproxy import TcpProxy

#: The worker's log line once it consumes (Celery's own `worker_ready` message).
WORKER_READY = " ready."
#: The beat's log line once the dex sweeper thread runs in it.
BEAT_READY = "the dex sweeper runs every"


@dataclass
class StackConfig:
    """What the user chose: the app (`-A`), the pool and its size, whether beat runs."""

    app: str
    pool: str = "prefork"
    concurrency: int = 2
    beat: bool = True
    cwd: Path = field(default_factory=Path.cwd)


@dataclass
class DexStack:
    """The user's app under test. `worker` and `beat` are the current processes (replaced by a
    restart); `directory` holds their logs, the effect counts and the pause markers."""

    dex: Dex
    config: StackConfig
    redis: RedisServer
    env: Mapping[str, str]
    directory: Path
    worker: CeleryProcess | None = None
    beat: CeleryProcess | None = None
    link: TcpProxy | None = None
    session_id: str = field(default_factory=lambda: f"kit-{uuid.uuid4().hex[:12]}")
    _calls: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # --- processes -----------------------------------------------------------------------------

    @property
    def pause_dir(self) -> Path:
        return self.directory / "pause"

    def start_worker(
        self,
        *,
        pause_at: PausePoint | str | Sequence[PausePoint | str] | None = None,
        through_link: bool = False,
        wait: bool = True,
    ) -> CeleryProcess:
        """Start a worker of the user's app (stopping the current one first). `pause_at`: it
        stops at that point (or each of those points) of every attempt until `kill_at` kills
        it or `release` lets it go on. `through_link`: it
        reaches Redis through a proxy that `cut_redis_link` can cut. `wait`: return once it
        consumes."""
        self.stop_worker()
        env = dict(self.env)
        if pause_at is not None:
            named = [pause_at] if isinstance(pause_at, str) else list(pause_at)
            points = [PausePoint(p).value for p in named]
            env[PAUSE_AT_ENV] = ",".join(points)
            env[PAUSE_DIR_ENV] = str(self.pause_dir)
            for point in points:  # an earlier release would let this worker through at once
                (self.pause_dir / f"release-{point}").unlink(missing_ok=True)
        if through_link:
            if self.link is None:
                self.link = TcpProxy(self.redis.port).start()
            env[env_name("redis_url")] = self.link.url()
        args = [
            "worker", "-P", self.config.pool, "-c", str(self.config.concurrency), "-l", "info",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", f"kit-{uuid.uuid4().hex[:8]}@%h",
        ]  # fmt: skip
        self.worker = CeleryProcess(
            self.config.app, args, env, self.directory, self.config.cwd, WORKER_READY
        ).start(wait=wait)
        return self.worker

    def stop_worker(self) -> None:
        """SIGKILL the current worker (`worker.stop()` is the warm shutdown). The markers its
        paused processes left are removed: they name processes that no longer exist."""
        if self.worker is not None:
            self.worker.kill_all()
            self.worker = None
        if self.pause_dir.exists():
            for marker in self.pause_dir.iterdir():
                if not marker.name.startswith("release-"):
                    marker.unlink(missing_ok=True)

    def start_beat(self) -> CeleryProcess:
        """Celery beat of the user's app: the dex sweeper (lost attempts, deadlines) runs in it."""
        self.stop_beat()
        args = ["beat", "-l", "info", "-s", str(self.directory / f"beat-{uuid.uuid4().hex[:6]}")]
        self.beat = CeleryProcess(
            self.config.app, args, self.env, self.directory, self.config.cwd, BEAT_READY, "beat"
        ).start()
        return self.beat

    def stop_beat(self) -> None:
        if self.beat is not None:
            self.beat.stop()
            self.beat = None

    def close(self) -> None:
        """SIGKILL whatever the stack started (nothing of it is worth a warm shutdown)."""
        for process in (self.worker, self.beat):
            if process is not None:
                process.kill_all()
        self.worker = self.beat = None
        if self.link is not None:
            self.link.close()
            self.link = None

    # --- calls ---------------------------------------------------------------------------------

    def request(self, tool: str, arguments: Mapping[str, Any] | None = None) -> str:
        """Ask for one call of `tool`, in this test's session, as an agent would; its key."""
        n = next(self._calls)
        record = self.dex.client().request_call(
            self.session_id, f"turn-{n}", f"call-{n}", tool, dict(arguments or {})
        )
        return record.key

    def approve(self, key: str, approver: str = "kit") -> ToolCallRecord:
        return self.dex.client().approve(key, approver)

    def record(self, key: str) -> ToolCallRecord | None:
        return self.dex.store.get_call(key)

    def wait_finished(self, key: str, *, timeout: float = 60) -> ToolCallRecord:
        return assertions.wait_finished(self.dex, key, timeout=timeout)

    def wait_late_result(self, key: str, *, timeout: float = 60) -> ToolCallRecord:
        """Wait until a late result (S5.2) is on the record of `key`."""
        return assertions.wait_late_result(self.dex, key, timeout=timeout)

    def assert_outcome(
        self, key: str, status: CallStatus | str, *, timeout: float = 60
    ) -> ToolCallRecord:
        return assertions.assert_outcome(self.dex, key, status, timeout=timeout)

    # --- faults --------------------------------------------------------------------------------

    def wait_paused(self, point: PausePoint | str, *, timeout: float = 60) -> tuple[int, str]:
        """Wait until a worker process stands at `point`; its pid and the call's key."""
        prefix = f"{PausePoint(point).value}-"
        found: list[Path] = []

        def paused() -> bool:
            if self.worker is not None and self.worker.died():
                raise AssertionError(f"the worker exited:\n{self.worker.log()[-3000:]}")
            if self.pause_dir.exists():
                found.extend(sorted(self.pause_dir.glob(prefix + "*")))
            return bool(found)

        wait_for(paused, timeout=timeout, what=f"a worker process to reach {prefix[:-1]}")
        marker = found[0]
        pid = int(marker.name[len(prefix) :].split("-", 1)[0])
        return pid, marker.read_text()

    def kill_at(
        self,
        point: PausePoint | str,
        *,
        whole_worker: bool = True,
        restart: bool = True,
        timeout: float = 60,
    ) -> str:
        """SIGKILL the worker once a process of it stands at `point` (start it with
        `start_worker(pause_at=point)`): the whole worker (main process and pool children, as a
        lost machine) or, with `whole_worker=False`, only the process at the point. Then, with
        `restart`, a fresh worker (not pausing) takes over. Returns the call's key."""
        pid, key = self.wait_paused(point, timeout=timeout)
        worker = self.worker
        if worker is None:
            raise AssertionError("no worker is running")
        if whole_worker:
            worker.kill_all()
            self.worker = None
        else:
            os.kill(pid, signal.SIGKILL)
        for marker in self.pause_dir.glob(f"{PausePoint(point).value}-{pid}-*"):
            marker.unlink()
        if restart:  # not waited for: the sweeper (in beat) decides the lost attempt meanwhile
            self.start_worker(wait=False)
        return key

    def release(self, point: PausePoint | str) -> None:
        """Let processes paused at `point` carry on (instead of killing them)."""
        self.pause_dir.mkdir(parents=True, exist_ok=True)
        (self.pause_dir / f"release-{PausePoint(point).value}").write_text("go")

    def snapshot_redis(self) -> None:
        """Save Redis's data to its snapshot file now (what a later rollback returns to)."""
        redis.Redis.from_url(self.redis.url).save()

    def roll_back_redis(self, *, restart_worker: bool = True) -> None:
        """SIGKILL redis-server and start it again from the last snapshot: its ledger and
        broker messages are older than what happened (as a restore or a lagging replica). The
        worker and beat are started again (a supervisor would: Kombu's consumer does not
        survive its broker vanishing)."""
        self.stop_worker()
        self.redis.restart()
        if self.config.beat:
            self.start_beat()
        if restart_worker:
            self.start_worker()

    def cut_redis_link(self) -> int:
        """Reset every connection between the worker and Redis and refuse new ones until
        `restore_redis_link()` (start the worker with `through_link=True`). Beat and the test
        keep their own link. Returns how many connections were reset."""
        if self.link is None:
            raise AssertionError("start the worker with through_link=True to cut its link")
        return self.link.cut()

    def restore_redis_link(self) -> None:
        if self.link is not None:
            self.link.restore()
