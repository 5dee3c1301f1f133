"""RabbitMQ for the tests: a vhost of the test run on the machine's shared server, and a private
`rabbitmq-server` node on free ports that a test may stop and start again.

The shared server (127.0.0.1:5672, guest/guest) is never restarted: tests that restart a broker
start their own node (`RabbitNode`), with its own node name, ports, data and log folders, enabled
plugins file and Erlang cookie (its `HOME`), so nothing of it touches the shared one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import amqp
import pytest

from devtools.processes import free_port, wait_for
from dex_celery.processes.parent_death import popen_with_parent_death

#: The machine's shared RabbitMQ (guest/guest on loopback).
SHARED_HOST = "127.0.0.1"
SHARED_PORT = 5672
#: Debian's `rabbitmq-server` wrapper switches to the `rabbitmq` user, which cannot reach a
#: pytest tmp folder; the real script runs as the caller.
SERVER_SCRIPT = "/usr/lib/rabbitmq/bin/rabbitmq-server"


def rabbitmqctl() -> str | None:
    return shutil.which("rabbitmqctl")


def amqp_url(vhost: str, *, port: int = SHARED_PORT, host: str = SHARED_HOST) -> str:
    return f"amqp://guest:guest@{host}:{port}/{vhost}"


def _answers(port: int, host: str = SHARED_HOST, vhost: str = "/") -> bool:
    try:
        connection = amqp.Connection(
            f"{host}:{port}", userid="guest", password="guest", virtual_host=vhost,
            connect_timeout=2,
        )  # fmt: skip
        connection.connect()
        connection.close()
        return True
    except (OSError, amqp.exceptions.AMQPError):
        return False


def shared_server_missing() -> str | None:
    """Why the RabbitMQ tests cannot run here, or None."""
    if rabbitmqctl() is None:
        return "rabbitmqctl is not installed (apt-get install rabbitmq-server)"
    if not _answers(SHARED_PORT):
        return f"no RabbitMQ answers on {SHARED_HOST}:{SHARED_PORT} as guest (rabbitmq-server -detached)"
    return None


def _ctl(*args: str) -> None:
    ctl = rabbitmqctl()
    assert ctl is not None
    subprocess.run([ctl, *args], check=True, capture_output=True, timeout=120)


@contextlib.contextmanager
def test_vhost() -> Iterator[str]:
    """A vhost of its own on the shared server, guest allowed everything, deleted at the end."""
    name = f"dex-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    _ctl("add_vhost", name)
    try:
        _ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield name
    finally:
        _ctl("delete_vhost", name)


def _connect(url: str) -> amqp.Connection:
    """A py-amqp connection to `amqp://guest:guest@host:port/vhost`."""
    rest = url.split("://", 1)[1]
    credentials, location = rest.split("@", 1)
    user, password = credentials.split(":", 1)
    hostport, _, vhost = location.partition("/")
    connection = amqp.Connection(
        hostport, userid=user, password=password, virtual_host=vhost or "/", connect_timeout=5
    )
    connection.connect()
    return connection


def delete_queues(url: str, names: Iterator[str] | tuple[str, ...]) -> None:
    """Delete `names` in the vhost of `url` (absent ones are fine): each test starts empty."""
    connection = _connect(url)
    try:
        channel = connection.channel()
        for name in names:
            channel.queue_delete(name)
    finally:
        connection.close()


def queued_task_ids(url: str, queue: str) -> list[str]:
    """Task ids of the messages ready in `queue`: taken unacknowledged and given back when the
    channel closes (RabbitMQ requeues what a closed channel held), so the queue is unchanged."""
    connection = _connect(url)
    ids = []
    try:
        channel = connection.channel()
        while True:
            message: Any = channel.basic_get(queue, no_ack=False)
            if message is None:
                break
            ids.append(str(message.headers["id"]))
    except amqp.exceptions.NotFound:
        pass  # no such queue (yet): nothing queued
    finally:
        connection.close()
    return ids


REDIS = "redis"
RABBITMQ = "rabbitmq"
#: Runs a test once with the Redis broker (as before) and once with RabbitMQ as the broker and
#: Redis as the ledger (the `broker_kind` fixture of tests/conftest.py).
ON_BOTH_BROKERS = pytest.mark.parametrize("broker_kind", [REDIS, RABBITMQ], indirect=True)


@dataclass
class RabbitNode:
    """A private RabbitMQ node in `directory`, on free ports, that a test may stop and start.

    Its own node name, AMQP and distribution ports, data (`RABBITMQ_MNESIA_BASE`), logs, enabled
    plugins file (none) and Erlang cookie (`HOME`): the machine's shared node is never touched.
    `channel_tick_interval` is one second, so a `consumer_timeout` set by a test is enforced
    within a second of passing (RabbitMQ checks it on each channel tick, a minute by default).
    """

    directory: Path
    port: int = field(default_factory=free_port)
    dist_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"dex-test-{self.port}@localhost"

    def url(self, port: int | None = None) -> str:
        return amqp_url("", port=port or self.port)

    @property
    def environ(self) -> dict[str, str]:
        d = self.directory
        return {
            **os.environ,
            "HOME": str(d),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(d / "node.conf"),
            "RABBITMQ_PID_FILE": str(d / "node.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-rabbit channel_tick_interval 1000",
        }

    def start(self, *, timeout: float = 180) -> RabbitNode:
        if not os.path.exists(SERVER_SCRIPT):
            raise RuntimeError(f"{SERVER_SCRIPT} is not installed")
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "enabled_plugins").write_text("[].\n")
        (self.directory / "node.conf").write_text(f"listeners.tcp.1 = 127.0.0.1:{self.port}\n")
        with (self.directory / "server.log").open("ab") as out:
            self.process = popen_with_parent_death(
                [SERVER_SCRIPT], env=self.environ, cwd=self.directory, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        wait_for(
            lambda: self.died() or _answers(self.port),
            timeout=timeout,
            what=f"the private RabbitMQ node {self.name} to accept connections",
        )
        if self.died():
            raise RuntimeError(f"rabbitmq-server exited at start:\n{self.log()[-3000:]}")
        return self

    def died(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def stop(self, *, timeout: float = 60) -> None:
        """RabbitMQ's own shutdown (SIGTERM to the node): connections close, durable queues and
        their messages stay on disk. SIGKILL of the group after `timeout`."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout)
        self.kill()

    def kill(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def eval(self, expression: str) -> str:
        """`rabbitmqctl eval` on this node (its own cookie), e.g. to change `consumer_timeout`."""
        ctl = "/usr/lib/rabbitmq/bin/rabbitmqctl"
        done = subprocess.run(
            [ctl, "-n", self.name, "eval", expression],
            env=self.environ, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        return done.stdout.strip()

    def log(self) -> str:
        path = self.directory / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


def private_node_missing() -> str | None:
    """Why a private node cannot be started here, or None."""
    if not os.path.exists(SERVER_SCRIPT):
        return f"{SERVER_SCRIPT} is not installed (apt-get install rabbitmq-server)"
    return None
