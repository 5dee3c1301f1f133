"""The owner of an attempt names its process by where its pid counts (engine/attempt/owners.py), so the
worker-lost fast path (docs/ledger.md) judges only processes of its own PID namespace: never a
process of another host, container or boot with the same pid or host name, never a later process
that reused the pid."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from devtools.processes import ROOT, as_host_args, can_run_as_host
from dex_celery.engine.attempt.owners import (
    Owner,
    owner_is_dead_here,
    owner_string,
    parse_owner,
    pid_space,
    start_ticks,
)

needs_proc = pytest.mark.skipif(not pid_space(), reason="no /proc here (not Linux)")


def _dead_pid() -> int:
    """The pid of a child that exited and was reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@needs_proc
def test_an_owner_string_names_node_pid_and_where_the_pid_counts() -> None:
    owner = parse_owner(owner_string("celery@web-1"))
    assert owner == Owner("celery@web-1", os.getpid(), pid_space(), start_ticks(os.getpid()))
    assert owner.host == "web-1" and owner.is_here()
    assert not owner_is_dead_here(owner_string("celery@web-1"))


@needs_proc
def test_a_process_of_this_namespace_that_exited_is_dead() -> None:
    pid = _dead_pid()
    assert owner_is_dead_here(f"celery@h:{pid}:{pid_space()}.12345")


@needs_proc
def test_a_pid_reused_by_a_later_process_is_the_owner_dead() -> None:
    """The pid is alive, but started at another time: not the process that claimed."""
    with subprocess.Popen(["sleep", "30"]) as child:
        try:
            started = start_ticks(child.pid)
            assert started is not None
            assert not owner_is_dead_here(f"n@h:{child.pid}:{pid_space()}.{started}")
            assert owner_is_dead_here(f"n@h:{child.pid}:{pid_space()}.{started - 1}")
        finally:
            child.kill()


@needs_proc
def test_an_exited_child_not_reaped_yet_is_dead() -> None:
    with subprocess.Popen(["true"]) as child:
        for _ in range(200):
            if start_ticks(child.pid) is None:
                break
            subprocess.run(["sleep", "0.01"], check=True)
        assert start_ticks(child.pid) is None  # a zombie until `wait`
        assert owner_is_dead_here(f"n@h:{child.pid}:{pid_space()}.1")


@needs_proc
@pytest.mark.parametrize("host", [socket.gethostname(), "elsewhere"])
def test_an_owner_of_another_pid_namespace_is_never_judged_here(host: str) -> None:
    """Same pid (one that exited here), same or other host name: another namespace's."""
    pid = _dead_pid()
    assert not owner_is_dead_here(f"celery@{host}:{pid}:0123456789ab.42")


@needs_proc
def test_an_owner_without_a_namespace_is_never_judged_by_a_process_that_has_one() -> None:
    """An older worker's `<node>:<pid>`, or a host without /proc: its lease decides."""
    pid = _dead_pid()
    owner = f"celery@{socket.gethostname()}:{pid}"
    assert parse_owner(owner) == Owner(f"celery@{socket.gethostname()}", pid)
    assert not owner_is_dead_here(owner)


def test_malformed_owners_are_never_dead() -> None:
    for owner in ("", "celery@h", "celery@h:", "celery@h:x:0123456789ab.1", ":"):
        assert not owner_is_dead_here(owner)
    assert parse_owner("celery@h:x").pid is None


@needs_proc
def test_a_real_process_of_another_host_is_not_judged_here() -> None:
    """An owner made inside a PID and UTS namespace of its own (another host, as the crash test
    runs one) with this host's name: its pid counts elsewhere."""
    why = can_run_as_host()
    if why is not None:
        pytest.skip(why)
    code = "from dex_celery.engine.attempt.owners import owner_string as o; print(o('celery@x'))"
    done = subprocess.run(
        [*as_host_args(socket.gethostname()), sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=True,
    )  # fmt: skip
    other = parse_owner(done.stdout.strip())
    assert other.pid is not None and other.space and other.space != pid_space()
    assert not other.is_here()
    assert not owner_is_dead_here(done.stdout.strip())  # the process exited, but elsewhere
