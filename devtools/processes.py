"""Real processes for integration and crash tests: redis-server and Celery prefork workers."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from devtools import forkserver
from dex_celery.engine.attempt.outcome_writer import RECORDER_NAME
from dex_celery.processes.localstack import free_port
from dex_celery.processes.parent_death import popen_with_parent_death
from dex_celery.testing.processes import RedisServer, wait_for

__all__ = ["ROOT", "CeleryBeat", "CeleryWorker", "RedisServer", "Worker", "free_port", "wait_for"]

ROOT = Path(__file__).resolve().parents[1]
#: Pools that patch the standard library when the worker starts: never forked from the test
#: suite's fork server, whose imports came before any patch (`devtools.forkserver`).
MONKEY_PATCHING_POOLS = ("gevent", "eventlet")


def as_host_args(hostname: str) -> list[str]:
    """The command prefix that runs a command as another machine would: new UTS and PID
    namespaces (`/proc` remounted, so the command sees its own process ids, from 1) with
    `hostname`; the network, files, Redis and the database stay shared over loopback."""
    return [
        "unshare", "--uts", "--pid", "--fork", "--mount-proc", "--",
        "sh", "-c", 'hostname "$0" && exec "$@"', hostname,
    ]  # fmt: skip


def can_run_as_host() -> str | None:
    """None if `as_host_args` works here; otherwise why not (not root, no `unshare`, ...)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    done = subprocess.run(
        [*as_host_args("dex-probe"), "true"], capture_output=True, text=True, timeout=30
    )
    return None if done.returncode == 0 else f"unshare failed: {done.stderr.strip()[:200]}"


def namespace_pid(pid: int) -> int:
    """The id that process `pid` (of this host) has inside its own, innermost PID namespace."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return pid


def _ready_files(folder: Path) -> dict[Path, str]:
    """The `ready-<pid>` files and what they say (the time written): a worker running as a host
    of its own (`CeleryWorker.host`) may rewrite another host's file, its pid being the same."""
    out = {}
    for path in folder.glob("ready-*"):
        with contextlib.suppress(OSError):
            out[path] = path.read_text()
    return out


def _comm(pid: int) -> str:
    """The process's name (`comm`), or "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _children_of(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@dataclass
class CeleryWorker:
    """`celery -A <app> worker -P <pool>` in its own process group, ready once the app drops a
    `ready-*` file into `ready_dir` (its `worker_ready` handler; `ready_env`, if set, tells the
    app where that folder is). Used by the tests and by the benchmarks alike."""

    app: str
    env: Mapping[str, str]
    ready_dir: Path
    concurrency: int = 2
    pool: str = "prefork"
    loglevel: str = "info"
    extra_args: Sequence[str] = ()
    ready_env: str | None = None
    #: Run as a host of its own: in new UTS and PID namespaces (`unshare`, needs root) with this
    #: host name, so its process ids start at 1 like another machine's; `None`: this host.
    host: str | None = None
    #: Where the worker starts: `-m celery` puts it first on `sys.path`, so a folder holding
    #: another version of the package runs that version (`None`: the repository).
    cwd: Path | None = None
    process: subprocess.Popen[bytes] | forkserver.ForkedProcess | None = None
    logfile: Path = field(default_factory=lambda: Path("/dev/null"))

    def start(self, *, timeout: float = 60) -> Self:
        self.ready_dir.mkdir(parents=True, exist_ok=True)
        before = _ready_files(self.ready_dir)
        self.logfile = self.ready_dir / f"worker-{time.time_ns()}.log"
        args = [
            sys.executable, "-m", "celery", "-A", self.app, "worker",
            "-P", self.pool, "-c", str(self.concurrency), "-l", self.loglevel,
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", f"w{time.time_ns()}@%h", *self.extra_args,
        ]  # fmt: skip
        if self.host is not None:
            args = [*as_host_args(self.host), *args]
        env = {**os.environ, **self.env}
        if self.ready_env:
            env[self.ready_env] = str(self.ready_dir)
        forked = (
            self.host is None
            and self.pool not in MONKEY_PATCHING_POOLS
            and forkserver.usable(env, self.cwd, ROOT)
        )
        with self.logfile.open("wb") as out:
            if forked:  # the test suite's fork server: the same process, without the imports
                self.process = forkserver.spawn_module(
                    "celery", args[3:], env=env, cwd=self.cwd or ROOT, stdout=out.fileno(),
                    stderr=out.fileno(),
                )  # fmt: skip
            else:
                self.process = popen_with_parent_death(
                    args, cwd=self.cwd or ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
        wait_for(
            lambda: _ready_files(self.ready_dir).items() - before.items() or self.died(),
            timeout=timeout,
            what=f"the worker of {self.app} to be ready",
        )
        if self.died():
            raise RuntimeError(f"worker exited at start:\n{self.log()[-3000:]}")
        return self

    def died(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def children(self) -> list[int]:
        """The pool processes (their ids on this host, outside any namespace); the outcome
        recorder, also a child of the main process, is not one of them (`recorder`)."""
        return [pid for pid in self._all_children() if _comm(pid) != RECORDER_NAME]

    def recorder(self) -> int | None:
        """The worker's outcome recorder process (prefork), if it has one."""
        return next((p for p in self._all_children() if _comm(p) == RECORDER_NAME), None)

    def _all_children(self) -> list[int]:
        parents = [self.pid] if self.host is None else _children_of(self.pid)
        return [child for parent in parents for child in _children_of(parent)]

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

    def stop(self, *, warm: bool = False) -> None:
        """SIGKILL the group (and any orphans of a dead main process); with `warm`, SIGTERM
        first and give running tasks up to 15 s."""
        if self.process is None:
            return
        if warm and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self.process = None

    def log(self) -> str:
        return self.logfile.read_text() if self.logfile.exists() else ""


class Worker(CeleryWorker):
    """A worker of the test tools (`devtools.toolapp`); they announce readiness in the
    tool-log folder."""

    def __init__(
        self,
        env: Mapping[str, str],
        log_dir: Path,
        concurrency: int = 2,
        extra_args: Sequence[str] = (),
        pool: str = "prefork",
        host: str | None = None,
    ) -> None:
        """`pool`: `prefork`, `threads` or `gevent` (Celery's `-P`); `host`: see `CeleryWorker`."""
        super().__init__(
            "devtools.toolapp", env, log_dir, concurrency, pool=pool, extra_args=extra_args,
            host=host,
        )  # fmt: skip


@dataclass
class CeleryBeat:
    """`celery -A <app> beat` in its own process group, ready once its log shows `ready_line`
    (the dex sweeper thread announces itself there when beat starts)."""

    app: str
    env: Mapping[str, str]
    directory: Path
    loglevel: str = "info"
    ready_line: str = "the dex sweeper runs every"
    process: subprocess.Popen[bytes] | None = None
    logfile: Path = field(default_factory=lambda: Path("/dev/null"))

    def start(self, *, timeout: float = 60) -> Self:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.logfile = self.directory / f"beat-{time.time_ns()}.log"
        args = [
            sys.executable, "-m", "celery", "-A", self.app, "beat", "-l", self.loglevel,
            "-s", str(self.directory / "celerybeat-schedule"),
        ]  # fmt: skip
        with self.logfile.open("wb") as out:
            self.process = popen_with_parent_death(
                args, cwd=ROOT, env={**os.environ, **self.env}, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        wait_for(
            lambda: self.ready_line in self.log() or self.died(),
            timeout=timeout,
            what=f"celery beat of {self.app} to start",
        )
        if self.died():
            raise RuntimeError(f"beat exited at start:\n{self.log()[-3000:]}")
        return self

    def died(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def stop(self, *, timeout: float = 15) -> int | None:
        """SIGTERM (beat's own shutdown), then SIGKILL after `timeout`; the exit status."""
        if self.process is None:
            return None
        code: int | None = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = self.process.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self.process = None
        return code

    def log(self) -> str:
        return self.logfile.read_text() if self.logfile.exists() else ""
