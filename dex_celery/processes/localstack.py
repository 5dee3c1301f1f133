"""The local stack of `dex-celery dev` and `dex-celery demo`: Redis, a worker, beat, Flower.

Uses the configured Redis (`DEX_REDIS_URL` set in the environment) or, when none is configured,
starts a private `redis-server` on a free port in a temporary folder. Every process it starts
runs in its own process group, and `stop()` ends each group (a polite signal first, SIGKILL
after a grace period) and removes the temporary folder: nothing it started outlives it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType

import redis
from celery import Celery

from dex_celery.backend_errors import safe_url
from dex_celery.errors import ConfigurationError
from dex_celery.ledger import private_redis
from dex_celery.ledger.connection import redis_client
from dex_celery.processes.celery_config import configure_celery
from dex_celery.processes.parent_death import popen_with_parent_death
from dex_celery.settings import Settings, env_name

REDIS_URL_ENV = env_name("redis_url")
#: How long a stopping process may take before it is killed.
STOP_GRACE = 10.0
#: How long a started service may take to answer.
START_TIMEOUT = 60.0

Echo = Callable[[str], None]


class PrerequisiteMissing(ConfigurationError):
    """Neither a configured Redis nor `redis-server` on the PATH (exit code 2)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now (the tests and bench/ use this one too)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_args(
    binary: str,
    port: int,
    directory: Path,
    *,
    appendonly: bool = False,
    appendfsync: str = "everysec",
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of a private redis-server: loopback only, its own folder and log, no
    snapshots. The one launcher of `dex-celery dev`, the tests and the benchmarks."""
    return [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(directory),
        "--save",
        "",
        "--appendonly",
        "yes" if appendonly else "no",
        "--appendfsync",
        appendfsync,
        "--logfile",
        str(directory / "redis.log"),
        *extra,
    ]


def expanded_node_name(name: str) -> str:
    """A Celery node name with `%h` expanded, as the worker names itself."""
    return name.replace("%h", socket.gethostname())


def ping_app(settings: Settings) -> Celery:
    """A bare Celery app on the stack's broker, only to ping its worker."""
    app = Celery("dex-localstack-ping")
    configure_celery(app, settings)
    return app


def worker_answers(app: Celery, node: str) -> bool:
    """Does the worker `node` answer a ping yet?"""
    try:
        replies = app.control.ping(destination=[node], timeout=0.5)
    except Exception:  # the broker is still coming up
        return False
    return any(node in reply for reply in replies or [])


def prepare_database(settings: Settings, echo: Callable[[str], object]) -> None:
    """Bring the configured database to the newest schema (Alembic), as production does."""
    from dex_celery.store.migrate import upgrade  # deferred: Alembic is slow to import

    revision = upgrade(settings.database_url, schema=settings.database_schema)
    echo(f"database: {safe_url(settings.database_url)} (schema at revision {revision})")


def redis_answers(url: str) -> bool:
    master = Settings.from_env().redis_sentinel_master  # a sentinel:// URL needs it
    try:
        client = redis_client(
            url, sentinel_master=master, socket_connect_timeout=1, socket_timeout=1
        )
        return bool(client.ping())
    except (redis.RedisError, ConfigurationError):
        return False


@dataclass
class Service:
    """One process the stack started, in its own process group."""

    name: str
    args: Sequence[str]
    process: subprocess.Popen[bytes]
    stop_signal: signal.Signals = signal.SIGTERM
    #: Its output goes to `<workdir>/<name>.log` even when the stack is not quiet.
    stdout_to_file: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Signal the group, wait, then SIGKILL whatever of the group is left."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, self.stop_signal)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # pool children, or a process that hung
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace)


@dataclass
class LocalStack:
    """Start with `start()` (or `with LocalStack(...) as stack:`); `stop()` ends everything."""

    celery_module: str
    concurrency: int = 2
    queues: Sequence[str] = ("celery",)
    beat: bool = True
    flower_port: int | None = None
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    #: Where the services' output goes: None inherits the terminal, else files in the work dir.
    quiet: bool = False
    echo: Echo = print
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dex-celery-")))
    redis_url: str = ""
    private_redis: bool = False
    services: list[Service] = field(default_factory=list)
    worker_name: str = ""

    # --- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> LocalStack:
        try:
            self.start_redis()
            self.start_celery()
        except BaseException:
            self.stop()
            raise
        return self

    def settings(self, base: Settings) -> Settings:
        """`base` with the stack's Redis: what a process of this stack is configured with."""
        return replace(base, redis_url=self.redis_url)

    def start_redis(self) -> str:
        """The configured Redis, or a private one; sets `redis_url`."""
        configured = self.environ.get(REDIS_URL_ENV)
        if configured:
            if not redis_answers(configured):
                raise PrerequisiteMissing(
                    f"{REDIS_URL_ENV}={configured} is configured but does not answer"
                )
            self.redis_url = configured
            self.echo(f"redis:  {configured} (configured by {REDIS_URL_ENV})")
            return configured
        binary = shutil.which("redis-server")
        if binary is None:
            raise PrerequisiteMissing(
                f"no Redis: set {REDIS_URL_ENV} to a running Redis, or install redis-server "
                "(e.g. `apt-get install redis-server` or `brew install redis`) so a private one "
                "can be started"
            )
        port = free_port()
        folder = self.workdir / "redis"
        folder.mkdir(parents=True, exist_ok=True)
        args = redis_server_args(binary, port, folder)
        self._spawn("redis-server", args, stdout_to_file=True)
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        self.private_redis = True
        self._wait(lambda: redis_answers(self.redis_url), "redis-server to answer")
        # Before any process of the stack looks at it: the database's binding then records a
        # private ledger, which the next stack may replace once this one is gone.
        client = redis.Redis.from_url(self.redis_url, socket_timeout=5)
        try:
            private_redis.mark(client)
        finally:
            client.close()
        self.echo(f"redis:  {self.redis_url} (private, in {folder}; removed on exit)")
        return self.redis_url

    def start_celery(self) -> None:
        self.worker_name = f"dex-dev-{os.getpid()}-{time.time_ns() % 1_000_000}@%h"
        self._spawn(
            "worker",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                self.celery_module,
                "worker",
                "-P",
                "prefork",
                "-c",
                str(self.concurrency),
                "-Q",
                ",".join(self.queues),
                "-l",
                "info",
                "-n",
                self.worker_name,
            ],
        )
        if self.beat:
            self._spawn(
                "beat",
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    self.celery_module,
                    "beat",
                    "-l",
                    "info",
                    "-s",
                    str(self.workdir / "celerybeat-schedule"),
                ],
            )
        if self.flower_port is not None:
            self._spawn(
                "flower",
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    self.celery_module,
                    "flower",
                    "--address=127.0.0.1",
                    f"--port={self.flower_port}",
                ],
            )
            auth = (
                "basic auth from FLOWER_BASIC_AUTH"
                if self.environ.get("FLOWER_BASIC_AUTH")
                else "no auth"
            )
            self.echo(f"flower: http://127.0.0.1:{self.flower_port}/ ({auth})")

    def stop(self) -> None:
        """Stop every service, newest first, then remove the temporary folder."""
        for service in reversed(self.services):
            if service.alive():
                self.echo(f"stopping {service.name} (pid {service.pid})")
            service.stop()
        self.services.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- state ---------------------------------------------------------------------------------

    @property
    def child_environ(self) -> dict[str, str]:
        env = dict(self.environ)
        if self.redis_url:
            env[REDIS_URL_ENV] = self.redis_url
        env.setdefault("PYTHONUNBUFFERED", "1")
        cwd = os.getcwd()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [cwd, env.get("PYTHONPATH", "")]))
        return env

    def respawn(self, service: Service) -> Service:
        """Start `service` again with the same command line, in its place in the stack: what
        is left of its process group (pool children of a dead worker) is ended first, so two
        generations of one worker never run side by side (`dex_celery.processes.supervise`)."""
        service.stop()
        index = self.services.index(service)
        self.services.remove(service)
        fresh = self._spawn(
            service.name,
            service.args,
            stdout_to_file=service.stdout_to_file,
            stop_signal=service.stop_signal,
        )
        self.services.remove(fresh)
        self.services.insert(index, fresh)
        return fresh

    def dead(self) -> list[Service]:
        return [s for s in self.services if not s.alive()]

    def service(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    def log_of(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # --- helpers -------------------------------------------------------------------------------

    def _spawn(
        self,
        name: str,
        args: Sequence[str],
        *,
        stdout_to_file: bool = False,
        stop_signal: signal.Signals = signal.SIGTERM,
    ) -> Service:
        to_file = self.quiet or stdout_to_file
        # Appended to: a restarted service (`respawn`) keeps the log of its earlier runs.
        out = (self.workdir / f"{name}.log").open("ab") if to_file else None
        try:
            process = popen_with_parent_death(
                list(args),
                env=self.child_environ,
                stdout=out if out is not None else None,
                stderr=subprocess.STDOUT if out is not None else None,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: Ctrl-C reaches us, we stop it  # and it goes if we are killed outright
            )
        finally:
            if out is not None:
                out.close()
        service = Service(name, args, process, stop_signal, stdout_to_file)
        self.services.append(service)
        shown = shlex.join(args)
        self.echo(f"started {name} pid {process.pid}: {shown}")
        return service

    def _wait(self, ready: Callable[[], bool], what: str, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            dead = self.dead()
            if dead:
                raise RuntimeError(
                    f"{dead[0].name} exited while waiting for {what}:\n"
                    + self.log_of(dead[0].name)[-2000:]
                )
            time.sleep(0.1)
        raise RuntimeError(f"timed out after {timeout}s waiting for {what}")

    def wait_for_worker(self, ping: Callable[[], bool], timeout: float = START_TIMEOUT) -> None:
        """Wait until `ping()` (e.g. a Celery control ping of `worker_name`) answers."""
        self._wait(ping, "the worker to answer a ping", timeout)
