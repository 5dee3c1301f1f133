"""RabbitMQ for the tests: a vhost of the test run on the machine's shared server, and a private
`rabbitmq-server` node on free ports that a test may SIGKILL and start again.

The shared server (127.0.0.1:5672, guest/guest) is never restarted: tests that restart a broker
start their own node (`RabbitNode`), with its own node name, ports, data and log folders, enabled
plugins file and Erlang cookie (its `HOME`), so nothing of it touches the shared one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import amqp
import pytest

#: The machine's shared RabbitMQ (PREAMBLE: guest/guest on loopback).
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
#: Redis as the ledger (the `broker` fixture of tests/conftest.py).
ON_BOTH_BROKERS = pytest.mark.parametrize("broker", [REDIS, RABBITMQ], indirect=True)
