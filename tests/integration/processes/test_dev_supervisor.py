"""`dex-celery dev` restarts a worker (and beat) whose main process exits (issue 19, "Workers come
back"; docs/operations.md).

The worker's main process is SIGKILLed, as the OOM killer would; `dev` says so on one line,
ends what is left of the old worker's process group, starts a new worker after its backoff, and
a call then runs through the new one. Beat is killed the same way and comes back too.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

from celery import Celery

from devtools.processes import ROOT, wait_for
from dex_celery import CallStatus, Settings
from dex_celery.processes.localstack import ping_app
from dex_celery.processes.supervise import Backoff
from tests.support.processes.dev_stack import SCRIPT, alive, group_alive, started_processes
from tests.support.processes.dev_stack import dev as dev  # the fixture

READY = "Press Ctrl-C to stop."
RESTARTED = re.compile(r"^restarted (\S+): pid (\d+) \(restart (\d+)\)$", re.MULTILINE)


def _worker_pids(app: Celery) -> dict[str, int]:
    """Node name -> main process pid of every worker that answers `inspect stats`."""
    try:
        replies = app.control.inspect(timeout=1.0).stats() or {}
    except Exception:  # the broker is between two lives of the worker: ask again
        return {}
    return {node: int(stats["pid"]) for node, stats in replies.items()}


def test_dev_restarts_a_killed_worker_and_beat(
    dev: tuple[subprocess.Popen[bytes], Path, dict[str, str]],
) -> None:
    process, out, env = dev

    def ready() -> bool:
        assert process.poll() is None, f"dev exited early:\n{out.read_text()[-3000:]}"
        return READY in out.read_text()

    wait_for(ready, timeout=90, what="dex-celery dev to report its stack ready")
    output = out.read_text()
    first = started_processes(output)
    match = re.search(r"redis:\s+(redis://\S+) \(private", output)
    assert match, output
    settings = Settings.from_env({**env, "DEX_REDIS_URL": match.group(1)})
    pinger = ping_app(settings)
    wait_for(
        lambda: first["worker"] in _worker_pids(pinger).values(),
        timeout=30,
        what="the first worker to answer",
    )
    old_group = group_alive(first["worker"])
    assert len(old_group) >= 2  # the main process and its prefork pool

    signal_main = first["worker"]
    subprocess.run(["kill", "-KILL", str(signal_main)], check=True)

    def restarted(name: str) -> int | None:
        assert process.poll() is None, f"dev exited:\n{out.read_text()[-3000:]}"
        for found, pid, _count in RESTARTED.findall(out.read_text()):
            if found == name:
                return int(pid)
        return None

    wait_for(lambda: restarted("worker"), timeout=60, what="dev to restart the worker")
    text = out.read_text()
    assert re.search(
        rf"^worker \(pid {signal_main}\) exited with code -9 after \d+s; restarting it in "
        r"[0-9.]+s \(restart 1\)$",
        text,
        re.MULTILINE,
    ), text[-3000:]
    new_pid = restarted("worker")
    assert new_pid is not None and new_pid != signal_main
    wait_for(
        lambda: new_pid in _worker_pids(pinger).values(),
        timeout=60,
        what=f"the new worker (pid {new_pid}) to answer",
    )
    # Nothing of the old worker is left: its orphaned pool children were ended.
    assert [pid for pid in old_group if alive(pid)] == []
    # `status` shows the new pid and the restart of the same node name.
    shown = subprocess.run(
        [str(SCRIPT), "-A", "dex_celery.examples.orderdesk.app", "status", "--json"],
        cwd=ROOT,
        env={**env, "DEX_REDIS_URL": match.group(1)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    workers = json.loads(shown.stdout)["sections"]["workers"]
    (node,) = workers["nodes"]
    assert workers["workers"][node]["pid"] == new_pid
    assert workers["workers"][node]["restarts"] == 1
    assert "restarted 1 time" in workers["detail"]

    # A call runs through the new worker.
    from dex_celery.examples.orderdesk.app import create_app

    _app, dex, desk = create_app(settings)
    order = desk.add_order(customer="Grace Hopper", total_cents=1234)
    client = dex.client()
    record = client.request_call("dev-r1", "t1", "c1", "lookup_order", {"order_id": order.id})
    (done,) = client.wait([record.key], timeout=60)
    assert done.status is CallStatus.SUCCEEDED, done.error
    dex.ledger.client.close()

    # Beat comes back the same way.
    subprocess.run(["kill", "-KILL", str(first["beat"])], check=True)
    wait_for(lambda: restarted("beat"), timeout=60, what="dev to restart beat")
    beat_pid = restarted("beat")
    assert beat_pid is not None
    wait_for(lambda: alive(beat_pid), timeout=10, what="the new beat to run")

    assert process.poll() is None, out.read_text()[-3000:]
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0, out.read_text()[-3000:]
    for pid in (new_pid, beat_pid):
        assert not alive(pid)


def test_the_backoff_doubles_and_is_bounded() -> None:
    backoff = Backoff(initial=1.0, maximum=30.0)
    assert [backoff.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
