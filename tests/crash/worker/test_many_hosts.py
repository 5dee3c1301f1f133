"""Workers on many hosts (docs/ledger.md, "Worker-lost fast path"; S4.3): each worker runs as a
machine of its own, in new UTS and PID namespaces (`unshare`), so process ids start at 1 on
every host and collide between them, while Redis, the broker and the database are shared over
loopback.

Killing one host marks its own attempts lost and none of the other host's; a pool process that
dies on one host never ends an attempt that a process of another host runs, even when both hosts
carry the same host name (pods with the node's network and name, containers sharing the host's
UTS namespace) and the process ids match.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.processes import Worker, can_run_as_host, namespace_pid, wait_for
from devtools.toolapp import BLOCK_BEFORE_CLAIM_ENV, LOG_ENV, make_app, prerun_marker
from dex_celery import CallStatus, Dex, Settings
from dex_celery.engine.upkeep.sweep import run_forever
from dex_celery.model.ids import CallKey
from dex_celery.store.values import arguments_json
from dex_celery.tools.tool import TASK_PREFIX
from tests.support.faults.crash import lines, release_tools, wait_finished, wait_started

pytestmark = pytest.mark.crash

#: Long leases, so the sweeper cannot be what ends an attempt within a test's budget: only the
#: worker-lost fast path can (test 2), or the lease of a host that is gone (test 1 uses the
#: short test lease instead).
SLOW = {"DEX_HEARTBEAT_TIMEOUT": "60", "DEX_SCHEDULE_TO_START": "60"}


@pytest.fixture
def hosts(env: dict[str, str]) -> Iterator[Callable[..., Worker]]:
    """Start a worker of the test tools as a host of its own (`Worker(host=...)`)."""
    why = can_run_as_host()
    if why is not None:
        pytest.skip(f"cannot run workers in namespaces of their own here: {why}")
    started: list[Worker] = []

    def start(
        host: str,
        *,
        concurrency: int = 2,
        extra_env: dict[str, str] | None = None,
        queues: str = "celery",
    ) -> Worker:
        worker = Worker(
            {**env, **(extra_env or {})},
            Path(env[LOG_ENV]),
            concurrency,
            extra_args=("-Q", queues),
            host=host,
        )
        started.append(worker)  # stopped at the end even if it never became ready
        return worker.start()

    yield start
    for worker in started:
        worker.stop()


def _route_by_call(name: str, args: Any, kwargs: dict[str, Any], *_: Any, **__: Any) -> Any:
    """Celery router: calls `w0`, `w1` to host A's queue, the others to host B's."""
    if not name.startswith(TASK_PREFIX):
        return None
    return {"queue": "host-a" if kwargs["key"].endswith(("/w0", "/w1")) else "host-b"}


def _owner_host(dex: Dex, key: str) -> str:
    """The host (from the Celery node name) whose process holds `key`'s running attempt."""
    entry = dex.ledger.read(key)
    assert entry is not None and entry.state == "running", entry
    node = entry.owner.split(":", 1)[0]
    return node.rpartition("@")[2]


def test_a_killed_host_loses_only_its_own_attempts(
    dex: Dex, env: dict[str, str], hosts: Callable[..., Worker], sweeper: threading.Event
) -> None:
    """Two hosts run two writes each; SIGKILL of host A's whole namespace (main process and
    pool children at once) ends A's writes `outcome_unknown` through their lapsed leases, while
    B's writes go on, finish and succeed with exactly one run each in the tool's own log."""
    host_a, host_b = f"dex-a-{uuid.uuid4().hex[:6]}", f"dex-b-{uuid.uuid4().hex[:6]}"
    worker_a = hosts(host_a, queues="host-a")
    worker_b = hosts(host_b, queues="host-b")
    # Two writes to each host's own queue: early-acknowledged writes let a worker's main
    # process reserve more messages than it has pool processes, so a shared queue would not
    # say which host runs what.
    dex.celery.conf.task_routes = (_route_by_call,)
    dex.celery.amqp.flush_routes()
    client = dex.client()
    keys = [
        client.request_call("s1", "t1", f"w{i}", "slow_non_idempotent_write", {"seconds": 120}).key
        for i in range(4)
    ]
    for key in keys:
        wait_started(key)
    owners = {key: _owner_host(dex, key) for key in keys}
    on_a = [k for k in keys if owners[k] == host_a]
    on_b = [k for k in keys if owners[k] == host_b]
    assert on_a == keys[:2] and on_b == keys[2:], owners
    # The hosts' process ids collide: each pool's processes are numbered inside its own host.
    ns_a = sorted(namespace_pid(p) for p in worker_a.children())
    ns_b = sorted(namespace_pid(p) for p in worker_b.children())
    assert set(ns_a) & set(ns_b), (ns_a, ns_b)

    worker_a.kill_all()
    for key in on_a:
        record = wait_finished(dex, key, timeout=30)
        assert record.status is CallStatus.OUTCOME_UNKNOWN, record
        assert [a for a, _, _ in lines(key, "start")] == [1]
        assert lines(key, "end") == []
    for key in on_b:  # still running on B, still its own
        entry = dex.ledger.read(key)
        assert entry is not None and entry.state == "running", entry
        assert _owner_host(dex, key) == host_b

    release_tools(env)
    for key in on_b:
        record = wait_finished(dex, key, timeout=30)
        assert record.status is CallStatus.SUCCEEDED, record
        assert record.attempts == 1
        assert [a for a, _, _ in lines(key, "start")] == [1]
        assert [a for a, _, _ in lines(key, "end")] == [1]
    assert worker_b.process is not None and worker_b.process.poll() is None


@pytest.fixture
def slow_dex(dex: Dex, env: dict[str, str]) -> Iterator[Dex]:
    """A Dex whose calls get 60 s leases and queue deadlines, with its own sweeper running."""
    _app, slow = make_app(Settings.from_env({**env, **SLOW}))
    stop = threading.Event()
    thread = threading.Thread(target=run_forever, args=(slow,), kwargs={"stop": stop}, daemon=True)
    thread.start()
    yield slow
    stop.set()
    thread.join(timeout=10)


@pytest.mark.parametrize("same_name", [True, False], ids=["same-host-name", "other-host-name"])
def test_a_dead_pool_process_never_loses_another_hosts_attempt(
    slow_dex: Dex, env: dict[str, str], hosts: Callable[..., Worker], same_name: bool
) -> None:
    """The same attempt delivered twice: host A's pool process dies holding its copy, before
    its claim, while host B's process runs the attempt under a process id that A's process just
    had (both hosts number their processes from 1). A's parent gets WorkerLostError for the
    task; the attempt is B's, so the fast path must leave it alone (docs/ledger.md): the write
    runs once on B and succeeds. With `same_name` both hosts carry this machine's host name
    (only the PID namespace differs), so the host name alone cannot tell them apart."""
    dex = slow_dex
    name_a = socket.gethostname() if same_name else f"dex-a-{uuid.uuid4().hex[:6]}"
    name_b = socket.gethostname() if same_name else f"dex-b-{uuid.uuid4().hex[:6]}"
    worker_a = hosts(name_a, concurrency=1, extra_env={**SLOW, BLOCK_BEFORE_CLAIM_ENV: "1"})
    record = dex.client().request_call(
        "s1", "t1", "w", "slow_non_idempotent_write", {"seconds": 120}
    )
    task_id = CallKey.parse(record.key).task_id(1)
    marker = prerun_marker(task_id)
    wait_for(marker.exists, timeout=30, what="host A's pool process to hold the message")
    (child_a,) = worker_a.children()
    assert namespace_pid(child_a) == int(marker.read_text())

    worker_b = hosts(name_b, concurrency=1, extra_env=SLOW, queues="host-b")
    # The duplicate delivery: the same attempt's message once more, as a redelivery would, to
    # host B only (A's main process could take it otherwise: its slot is busy, but a broker
    # hands a redelivered copy to any consumer with room).
    dex.celery.send_task(
        TASK_PREFIX + "slow_non_idempotent_write",
        kwargs={
            "key": record.key,
            "attempt": 1,
            "arguments": arguments_json({"seconds": 120}),
            "sealed": None,
        },
        task_id=task_id,
        queue="host-b",
    )
    pid_b = wait_started(record.key)
    (child_b,) = worker_b.children()
    assert namespace_pid(child_b) == pid_b
    entry = dex.ledger.read(record.key)
    assert entry is not None and entry.state == "running" and f":{pid_b}" in entry.owner

    seen = len(worker_a.log())
    os.kill(child_a, signal.SIGKILL)
    # Host A's parent judges the attempt of its dead process (`Worker.on_worker_lost`): it
    # either declines ("not lost") or asks the ledger to lose it ("ledger step").
    wait_for(
        lambda: "not lost" in worker_a.log()[seen:] or "ledger step" in worker_a.log()[seen:],
        timeout=30,
        what="host A's parent to judge the attempt of its dead pool process",
    )
    entry = dex.ledger.read(record.key)
    assert entry is not None and entry.state == "running", (entry, worker_a.log()[-3000:])

    release_tools(env)
    done = wait_finished(dex, record.key, timeout=30)
    assert done.status is CallStatus.SUCCEEDED, (done, json.dumps(worker_a.log()[-2000:]))
    assert [a for a, _, _ in lines(record.key, "start")] == [1]
    assert [a for a, _, _ in lines(record.key, "end")] == [1]
