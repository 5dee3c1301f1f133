"""Per-thread CPU-time profiles inside a benchmark worker, taken on request (`bench/cpu_profile.py`).

Armed only when `BENCH_PROFILE_DIR` names a folder (`bench/dex_app.py` arms it at import): every
thread of the worker's main process and of each process it forks (pool processes, the outcome
recorder) runs under a `cProfile.Profile` timed by `time.thread_time`, so a function's figure is
the CPU its own thread spent in it, not wall time a loaded machine or a wait stretched. When the
file `snap-<n>` appears in the folder, each process writes `snap<n>-<pid>-<thread>.prof` (the
profile so far) and then `snap<n>-<pid>.done`; the driver subtracts two snapshots. A thread
made from a `Thread` subclass that overrides `run` is not profiled. Off, nothing here runs.
"""

from __future__ import annotations

import cProfile
import json
import marshal
import os
import threading
import time
from pathlib import Path
from typing import Any

PROFILE_DIR_ENV = "BENCH_PROFILE_DIR"
#: The thread that watches for snapshot requests: never profiled, never counted.
WATCHER = "bench-profile-watcher"

_profiles: dict[int, tuple[str, cProfile.Profile]] = {}
_thread_run = threading.Thread.run


def _profiled_run(self: threading.Thread) -> None:
    if self.name == WATCHER:
        _thread_run(self)
        return
    profile = cProfile.Profile(time.thread_time)
    _profiles[threading.get_ident()] = (self.name, profile)
    profile.enable()
    try:
        _thread_run(self)
    finally:
        profile.disable()


def _profile_this_thread(name: str) -> None:
    profile = cProfile.Profile(time.thread_time)
    _profiles[threading.get_ident()] = (name, profile)
    profile.enable()


def _write(folder: Path, n: int) -> None:
    pid = os.getpid()
    for ident, (name, profile) in list(_profiles.items()):
        profile.snapshot_stats()
        stats: Any = profile.stats  # type: ignore[attr-defined]
        with open(folder / f"snap{n}-{pid}-{name}-{ident}.prof", "wb") as out:
            marshal.dump(stats, out)
    comm = Path("/proc/self/comm").read_text().strip()
    (folder / f"snap{n}-{pid}.done").write_text(json.dumps({"pid": pid, "comm": comm}))


def _watch(folder: Path) -> None:
    n = 0
    while True:
        if (folder / f"snap-{n}").exists():
            _write(folder, n)
            n += 1
        time.sleep(0.02)


def _start_watcher(folder: Path) -> None:
    threading.Thread(target=_watch, args=(folder,), name=WATCHER, daemon=True).start()


def _after_fork(folder: Path) -> None:
    """In a forked child only the forking thread lives on: its profile starts afresh."""
    _profiles.clear()
    _profile_this_thread("ChildMain")
    _start_watcher(folder)


def arm_from_env() -> None:
    raw = os.environ.get(PROFILE_DIR_ENV)
    if not raw:
        return
    folder = Path(raw)
    _start_watcher(folder)  # started before the patch: the watcher is never profiled
    threading.Thread.run = _profiled_run  # type: ignore[method-assign]
    _profile_this_thread("MainThread")
    os.register_at_fork(after_in_child=lambda: _after_fork(folder))
