"""`dex-celery dev` and `dex-celery demo`, run as a person runs them (S9.1).

`dev` starts its own private redis-server (no `DEX_REDIS_URL` in its environment), a prefork
worker and beat; a call of the reference deployment's tools runs end to end through it; after
Ctrl-C (SIGINT) no process it started is alive and its private Redis folder is gone.
`demo` exits 0 within a minute, and its output names the four outcomes and the reconciliation.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from devtools.processes import ROOT, wait_for
from dex_celery import CallStatus, Settings
from dex_celery.model.outcomes import DID_NOT_RUN
from tests.support.processes.dev_stack import (
    SCRIPT,
    alive,
    group_alive,
    stack_environment,
    started_processes,
)
from tests.support.processes.dev_stack import dev as dev


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
    from dex_celery.examples.orderdesk.app import create_app

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
        [str(SCRIPT), "-A", "dex_celery.examples.orderdesk.app", "dev"],
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
