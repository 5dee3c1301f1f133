"""A TCP proxy in front of the test PostgreSQL that a test can cut, for database outages.

The deployment (workers, sweeper, requester) is pointed at the proxy's port; the test then
- `cut()`s it: existing connections are dropped and the listening socket is closed, so new
  connections are refused by the kernel (as a stopped server's port refuses them);
- `restore()`s it on the same port;
- `cut_at_commit(forward=...)`: the next COMMIT any client sends either reaches the server (which
  commits) while its answer never comes back, or is dropped; the connection is then closed.
  Either way the client cannot tell whether its transaction was applied.
- `hold_at_commit()`: the next COMMIT is neither passed on nor answered, and the connection stays
  open until its client goes away (then the server rolls the transaction back): a client that
  hangs in its commit, to be killed there.

Real sockets and a real server: nothing of the driver or SQLAlchemy is patched.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field

from dex_celery.processes.localstack import free_port

#: How the COMMIT of psycopg's extended protocol appears on the wire (the Parse message's query).
COMMIT = b"COMMIT\x00"


@dataclass(eq=False)
class _Pair:
    client: socket.socket
    server: socket.socket
    #: Nothing more goes back to the client (its COMMIT's answer is being swallowed).
    muted: bool = False

    def close(self) -> None:
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


@dataclass(eq=False)
class CuttableProxy:
    target_port: int
    target_host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    #: None: pass COMMITs; at the next COMMIT, "forward" or "drop" it and cut the connection,
    #: or "hold" it (see the module's docstring).
    _commit_trap: str | None = None
    #: How many COMMITs the trap caught (a test waits for 1).
    trapped: int = 0
    #: How many connections the proxy accepted and passed on.
    accepted: int = 0
    _pairs: set[_Pair] = field(default_factory=set)
    _listener: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> CuttableProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def cut(self) -> None:
        """Refuse new connections and drop every open one."""
        with self._lock:
            listener, self._listener = self._listener, None
            pairs, self._pairs = set(self._pairs), set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
            with contextlib.suppress(OSError):
                listener.close()
        for pair in pairs:
            pair.close()

    def restore(self) -> None:
        if self._listener is None:
            self.start()

    def cut_at_commit(self, *, forward: bool) -> None:
        self._commit_trap = "forward" if forward else "drop"

    def hold_at_commit(self) -> None:
        self._commit_trap = "hold"

    def stop(self) -> None:
        self.cut()

    # --- plumbing ------------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut: the listener is closed
            try:
                server = socket.create_connection((self.target_host, self.target_port))
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server)
            with self._lock:
                if self._listener is not listener:
                    pair.close()
                    return
                self._pairs.add(pair)
                self.accepted += 1
            threading.Thread(target=self._upstream, args=(pair,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(pair,), daemon=True).start()

    def _upstream(self, pair: _Pair) -> None:
        """Client to server, watching for the COMMIT the trap waits for."""
        while True:
            try:
                data = pair.client.recv(65536)
            except OSError:
                break
            if not data:
                break
            trap = self._commit_trap
            if trap is not None and COMMIT in data:
                self._commit_trap = None
                pair.muted = True
                self.trapped += 1
                if trap == "hold":
                    self._swallow(pair)
                    break
                if trap == "forward":
                    with contextlib.suppress(OSError):
                        pair.server.sendall(data)
                    time.sleep(0.3)  # the server commits; its answer is not passed on
                break
            try:
                pair.server.sendall(data)
            except OSError:
                break
        self._drop(pair)

    def _swallow(self, pair: _Pair) -> None:
        """Read and drop what the client sends until it goes away."""
        while True:
            try:
                if not pair.client.recv(65536):
                    return
            except OSError:
                return

    def _downstream(self, pair: _Pair) -> None:
        while True:
            try:
                data = pair.server.recv(65536)
            except OSError:
                break
            if not data or pair.muted:
                break
            try:
                pair.client.sendall(data)
            except OSError:
                break
        if not pair.muted:
            self._drop(pair)

    def _drop(self, pair: _Pair) -> None:
        with self._lock:
            self._pairs.discard(pair)
        pair.close()
