"""`dex-celery dev` and `dex-celery demo`, run as a person runs them (S9.1).

`dev` starts its own private redis-server (no `DEX_REDIS_URL` in its environment), a prefork
worker and beat; a call of the reference deployment's tools runs end to end through it; after
Ctrl-C (SIGINT) no process it started is alive and its private Redis folder is gone.
`demo` exits 0 within a minute, and its output names the four outcomes and the reconciliation.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devtools.processes import ROOT, wait_for
from dex_celery import CallStatus, Settings
from dex_celery.model.outcomes import DID_NOT_RUN

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
        process = subprocess.Popen(
            [str(SCRIPT), "-A", "config.celery_app", "dev"],
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


def test_dev_serves_a_call_and_ctrl_c_leaves_nothing_running(
    dev: tuple[subprocess.Popen[bytes], Path, dict[str, str]],
) -> None:
    """S9.1: one command runs the stack (private Redis, prefork worker, beat); a `read` call
    of the reference deployment succeeds through it; SIGINT stops every process it started and
    removes the private Redis with its folder."""
    process, out, env = dev

    def ready() -> bool:
        assert process.poll() is None, f"dev exited early:\n{out.read_text()[-3000:]}"
        return "Press Ctrl-C to stop." in out.read_text()

    wait_for(ready, timeout=90, what="dex-celery dev to report its stack ready")
    output = out.read_text()
    processes = started_processes(output)
    assert set(processes) == {"redis-server", "worker", "beat"}
    match = re.search(r"redis:\s+(redis://\S+) \(private, in (\S+);", output)
    assert match, output
    redis_url, redis_dir = match.group(1), Path(match.group(2))
    assert redis_dir.is_dir()

    # A call through the stack, from this process, as an agent loop would make it.
    from config.celery_app import create_app

    _app, dex, desk = create_app(Settings.from_env({**env, "DEX_REDIS_URL": redis_url}))
    order = desk.add_order(customer="Ada Lovelace", total_cents=4200)
    client = dex.client()
    record = client.request_call("dev-s1", "t1", "c1", "lookup_order", {"order_id": order.id})
    (done,) = client.wait([record.key], timeout=60)
    assert done.status is CallStatus.SUCCEEDED, done.error
    assert '"customer": "Ada Lovelace"' in (done.result or "")
    dex.ledger.client.close()

    worker_children = group_alive(processes["worker"])
    assert len(worker_children) >= 3  # the main process and its prefork pool

    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0, out.read_text()[-3000:]
    for name, pid in processes.items():
        assert not alive(pid), f"{name} (pid {pid}) outlived dex-celery dev"
        assert group_alive(pid) == [], f"processes of {name}'s group outlived dex-celery dev"
    assert not redis_dir.exists()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(redis_url, socket_connect_timeout=1).ping()
    assert "stopped; nothing left running" in out.read_text()


def test_dev_without_any_redis_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    """No `DEX_REDIS_URL` and no `redis-server` on the PATH: a missing prerequisite, exit 2."""
    env = stack_environment(tmp_path)
    env["PATH"] = str(Path(sys.executable).parent)  # the venv's scripts, no redis-server
    result = subprocess.run(
        [str(SCRIPT), "-A", "config.celery_app", "dev"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no Redis: set DEX_REDIS_URL" in result.stderr
    assert "install redis-server" in result.stderr


def test_demo_shows_every_outcome_and_the_reconciliation(tmp_path: Path) -> None:
    """S4.1: one call ends each way (succeeded, failed with the did-not-run text of S4.2,
    rejected by a person per S6.2, outcome_unknown after a real SIGKILL per S4.3), then S8.1's
    report ('Note from the order system ...') and S8.2's nothing-new second pass. Under a
    minute, exit 0, nothing left running."""
    env = stack_environment(tmp_path)
    started = time.monotonic()
    result = subprocess.run(
        [str(SCRIPT), "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    output = result.stdout
    assert result.returncode == 0, output + result.stderr
    assert elapsed < 60, f"the demo took {elapsed:.1f}s"

    table = output[output.index("OUTCOME") : output.index("reconciliation report")]
    rows = {line.split()[0]: line for line in table.splitlines()[2:] if line.strip()}
    assert set(rows) == {"succeeded", "failed", "rejected", "outcome_unknown"}
    assert "lookup_order" in rows["succeeded"]
    assert "print_shipping_label" in rows["failed"] and DID_NOT_RUN in rows["failed"]
    assert "cancel_order" in rows["rejected"] and "rejected by" in rows["rejected"]
    assert "cancel_order" in rows["outcome_unknown"]
    assert re.search(r"killed worker process \d+ \(SIGKILL\)", output)

    report = output[output.index("reconciliation report") :]
    assert re.search(
        r"Note from the order system: the cancellation of order \d+ went through", report
    )
    assert "a second pass sends nothing new: reported 0" in report

    for name, pid in started_processes(output).items():
        assert not alive(pid), f"{name} (pid {pid}) outlived dex-celery demo"
