"""Real processes for integration and crash tests: redis-server and Celery prefork workers."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on the PATH")
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        wait_for(lambda: _pings(client), timeout=10, what=f"redis-server on port {self.port}")
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
class Worker:
    """`celery -A tests.support.toolapp worker -P prefork` in its own process group."""

    env: Mapping[str, str]
    log_dir: Path
    concurrency: int = 2
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout: float = 60) -> Worker:
        before = set(self.log_dir.glob("ready-*"))
        self.logfile = self.log_dir / f"worker-{time.time():.3f}.log"
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.support.toolapp",
            "worker",
            "-P",
            "prefork",
            "-c",
            str(self.concurrency),
            "-l",
            "info",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-n",
            f"test{time.time_ns()}@%h",
            *self.extra_args,
        ]
        with self.logfile.open("wb") as out:
            self.process = subprocess.Popen(
                args,
                cwd=ROOT,
                env={**os.environ, **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(
            lambda: set(self.log_dir.glob("ready-*")) - before or self._died(),
            timeout=timeout,
            what="the worker to be ready",
        )
        if self._died():
            raise RuntimeError(f"worker exited at start:\n{self.logfile.read_text()[-3000:]}")
        return self

    def _died(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def kill_all(self) -> None:
        """SIGKILL the main process and every pool child at once, as a lost machine would."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def kill_main(self) -> None:
        """SIGKILL only the main process."""
        assert self.process is not None
        os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill_all()
        elif self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)  # orphans of a dead main process
        self.process = None

    def log(self) -> str:
        return self.logfile.read_text() if self.logfile.exists() else ""
