"""Which process sent which Redis command: `MONITOR` on a private redis-server, each entry's
client address mapped to the process holding that socket (Linux `/proc`).

A command seen by `MONITOR` outside a script is one a client sent (a round trip, or one command
of a pipeline); commands a Lua script runs are marked `lua` and not counted. Used by
`bench/cpu_budget.py` (commands per call per process) and by the smoke test that fails when a
change adds a round trip to the pool's hot path (`tests/integration/bench/test_round_trip_budget.py`).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis

#: A worker's processes by role: the main process, its pool processes, its outcome recorder.
MAIN, POOL, RECORDER = "worker main", "pool", "recorder"
#: The recorder's process name (`engine/attempt/outcome_writer.RECORDER_NAME`).
RECORDER_COMM = "dex-recorder"

_SOCKET = re.compile(r"socket:\[(\d+)\]")


@dataclass
class Sent:
    """Commands seen by `MONITOR`, by the client's `host:port`."""

    by_client: dict[str, Counter[str]] = field(default_factory=dict)

    def add(self, client: str, command: str) -> None:
        self.by_client.setdefault(client, Counter())[command] += 1


@contextlib.contextmanager
def monitored(url: str) -> Iterator[Sent]:
    """Count every command clients send to the Redis at `url` while the block runs."""
    sent = Sent()
    stop = threading.Event()
    ready = threading.Event()

    def listen() -> None:
        client = redis.Redis.from_url(url)
        with client.monitor() as m:
            ready.set()
            for entry in m.listen():
                if stop.is_set():
                    return
                if entry.get("client_type") == "lua":
                    continue
                command = str(entry.get("command", "")).split(" ")[0].lower()
                if command in ("monitor", "echo"):
                    continue
                sent.add(f"{entry.get('client_address')}:{entry.get('client_port')}", command)

    thread = threading.Thread(target=listen, name="bench-monitor", daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield sent
    finally:
        stop.set()
        # Wake the listener with a command of its own (not counted: `echo`).
        redis.Redis.from_url(url).echo("stop")
        thread.join(timeout=10)


def roles(worker_pid: int) -> dict[int, str]:
    """The worker's processes by role (`MAIN`, `POOL`, `RECORDER`)."""
    out = {worker_pid: MAIN}
    for task in Path(f"/proc/{worker_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            comm = Path(f"/proc/{child}/comm").read_text().strip()
            out[int(child)] = RECORDER if comm == RECORDER_COMM else POOL
    return out


def _inodes(pid: int) -> set[str]:
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                match = _SOCKET.fullmatch(str(fd.readlink()))
                if match:
                    found.add(match.group(1))
    return found


def _local_ports() -> dict[str, int]:
    """Socket inode -> its local TCP port, for every TCP socket of this host."""
    ports: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                ports[parts[9]] = int(parts[1].rpartition(":")[2], 16)
    return ports


def owners(pids: Mapping[int, str]) -> dict[int, str]:
    """Local TCP port -> the role of the process (of `pids`: pid -> role) holding it. Call it
    while the connections are open (at the end of the monitored run)."""
    ports = _local_ports()
    out: dict[int, str] = {}
    for pid, role in pids.items():
        for inode in _inodes(pid):
            if inode in ports:
                out[ports[inode]] = role
    return out


def by_role(sent: Sent, port_roles: Mapping[int, str]) -> dict[str, Counter[str]]:
    """The commands of `sent` summed by the role of the process that sent them; a client no
    process of `port_roles` holds (closed meanwhile, or another process) counts as `other`."""
    out: dict[str, Counter[str]] = {}
    for client, commands in sent.by_client.items():
        port = client.rpartition(":")[2]
        role = port_roles.get(int(port), "other") if port.isdigit() else "other"
        out.setdefault(role, Counter()).update(commands)
    return out
