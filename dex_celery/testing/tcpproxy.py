"""A TCP proxy on loopback that a test can cut: a network blip between a process and a server.

`TcpProxy(port)` listens on a free loopback port and forwards every connection to
`127.0.0.1:<port>`. `cut()` resets every open connection (RST, as a broken link or a restarted
middlebox shows it) and refuses new ones until `restore()`; `pause()` instead keeps the
connections but forwards nothing (packets dropped, then retransmitted) until `restore()`.
`blip(seconds)` cuts and restores after `seconds`, without sleeping in the test's thread.
`cut(subscribers_first=True)` resets the links that sent SUBSCRIBE / PSUBSCRIBE (Kombu's fanout
and pidbox links) before the others: the order in which a broker-link cut kills a worker.

Threads, not asyncio: the test process may be running an event loop of its own.
"""

from __future__ import annotations

import contextlib
import re
import selectors
import socket
import struct
import threading
import time
from types import TracebackType
from typing import Self, cast

from dex_celery.processes.localstack import free_port

_BUFFER = 65536
#: A SUBSCRIBE or PSUBSCRIBE command in a client's stream (RESP: `$9\r\nSUBSCRIBE\r\n`).
_SUBSCRIBE = re.compile(rb"\r\nP?SUBSCRIBE\r\n", re.IGNORECASE)


class TcpProxy:
    """Forwards `127.0.0.1:<listen port>` to `127.0.0.1:<target port>`; can be cut and paused."""

    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener = self._listen()
        self._open = threading.Event()
        self._open.set()
        self._flowing = threading.Event()
        self._flowing.set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        #: Client sockets that subscribed to channels.
        self._subscribers: set[socket.socket] = set()
        #: Connections accepted and forwarded so far (a reconnecting client shows as new ones).
        self.accepted = 0
        #: Connections reset by `cut`, and connections refused while cut (for the test's report).
        self.resets = 0
        self.refused = 0
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)

    def _listen(self) -> socket.socket:
        listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        listener.settimeout(0.1)
        return listener

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- faults --------------------------------------------------------------------------------

    def cut(self, *, subscribers_first: bool = False) -> int:
        """Reset every connection and refuse new ones until `restore` (the listening socket is
        closed, so a connect is refused at once, as with a server that went away); how many
        were reset."""
        with self._lock:
            if self._open.is_set():
                self._open.clear()
                self._listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
            subscribers, self._subscribers = self._subscribers, set()
        if subscribers_first:
            pairs.sort(key=lambda pair: pair[0] not in subscribers)
        for pair in pairs:
            for sock in pair:
                _reset(sock)
            self.resets += 1
        return len(pairs)

    def pause(self) -> None:
        """Keep the connections, forward nothing (both ways) until `restore`."""
        self._flowing.clear()

    def restore(self) -> None:
        with self._lock:
            if not self._open.is_set() and not self._stop.is_set():
                self._listener = self._listen()
                self._open.set()
        self._flowing.set()

    def restored(self) -> bool:
        """`restore`, or False while the port cannot be listened on again yet (a poll's
        condition: `wait_for(proxy.restored, ...)`)."""
        try:
            self.restore()
        except OSError:
            return False
        return True

    def blip(self, seconds: float, *, drop: bool = False) -> threading.Thread:
        """`cut` (or, with `drop`, `pause`) now and `restore` after `seconds` (on a thread of
        its own; join it to wait)."""
        if drop:
            self.pause()
        else:
            self.cut()

        def later() -> None:
            time.sleep(seconds)
            self.restore()

        thread = threading.Thread(target=later, name="tcp-proxy-blip", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.close()

    def close(self) -> None:
        self.restore()
        self._stop.set()
        self.cut()
        self._thread.join(timeout=5)

    # --- forwarding ----------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stop.is_set():
            if not self._open.wait(0.1):
                continue
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by `cut`: wait for `restore`
                continue
            if not self._open.is_set():
                self.refused += 1
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._pairs.append((client, server))
                self.accepted += 1
            threading.Thread(
                target=self._pump, args=(client, server), name="tcp-proxy-pipe", daemon=True
            ).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        # A selector, not `select.select`: in a long test run the process holds more than
        # FD_SETSIZE (1024) descriptors, and `select` refuses a socket numbered above it.
        selector = selectors.DefaultSelector()
        try:
            for sock in peers:
                selector.register(sock, selectors.EVENT_READ)
            while not self._stop.is_set():
                if not self._flowing.wait(0.1):
                    continue
                for key, _ in selector.select(0.1):
                    sock = cast(socket.socket, key.fileobj)
                    if not self._flowing.is_set():
                        break
                    data = sock.recv(_BUFFER)
                    if not data:
                        return
                    if sock is client and _SUBSCRIBE.search(data):
                        with self._lock:
                            self._subscribers.add(client)
                    peers[sock].sendall(data)
        except (OSError, ValueError):  # reset by `cut`, or closed by a peer
            return
        finally:
            selector.close()
            for sock in (client, server):
                _reset(sock)
            with self._lock:
                if (client, server) in self._pairs:
                    self._pairs.remove((client, server))
                self._subscribers.discard(client)


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), as a broken link shows to the peer."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
