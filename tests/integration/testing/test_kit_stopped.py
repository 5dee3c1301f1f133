"""The users' kit stopped mid-test (docs/testing.md, "When pytest is stopped").

A small project using `dex_celery.testing` runs in a pytest process of its own; its one test
starts the kit's worker (prefork, two pool children) and beat, writes every pid it depends on
to a file (the sign it is mid-test) and blocks. The outer test then stops that pytest:

- SIGTERM (a CI `timeout`) or SIGHUP (a closed terminal): it unwinds as on Ctrl-C, and no
  process (worker, pool children, beat, the kit's redis-server) nor its `dex-testing-*` folder
  is left;
- SIGKILL: nothing can run in it, yet every process it started dies with it (each gets the
  parent-death signal on Linux: `dex_celery.processes.parent_death`); its folder stays, and the
  next run of the kit (any test) finds the folder of the dead pytest, kills whatever it recorded
  that still runs (elsewhere than Linux) and removes the folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devtools.processes import ROOT, wait_for
from dex_celery.testing.leftovers import start_time

pytestmark = [pytest.mark.crash, pytest.mark.timeout(300)]

APP = """
from celery import Celery

from dex_celery import Dex, EffectClass, ToolContext, ToolPolicy

app = Celery("stoppable")
dex = Dex(app)
app.conf.beat_schedule = {**dex.beat_schedule()}


@dex.tool(policy=ToolPolicy(effect=EffectClass.READ))
def ping(ctx: ToolContext) -> str:
    return "pong"
"""

BLOCKING_TEST = """
import json
import os
import time
from pathlib import Path


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == parent:
                found.append(int(entry.name))
    return found


def test_blocks_until_stopped(dex_worker):
    folder = os.environ["DEX_DATABASE_URL"].removeprefix("sqlite:///").rsplit("/", 1)[0]
    worker = dex_worker.worker.pid
    deadline = time.monotonic() + 60
    while len(_children(worker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = {
        "worker": worker,
        "pool": _children(worker),
        "beat": dex_worker.beat.pid,
        "redis": dex_worker.redis.process.pid,
    }
    mark = Path(os.environ["KIT_MARK"])
    mark.with_suffix(".tmp").write_text(json.dumps({"pids": pids, "folder": folder}))
    mark.with_suffix(".tmp").rename(mark)
    time.sleep(600)  # stopped by the outer test long before
"""

PLAIN_TEST = """
def test_nothing():
    pass
"""


def _project(folder: Path) -> None:
    folder.mkdir()
    (folder / "stoppable.py").write_text(APP)
    (folder / "conftest.py").write_text('pytest_plugins = ["dex_celery.testing"]\n')
    (folder / "pytest.ini").write_text("[pytest]\ndex_app = stoppable\ndex_concurrency = 2\n")
    (folder / "test_blocking.py").write_text(BLOCKING_TEST)
    (folder / "test_plain.py").write_text(PLAIN_TEST)


def _env(mark: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEX_", "PYTEST_"))}
    env["PYTHONPATH"] = str(ROOT)
    env["KIT_MARK"] = str(mark)
    return env


#: `python -m pytest` as a terminal starts it: SIGTERM and SIGHUP at their defaults, whatever
#: this process inherited (under `nohup` SIGHUP is ignored, and the kit leaves an ignored
#: signal ignored, as a user's own choice).
PYTEST_AS_FROM_A_TERMINAL = (
    "import signal, sys, pytest\n"
    "for stop in (signal.SIGTERM, signal.SIGHUP):\n"
    "    signal.signal(stop, signal.SIG_DFL)\n"
    "sys.exit(pytest.main(sys.argv[1:]))\n"
)


def _pytest(project: Path, mark: Path, test: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", PYTEST_AS_FROM_A_TERMINAL, "-q", "-p", "no:cacheprovider", test],
        cwd=project, env=_env(mark), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _blocking_run(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """The kit's project written into `tmp_path / "project"`, its blocking test started; the run
    and the file it marks once mid-test."""
    project, mark = tmp_path / "project", tmp_path / "mid-test"
    _project(project)
    return _pytest(project, mark, "test_blocking.py"), mark


def _mid_test(run: subprocess.Popen[bytes], mark: Path) -> dict[str, Any]:
    def marked() -> bool:
        if run.poll() is not None:
            output = run.stdout.read().decode() if run.stdout else ""
            raise AssertionError(f"the kit's pytest ended early:\n{output[-4000:]}")
        return mark.exists()

    wait_for(marked, timeout=120, what="the kit's test to be mid-test")
    found: dict[str, Any] = json.loads(mark.read_text())
    return found


def _processes(found: dict[str, Any]) -> dict[int, str]:
    pids = found["pids"]
    every = [pids["worker"], *pids["pool"], pids["beat"], pids["redis"]]
    return {pid: start_time(pid) or "" for pid in every}


def _running(processes: dict[int, str]) -> list[int]:
    """Those still running as the same process (a reused pid is another process)."""
    alive = []
    for pid, started in processes.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[19] == started and fields[0] != "Z":
            alive.append(pid)
    return alive


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_kit_run_leaves_no_process_and_no_folder(
    tmp_path: Path, stop: signal.Signals
) -> None:
    run, mark = _blocking_run(tmp_path)
    try:
        found = _mid_test(run, mark)
        processes = _processes(found)
        # The worker, its pool children (two, and the recorder's), beat, redis-server.
        assert len(found["pids"]["pool"]) >= 2 and all(processes.values()), found
        assert Path(found["folder"]).name.startswith("dex-testing-")
        assert Path(found["folder"]).is_dir()

        run.send_signal(stop)
        output = run.communicate(timeout=120)[0].decode()
    finally:
        if run.poll() is None:  # only if the test failed before its signal ended the run
            run.kill()
    assert run.returncode != 0, output  # interrupted, as on Ctrl-C
    assert "stopped by " + stop.name in output, output[-3000:]
    assert _running(processes) == [], output[-3000:]
    assert not Path(found["folder"]).exists(), output[-3000:]


def test_what_a_sigkilled_run_leaves_the_next_run_cleans(tmp_path: Path) -> None:
    run, mark = _blocking_run(tmp_path)
    project = tmp_path / "project"
    try:
        found = _mid_test(run, mark)
        processes = _processes(found)
    finally:
        run.kill()
        run.wait(timeout=30)
    # Nothing ran in pytest, yet its processes die with it (the parent-death signal, Linux);
    # its folder stays for the next run.
    wait_for(lambda: not _running(processes), timeout=30, what="the processes to die with pytest")
    assert Path(found["folder"]).is_dir()

    try:
        again = _pytest(project, tmp_path / "unused", "test_plain.py")
        output = again.communicate(timeout=120)[0].decode()
        assert again.returncode == 0, output
        wait_for(lambda: not _running(processes), timeout=15, what="the leftovers killed")
        assert not Path(found["folder"]).exists()
    finally:
        for pid in _running(processes):  # only if the assertion above failed
            os.kill(pid, signal.SIGKILL)
