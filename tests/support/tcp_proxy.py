"""A TCP proxy a test can cut: the link between a worker and its Redis, made breakable.

`cut()` drops every established connection with a reset (as a router losing its state or a
firewall rule would) and closes the listening socket, so new connections are refused;
`restore()` listens again on the same port. Pure threads on loopback: no privileges needed.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
from dataclasses import dataclass, field

from dex_celery.processes.localstack import free_port

#: Bytes read per `recv` in a pump thread.
CHUNK = 65536
#: A SUBSCRIBE or PSUBSCRIBE command in the client's stream (RESP: `$9\r\nSUBSCRIBE\r\n`).
SUBSCRIBE = re.compile(rb"\r\nP?SUBSCRIBE\r\n", re.IGNORECASE)


def _reset(sock: socket.socket) -> None:
    """Close `sock` with an RST, not a FIN: the peer sees `ECONNRESET` at once."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # Wakes the pump thread blocked in `recv` (a bare close would not, and the socket would
    # stay open until that `recv` returned); sends nothing by itself.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


@dataclass
class TcpProxy:
    """Listens on 127.0.0.1:`port` and forwards each connection to `target_port`."""

    target_port: int
    port: int = field(default_factory=free_port)
    #: Connections accepted so far (a reconnecting client shows up as new ones).
    accepted: int = 0
    _listener: socket.socket | None = None
    _pairs: list[tuple[socket.socket, socket.socket]] = field(default_factory=list)
    #: Client sockets that sent SUBSCRIBE / PSUBSCRIBE (Kombu's fanout and pidbox links).
    _subscribers: set[socket.socket] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> TcpProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def cut(self, *, subscribers_first: bool = False) -> int:
        """Refuse new connections and reset every open one; how many were reset.

        `subscribers_first`: reset the links that subscribed to channels before the others, so
        the client notices the loss on a pub/sub link while its `BRPOP` is still pending (one
        order a real cut produces by chance).
        """
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
            subscribers = set(self._subscribers)
            self._subscribers.clear()
        if subscribers_first:
            pairs.sort(key=lambda pair: pair[0] not in subscribers)
        for client, upstream in pairs:
            _reset(client)
            _reset(upstream)
        return len(pairs)

    def restore(self) -> None:
        """Accept connections again, on the same port."""
        if self._listener is None:
            self.start()

    def stop(self) -> None:
        self.cut()

    # --- threads -------------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut: the listener was closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                if self._listener is not listener:  # cut while connecting
                    _reset(client)
                    _reset(upstream)
                    return
                self._pairs.append((client, upstream))
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        try:
            while True:
                data = source.recv(CHUNK)
                if not data:
                    break
                if from_client and SUBSCRIBE.search(data):
                    with self._lock:
                        self._subscribers.add(source)
                sink.sendall(data)
        except OSError:
            pass
        # Either side ended: end both (Redis has no use for half-closed links).
        with self._lock:
            pair = next((p for p in self._pairs if source in p), None)
            if pair is not None:
                self._pairs.remove(pair)
                self._subscribers.discard(pair[0])
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.close()
