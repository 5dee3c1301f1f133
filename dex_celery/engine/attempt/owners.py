"""Who runs an attempt: the owner a claim stores, and whether that process is gone.

The worker-lost fast path (docs/ledger.md) ends an attempt at once when its owner is a process
that died. With workers on many hosts a process id alone names nothing: every container or pod
numbers its processes from 1 in a PID namespace of its own, so two hosts' pool processes often
carry the same pid, and hosts may even share a host name (pods on the node's network, containers
sharing the host's UTS namespace). An owner therefore names the process by where its pid counts
as well: `<Celery node name>:<pid>:<space>.<started>`, e.g. `celery@web-1:7:9f86d081884c.35120`:

- `space`: 12 hex digits of a hash of the kernel's boot id and the PID namespace's inode, the
  same for every process that sees the same process ids, different on any other host, container
  or boot;
- `started`: the process's start time in clock ticks after boot (`/proc/<pid>/stat`), so a pid
  reused by a later process is not mistaken for the owner.

Without `/proc` (not Linux) the owner is `<node>:<pid>` and judged by host name and pid, as
before; an owner without a space is never judged dead by a process that has one (it came from
another kind of host, or from an older worker): its lease decides.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")
_SPACE = re.compile(r"[0-9a-f]{12}\.[0-9]+")


@dataclass(frozen=True)
class Owner:
    """An owner string, parsed (`parse_owner`)."""

    #: The Celery node name (`name@host`), or the bare host name outside a task.
    node: str
    pid: int | None
    #: Where `pid` counts (see the module's docstring); '' for an owner without one.
    space: str = ""
    #: Start time of the process in clock ticks after boot; None for an owner without one.
    started: int | None = None

    @property
    def host(self) -> str:
        """The host part of the node name."""
        return self.node.rpartition("@")[2]

    def is_here(self) -> bool:
        """True if `pid` names a process id of this PID namespace (for an owner without a
        space: if the host name is this host's)."""
        here = pid_space()
        if self.space or here:
            return self.space == here
        return self.host == socket.gethostname()


@functools.cache
def pid_space() -> str:
    """This process's PID namespace on this boot, as 12 hex digits; '' without `/proc`."""
    try:
        boot = (_PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(_PROC / "self/ns/pid")
    except OSError:
        return ""
    return hashlib.sha256(f"{boot} {namespace}".encode()).hexdigest()[:12]


def start_ticks(pid: int) -> int | None:
    """When process `pid` of this namespace started (ticks after boot); None if there is no
    such process or it has exited (a zombie not reaped yet has exited)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


#: This process's own pid and `<pid>[:<space>.<started>]`, read once per process (a claim must
#: not pay a file read): a forked pool process has another pid, so it reads its own.
_own: dict[int, str] = {}


def owner_string(node: str) -> str:
    """The owner of an attempt this process runs, for Celery node `node`."""
    pid = os.getpid()
    if pid not in _own:
        space = pid_space()
        started = start_ticks(pid) if space else None
        _own.clear()
        _own[pid] = str(pid) if started is None else f"{pid}:{space}.{started}"
    return f"{node}:{_own[pid]}"


def parse_owner(owner: str) -> Owner:
    """Parse an owner string (`owner_string`); pid None if there is none."""
    rest, _, last = owner.rpartition(":")
    if _SPACE.fullmatch(last):
        node, _, pid = rest.rpartition(":")
        if pid.isdigit():
            space, started = last.split(".")
            return Owner(node, int(pid), space, int(started))
    return Owner(rest, int(last) if last.isdigit() else None)


def owner_is_dead_here(owner: str) -> bool:
    """True only if `owner` names a process of this PID namespace that is gone (exited, or its
    pid now belongs to a later process). An owner of another host, container or boot is never
    judged here: the process that could tell is elsewhere, and its lease decides."""
    parsed = parse_owner(owner)
    if parsed.pid is None or not parsed.is_here():
        return False
    if parsed.space:
        return start_ticks(parsed.pid) != parsed.started
    try:
        os.kill(parsed.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
