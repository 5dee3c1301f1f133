"""The one after-fork hook (`dex_celery.forks`): a forked child starts without its parent's
per-process state, and the parent keeps its own."""

from __future__ import annotations

import contextlib
import gc
import os
import weakref
from pathlib import Path

from celery import Celery

from dex_celery import Dex, Settings, forks
from dex_celery.store.sql_engine import EngineHandle
from tests.support.faults.forks import Holder, in_child


def test_a_registered_reset_runs_in_the_child_only() -> None:
    holder = Holder()
    assert in_child(lambda: holder.state is None) == 0
    assert holder.state is not None


def test_a_dropped_holder_is_not_kept_alive_by_its_reset() -> None:
    holder = Holder()
    before = len(forks._resets)
    del holder
    gc.collect()
    assert in_child(lambda: True) == 0
    assert len(forks._resets) <= before


def test_the_engine_and_the_runtime_are_made_anew_in_a_child(tmp_path: Path) -> None:
    handle = EngineHandle(f"sqlite:///{tmp_path / 'a.db'}")
    parent_engine = handle.get()
    dex = Dex(Celery("forks"), Settings(database_url=f"sqlite:///{tmp_path / 'b.db'}"))
    runtime = dex.runtime
    assert dex.runtime is runtime  # built once in this process
    assert dex.dispatcher is dex.dispatcher

    def child_has_fresh_state() -> bool:
        return (
            handle._engine is None
            and handle.get() is not parent_engine
            and dex._runtime is None
            and dex.runtime is not runtime
        )

    assert in_child(child_has_fresh_state) == 0
    assert handle.get() is parent_engine and dex.runtime is runtime


def test_a_child_that_closes_every_inherited_descriptor_keeps_working(dex: Dex) -> None:
    """Celery's embedded beat (`worker -B`) closes every descriptor it inherited, then opens
    its own, which take the same numbers: the parent's connections must never be collected in
    the child, or they close those numbers a second time under the child's own SQLite file and
    Redis sockets (a beat that failed every sweep with "disk I/O error")."""
    dex.redis.ping()
    dex.store.list_calls(limit=1)
    database = dex.settings.database_url.removeprefix("sqlite:///")
    inherited = [  # the runtime's sockets and SQLite files
        fd
        for fd, target in _open_descriptors().items()
        if target.startswith("socket:") or target.startswith(database)
    ]
    assert inherited
    parent = weakref.ref(dex.runtime)

    def keeps_working() -> bool:
        for fd in inherited:  # what the embedded beat does at start (it spares only stdio, logs)
            with contextlib.suppress(OSError):  # SQLite's: the fork's reset closed them already
                os.close(fd)
        for _ in range(5):
            dex.redis.ping()
            dex.store.list_calls(limit=1)
            gc.collect()  # whatever the child dropped is collected now, not at some later time
        return parent() is not None  # kept, so its sockets never close a number again

    assert in_child(keeps_working) == 0
    assert dex.redis.ping()


def _open_descriptors() -> dict[int, str]:
    """This process's open descriptors and what each is open on."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return found
