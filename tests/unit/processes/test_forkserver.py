"""The test suite's fork server (devtools/forkserver.py): a forked process gets the request's
arguments, environment, folder and output, its own session, and an exit status as
`subprocess.Popen` reports it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from devtools import forkserver
from devtools.processes import ROOT, wait_for


@pytest.fixture(autouse=True)
def _enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(forkserver.ENABLE_ENV, "1")


def test_a_console_script_gets_its_arguments_environment_and_folder(tmp_path: Path) -> None:
    env = {**os.environ, "PROBE": "from-the-request"}
    script = "import os, sys; print(sys.argv[1:], os.environ['PROBE'], os.getcwd()); sys.exit(3)"
    (tmp_path / "probe.py").write_text(f"def main():\n    {script}\n")
    env["PYTHONPATH"] = str(tmp_path)
    assert forkserver.usable(env, tmp_path, ROOT)
    done = forkserver.run_function(
        "probe:main", "probe", ["a", "b"], env=env, cwd=tmp_path, timeout=30
    )
    assert done.returncode == 3
    assert done.stdout.strip() == f"['a', 'b'] from-the-request {tmp_path}"


def test_a_killed_process_reports_the_signal_and_ran_in_a_session_of_its_own(
    tmp_path: Path,
) -> None:
    log = tmp_path / "out.log"
    with log.open("wb") as out:
        process = forkserver.spawn_module(
            "timeit",
            ["-n", "1", "-r", "1", "import time; time.sleep(60)"],
            env=dict(os.environ),
            cwd=ROOT,
            stdout=out.fileno(),
            stderr=out.fileno(),
        )
    wait_for(lambda: os.getsid(process.pid) == process.pid, timeout=10, what="its own session")
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.1)
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait(timeout=10) == -signal.SIGKILL


def test_what_a_fork_would_not_run_faithfully_starts_a_new_interpreter(tmp_path: Path) -> None:
    base = dict(os.environ)
    assert forkserver.usable(base, ROOT, ROOT)
    assert not forkserver.usable({**base, "PYTHONWARNINGS": "error"}, ROOT, ROOT)
    (tmp_path / "dex_celery").mkdir()  # an older release's copy of the package
    assert not forkserver.usable(base, tmp_path, ROOT)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text("")
    assert not forkserver.usable({**base, "PYTHONPATH": str(hook)}, ROOT, ROOT)
    assert not forkserver.usable({**base, forkserver.ENABLE_ENV: "0"}, ROOT, ROOT)
