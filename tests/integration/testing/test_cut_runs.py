"""A test run cut short leaves no process running and still names its failures
(docs/testing.md, "Processes a test starts" and "Reading a run").

A pytest of its own runs tests/support/runs/cut_run.py: one test fails, the next starts a private
redis-server and a prefork worker (its pool processes and outcome recorder) and blocks. The
outer test then stops that pytest as a cut CI job or a closed terminal would:

- SIGKILL: nothing of pytest runs, no fixture's teardown; the processes it started die with it
  all the same (each gets the parent-death signal, `dex_celery.processes.parent_death`; the
  pool processes get Celery's own);
- SIGINT (Ctrl-C): the teardowns run and stop them.

Either way its output already named the failure (`FAILED <node id>`, tests/support/
failures_now.py): `-q` alone printed an `F` and a summary that a cut run never reaches.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.processes import ROOT, wait_for
from dex_celery.testing.leftovers import start_time
from tests.support.runs.cut_run import MARK_ENV, STACKS_SIGNAL
from tests.support.runs.signal_masks import signal_masks

pytestmark = [pytest.mark.crash, pytest.mark.timeout(300)]

INNER = "tests/support/runs/cut_run.py"

#: Runs `python <args>` with SIGINT at its default, as a run started from a terminal has it. A
#: process started in the background by a non-interactive shell (`make test &` in a script)
#: ignores SIGINT, and so does everything it starts: Python then installs no Ctrl-C handler,
#: and the inner run would never see the SIGINT this test sends.
AS_FROM_A_TERMINAL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def _same_process_alive(pid: int, started: str) -> bool:
    """`pid` is still the process noted (not a zombie, not a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat[stat.rindex(")") + 2 :].split()[0]
    return state != "Z" and start_time(pid) == started


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT], ids=lambda s: s.name)
def test_a_cut_run_leaves_nothing_running_and_named_its_failure(
    tmp_path: Path, stop: signal.Signals
) -> None:
    mark, output = tmp_path / "mid-test", tmp_path / "output.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEX_", "PYTEST_"))}
    env.update({"PYTHONPATH": str(ROOT), MARK_ENV: str(mark)})
    with output.open("wb") as out:
        run = subprocess.Popen(
            [sys.executable, "-c", AS_FROM_A_TERMINAL, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             INNER],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    started: dict[int, str] = {}
    try:
        wait_for(
            lambda: mark.exists() or run.poll() is not None,
            timeout=120,
            what="the inner run to be mid-test",
        )
        assert mark.exists(), output.read_text()[-4000:]
        started = {pid: start_time(pid) or "" for pid in json.loads(mark.read_text())}
        assert len(started) >= 4 and all(started.values()), started  # worker, 2 pool, redis

        os.kill(run.pid, stop)
        try:
            run.wait(timeout=120)
        except subprocess.TimeoutExpired:
            stacks = mark.with_suffix(".stacks")
            signals = signal_masks(run.pid)  # before the stacks' signal adds to it
            os.kill(run.pid, STACKS_SIGNAL)
            wait_for(lambda: stacks.stat().st_size > 0, timeout=10, what="the run's stacks")
            raise AssertionError(
                f"the run stopped by {stop.name} still ran 120 s later; its signals: {signals} "
                f"(this test's: {signal_masks(os.getpid())}); its threads:\n"
                f"{stacks.read_text()}\nits output:\n{output.read_text()[-4000:]}"
            ) from None
        wait_for(
            lambda: not any(_same_process_alive(p, s) for p, s in started.items()),
            timeout=30,
            what=f"every process of the run stopped by {stop.name} to be gone",
        )
    finally:
        if run.poll() is None:
            run.kill()
        for pid, begun in started.items():  # the test failed: leave nothing behind ourselves
            if _same_process_alive(pid, begun):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    text = output.read_text()
    assert f"FAILED {INNER}::test_fails_first" in text, text[-4000:]
