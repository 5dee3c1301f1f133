"""What a pytest run of the kit leaves if it is stopped, and how it is found and cleaned.

Ctrl-C, SIGTERM (a CI `timeout`, a cancelled job) and SIGHUP (a closed terminal) all unwind the
run the same way: the plugin turns the two signals into the `KeyboardInterrupt` of Ctrl-C, so
every fixture's teardown runs (worker and beat process groups SIGKILLed, the kit's redis-server
killed) and the run's `dex-testing-*` folder is removed.

SIGKILL of pytest runs nothing. So each run writes, in its folder, who owns it (`owner`: the
pytest pid and its start time) and every process it starts (`processes`: pid, start time, and
whether it leads its own process group). The next run of the kit, at its start, looks at every
`dex-testing-*` folder of the same user in the temporary directory whose owner is dead (no such
pid, or a pid reused by a process that started at another time): it SIGKILLs each recorded
process that still runs with its recorded start time (the whole group for a worker or beat, so
pool children go too) and removes the folder. A folder whose owner still runs (another pytest
at work) is never touched, nor one without an `owner` file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

#: Prefix of a run's folder in the temporary directory.
FOLDER_PREFIX = "dex-testing-"
OWNER_FILE = "owner"
PROCESSES_FILE = "processes"

_current: Path | None = None


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (`/proc/<pid>/stat`, field 22); None
    when there is no such process (or no /proc: then nothing is ever killed by mistake)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _alive(pid: int, started: str) -> bool:
    """Whether `pid` is still the process noted. Without a start time (no /proc) only whether
    the pid exists: an owner is then never judged dead while some process has its pid."""
    if started:
        return start_time(pid) == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def own(folder: Path) -> None:
    """`folder` belongs to this process from now on; the processes it starts are noted in it."""
    global _current
    (folder / OWNER_FILE).write_text(f"{os.getpid()} {start_time(os.getpid()) or ''}\n")
    _current = folder


def release() -> None:
    """The run cleaned up after itself: nothing more is noted."""
    global _current
    _current = None


def note_started(pid: int, *, group: bool) -> None:
    """A process the kit started (`group`: it leads its own process group); a no-op outside a
    kit run (the project's own tests use the same process classes)."""
    if _current is None:
        return
    with contextlib.suppress(OSError), (_current / PROCESSES_FILE).open("a") as f:
        f.write(f"{pid} {start_time(pid) or ''} {int(group)}\n")


def sweep_stale(directory: Path | None = None) -> list[Path]:
    """Clean the folders (and their processes) of kit runs whose pytest died; returns them."""
    root = directory or Path(tempfile.gettempdir())
    cleaned = []
    for folder in sorted(root.glob(FOLDER_PREFIX + "*")):
        with contextlib.suppress(OSError):
            if folder.is_dir() and folder.stat().st_uid == os.getuid() and _orphaned(folder):
                _kill_recorded(folder)
                shutil.rmtree(folder, ignore_errors=True)
                cleaned.append(folder)
    return cleaned


def _orphaned(folder: Path) -> bool:
    try:
        pid_text, _, started = (folder / OWNER_FILE).read_text().strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return False  # not a kit run's folder we can judge: leave it
    return pid != os.getpid() and not _alive(pid, started)


def _kill_recorded(folder: Path) -> None:
    try:
        lines = (folder / PROCESSES_FILE).read_text().splitlines()
    except OSError:
        return
    for line in lines:
        try:
            pid_text, started, group = line.split(" ")
            pid = int(pid_text)
        except ValueError:
            continue
        if not started or not _alive(pid, started):
            continue  # gone, another process now, or not identifiable: never killed
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group == "1":
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
