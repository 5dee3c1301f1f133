"""`dex-celery dev` started as a person starts it, and the processes it says it started."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.processes import ROOT, wait_for
from dex_celery.processes.parent_death import popen_with_parent_death

SCRIPT = Path(sys.executable).parent / "dex-celery"


STARTED = re.compile(r"^\s*started (\S+) pid (\d+): ", re.MULTILINE)


def stack_environment(tmp_path: Path) -> dict[str, str]:
    """The caller's environment without a configured Redis (so a private one is started), with
    a database and key prefix of this test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEX_")}
    env.update(
        DEX_DATABASE_URL=f"sqlite:///{tmp_path / 'dex.db'}",
        DEX_KEY_PREFIX=f"t{uuid.uuid4().hex[:8]}",
        PYTHONUNBUFFERED="1",
    )
    return env


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped has stopped running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def group_alive(pgid: int) -> list[int]:
    """Pids of running processes in process group `pgid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(stat.parent.name))
    return found


def started_processes(output: str) -> dict[str, int]:
    return {name: int(pid) for name, pid in STARTED.findall(output)}


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, dict[str, str]]]:
    env = stack_environment(tmp_path)
    out = tmp_path / "dev.out"
    with out.open("wb") as f:
        process = popen_with_parent_death(
            [str(SCRIPT), "-A", "dex_celery.examples.orderdesk.app", "dev"],
            cwd=ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process, out, env
    finally:
        if process.poll() is None:  # the test failed before its Ctrl-C: clean up after it
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        for pid in started_processes(out.read_text()).values():
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)


READY_LINE = "Press Ctrl-C to stop."


def start_dev(app: str, env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    """`dex-celery -A app dev` as a person starts it, its output (and its services') in `out`."""
    with out.open("wb") as f:
        return popen_with_parent_death(
            [str(SCRIPT), "-A", app, "dev"],
            cwd=ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_dev_ready(process: subprocess.Popen[bytes], out: Path, timeout: float = 90) -> str:
    """Wait until `dev` says its stack is ready; return the URL of its private Redis."""

    def ready() -> bool:
        assert process.poll() is None, f"dev exited early:\n{out.read_text()[-3000:]}"
        return READY_LINE in out.read_text()

    wait_for(ready, timeout=timeout, what="dex-celery dev to report its stack ready")
    match = re.search(r"redis:\s+(redis://\S+) \(private, in (\S+);", out.read_text())
    assert match, out.read_text()
    return match.group(1)


def stop_dev(process: subprocess.Popen[bytes], out: Path) -> None:
    """Ctrl-C, as a person stops it; it must exit 0 and leave nothing running."""
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0, out.read_text()[-3000:]
    for name, pid in started_processes(out.read_text()).items():
        assert not alive(pid), f"{name} (pid {pid}) outlived dex-celery dev"


def kill_everything(process: subprocess.Popen[bytes], out: Path) -> None:
    """SIGKILL `dev` and every process group it started, at once (a power cut): nothing of the
    stack gets to clean up. The private Redis's folder is left behind (the test's tmp_path)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    for pid in started_processes(out.read_text()).values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
