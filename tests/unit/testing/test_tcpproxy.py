"""The test kit's TCP proxy (`dex_celery.testing.tcpproxy`) forwards in a process that holds
many descriptors, as a long test run does."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import threading
from collections.abc import Iterator

import pytest

from dex_celery.testing.tcpproxy import TcpProxy

#: More than FD_SETSIZE: `select.select` refuses any socket numbered above it.
MANY = 1100


@contextlib.contextmanager
def _echo_server() -> Iterator[int]:
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):  # the proxy closes with a reset
                while data := conn.recv(4096):
                    conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def test_the_proxy_forwards_sockets_numbered_above_fd_setsize() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < MANY + 100:
        pytest.skip(f"the open-files limit ({soft}) is below {MANY + 100}")
    # Opened until the newest is numbered above MANY: a process that already holds (and freed)
    # descriptors has holes below, which the kernel fills first.
    held = [os.open(os.devnull, os.O_RDONLY)]
    while held[-1] < MANY:
        held.append(os.open(os.devnull, os.O_RDONLY))
    try:
        with (
            _echo_server() as port,
            TcpProxy(port) as proxy,
            socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client,
        ):
            assert client.fileno() > 1024
            client.sendall(b"ping")
            assert client.recv(4) == b"ping"
    finally:
        for fd in held:
            os.close(fd)
