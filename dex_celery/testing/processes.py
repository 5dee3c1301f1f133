"""Real processes for crash tests: a private redis-server and `celery worker` / `celery beat` of
any app, each in its own process group so a kill reaches every process it started.

Shared by the users' kit (`dex_celery.testing`) and the project's own tests (`devtools.processes`
re-exports `RedisServer` and `wait_for`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import redis

from dex_celery.errors import ConfigurationError
from dex_celery.processes.localstack import free_port, redis_server_args
from dex_celery.processes.parent_death import popen_with_parent_death
from dex_celery.testing import leftovers


def wait_for(
    predicate: Callable[[], object], *, timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll `predicate` until it is truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class RedisServer:
    """A private redis-server on a free port, in its own folder; never the shared one."""

    directory: Path
    appendonly: bool = False
    appendfsync: str = "everysec"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    #: More `redis-server` options, e.g. `("--maxmemory-policy", "allkeys-lru")`.
    extra_args: Sequence[str] = ()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ConfigurationError("redis-server is not on the PATH")
        self.directory.mkdir(parents=True, exist_ok=True)
        args = redis_server_args(
            binary,
            self.port,
            self.directory,
            appendonly=self.appendonly,
            appendfsync=self.appendfsync,
            extra=self.extra_args,
        )
        self.process = popen_with_parent_death(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        leftovers.note_started(self.process.pid, group=False)
        client = redis.Redis(port=self.port)
        # Loading a large append-only file after a restart takes a while.
        wait_for(lambda: _pings(client), timeout=30, what=f"redis-server on port {self.port}")
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@dataclass
class CeleryProcess:
    """`celery -A <app> worker|beat ...` in its own process group, started in `cwd`, ready once
    its log shows `ready_line`. Its output goes to a log file in `directory`."""

    app: str
    args: Sequence[str]
    env: Mapping[str, str]
    directory: Path
    cwd: Path
    ready_line: str
    name: str = "worker"
    process: subprocess.Popen[bytes] | None = None
    logfile: Path = field(default_factory=lambda: Path("/dev/null"))

    def start(self, *, timeout: float = 60, wait: bool = True) -> Self:
        """Start it; with `wait`, return once it is ready (its log shows `ready_line`)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.logfile = self.directory / f"{self.name}-{time.time_ns()}.log"
        command = [sys.executable, "-m", "celery", "-A", self.app, *self.args]
        with self.logfile.open("wb") as out:
            self.process = popen_with_parent_death(
                command, cwd=self.cwd, env={**os.environ, **self.env}, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        leftovers.note_started(self.process.pid, group=True)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for(
            lambda: self.ready_line in self.log() or self.died(),
            timeout=timeout,
            what=f"celery {self.name} of {self.app} to start",
        )
        if self.died():
            raise RuntimeError(f"{self.name} exited at start:\n{self.log()[-3000:]}")

    def died(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"the {self.name} is not running")
        return self.process.pid

    def kill_all(self) -> None:
        """SIGKILL the main process and every child at once, as a lost machine would."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def stop(self, *, grace: float = 10) -> None:
        """SIGTERM the group, then SIGKILL whatever is left after `grace` seconds."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace)
        self.kill_all()
        self.process = None

    def log(self) -> str:
        return self.logfile.read_text(errors="replace") if self.logfile.exists() else ""
