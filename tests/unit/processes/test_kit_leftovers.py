"""The kit's cleanup of what a SIGKILLed pytest left (`dex_celery/testing/leftovers.py`): only
folders whose owner is dead, only processes still running with their noted start time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dex_celery.testing import leftovers
from dex_celery.testing.leftovers import start_time, sweep_stale


def _folder(root: Path, name: str, owner: int, started: str, processes: str = "") -> Path:
    folder = root / f"{leftovers.FOLDER_PREFIX}{name}"
    folder.mkdir()
    (folder / leftovers.OWNER_FILE).write_text(f"{owner} {started}\n")
    if processes:
        (folder / leftovers.PROCESSES_FILE).write_text(processes)
    return folder


def _sleeper(*, group: bool) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=group
    )


def test_only_dead_owners_folders_are_cleaned_and_only_their_live_processes_killed(
    tmp_path: Path,
) -> None:
    dead_owner = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_started = start_time(dead_owner.pid) or ""
    dead_owner.wait()
    lone, leader = _sleeper(group=False), _sleeper(group=True)
    other = _sleeper(group=False)
    try:
        noted = (
            f"{lone.pid} {start_time(lone.pid)} 0\n"
            f"{leader.pid} {start_time(leader.pid)} 1\n"
            f"{other.pid} 1 0\n"  # the pid now names another process: not the one noted
        )
        stale = _folder(tmp_path, "stale", dead_owner.pid, dead_started, noted)
        parent = os.getppid()
        running = _folder(tmp_path, "running", parent, start_time(parent) or "", noted)
        unowned = tmp_path / f"{leftovers.FOLDER_PREFIX}unowned"
        unowned.mkdir()

        assert sweep_stale(tmp_path) == [stale]
        assert lone.wait(timeout=10) == -9 and leader.wait(timeout=10) == -9
        assert other.poll() is None
        assert not stale.exists() and running.is_dir() and unowned.is_dir()
    finally:
        for process in (lone, leader, other):
            process.kill()
            process.wait(timeout=10)


def test_a_reused_owner_pid_is_a_dead_owner(tmp_path: Path) -> None:
    """The owner's pid runs again, but as a process started at another time."""
    me = os.getpid()
    folder = _folder(tmp_path, "reused", os.getppid(), "1")
    assert sweep_stale(tmp_path) == [folder]
    assert _folder(tmp_path, "mine", me, start_time(me) or "").is_dir()
    assert sweep_stale(tmp_path) == []
