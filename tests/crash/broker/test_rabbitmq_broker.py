"""RabbitMQ as the broker, Redis as the ledger: the broker restarts, connections break, and a
late-acknowledged attempt outlives RabbitMQ's delivery-acknowledgement timeout
(docs/rabbitmq.md). In every case a copy of a message the broker gives out again is refused by
the ledger's claim while the first attempt runs (S3.2, S3.3), and each tool runs once by its own
side-effect log.

The restarts use a private RabbitMQ node of this module's own (`tests.support.faults.rabbitmq`), on free
ports, stopped with RabbitMQ's own shutdown and started again on the same data: the machine's
shared server is never restarted. The connection loss goes through a TCP proxy in front of the
shared server, in the test run's vhost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.processes import Worker, wait_for
from dex_celery import CallStatus, Dex
from dex_celery.model.ids import CallKey
from dex_celery.testing.tcpproxy import TcpProxy
from tests.support.faults.crash import (
    BROKER_QUEUE,
    dex_with_sweeper,
    lines,
    refused,
    release_tools,
    wait_finished,
    wait_started,
)
from tests.support.faults.rabbitmq import (
    RABBITMQ,
    SHARED_PORT,
    RabbitNode,
    amqp_url,
    delete_queues,
    private_node_missing,
    queued_task_ids,
)

#: A node's start and restart take up to a minute each on a loaded machine (pytest's default
#: limit is 240 s a test, its fixtures included).
pytestmark = [pytest.mark.crash, pytest.mark.timeout(600)]

#: A node restart takes from ten seconds to a minute on a loaded 2-core machine: no attempt may
#: expire in the queue meanwhile (this test is about redelivery, not about S3.5).
SCHEDULE_TO_START = "300"
#: RabbitMQ's delivery-acknowledgement timeout for the test that outlives it, in milliseconds.
SHORT_CONSUMER_TIMEOUT_MS = 3000
#: RabbitMQ's default (30 minutes), set back after that test.
DEFAULT_CONSUMER_TIMEOUT_MS = 1_800_000


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    missing = private_node_missing()
    if missing:
        pytest.skip(f"RabbitMQ restart tests skipped: {missing}")
    own = RabbitNode(tmp_path_factory.mktemp("rabbit-node")).start()
    yield own
    own.kill()


@pytest.fixture
def node_env(env: dict[str, str], node: RabbitNode) -> dict[str, str]:
    """The test's environment with the private node as the broker; its queue starts empty."""
    delete_queues(node.url(), (BROKER_QUEUE,))
    return {**env, "DEX_BROKER_URL": node.url(), "DEX_SCHEDULE_TO_START": SCHEDULE_TO_START}


@pytest.fixture
def node_dex(dex: Dex, node_env: dict[str, str]) -> Iterator[Dex]:
    """A Dex publishing to the private node (schema made by `dex`), with a sweeper running."""
    yield from dex_with_sweeper(node_env)


def _task_id(key: str) -> str:
    return CallKey.parse(key).task_id(1)


def _ran_once(key: str) -> None:
    assert [a for a, _, _ in lines(key, "start")] == [1], lines(key, "start")
    assert [a for a, _, _ in lines(key, "end")] == [1], lines(key, "end")


def test_calls_queued_across_a_broker_restart_run_once(
    node: RabbitNode,
    node_dex: Dex,
    node_env: dict[str, str],
    start_worker: Callable[..., Worker],
) -> None:
    """Publisher confirms: when `request_call` returns, the message is in the quorum queue; a
    restart of the broker keeps it; a worker started afterwards runs each call once (S3.2)."""
    dex = node_dex
    client = dex.client()
    write = client.request_call("s1", "t1", "w", "slow_non_idempotent_write", {"seconds": 0})
    read = client.request_call("s1", "t1", "r", "slow_read", {"seconds": 0})
    expected = {_task_id(write.key), _task_id(read.key)}
    assert set(queued_task_ids(node.url(), BROKER_QUEUE)) == expected

    node.restart()
    wait_for(
        lambda: set(queued_task_ids(node.url(), BROKER_QUEUE)) == expected,
        timeout=60,
        what="the quorum queue to give both messages after the restart",
    )
    start_worker(extra_env=node_env)
    for key in (write.key, read.key):
        done = wait_finished(dex, key, timeout=90)
        assert done.status is CallStatus.SUCCEEDED, done
        assert done.attempts == 1
        _ran_once(key)


def test_calls_running_across_a_broker_restart_run_once(
    node: RabbitNode,
    node_dex: Dex,
    node_env: dict[str, str],
    start_worker: Callable[..., Worker],
) -> None:
    """The broker restarts while a read and a write run (both acknowledged late, as every tool
    task): the worker's main process reconnects and its tools go on; RabbitMQ gives the
    unacknowledged messages out again and the ledger refuses those copies while attempt 1 runs;
    a call requested after the restart is served; each tool runs once and succeeds."""
    dex = node_dex
    worker = start_worker(concurrency=4, extra_env=node_env)
    main_pid = worker.pid
    client = dex.client()
    read = client.request_call("s1", "t1", "r", "slow_read", {"seconds": 300})
    write = client.request_call("s1", "t1", "w", "slow_non_idempotent_write", {"seconds": 300})
    wait_started(read.key)
    wait_started(write.key)

    node.restart()
    wait_for(
        lambda: refused(dex, read.key) >= 1 or worker.died(),
        timeout=180,
        what="the read's redelivered copy to reach the worker and be refused",
    )
    assert not worker.died(), worker.log()[-4000:]
    assert lines(read.key, "end") == []  # refused while attempt 1 still runs
    assert (
        f"Task dex.tool.slow_read[{read.key}#1] received"
        in worker.log().split("Connected to amqp", 2)[-1]
    )

    after = client.request_call("s1", "t1", "after", "slow_idempotent_write", {"seconds": 0})
    assert wait_finished(dex, after.key, timeout=120).status is CallStatus.SUCCEEDED
    release_tools(node_env)
    for key in (read.key, write.key):
        done = wait_finished(dex, key, timeout=60)
        assert done.status is CallStatus.SUCCEEDED, done
        assert done.attempts == 1
        _ran_once(key)
    assert worker.pid == main_pid and not worker.died()
    assert "Unrecoverable error" not in worker.log()


def test_an_attempt_outliving_the_consumer_timeout_is_not_run_twice(
    node: RabbitNode,
    node_dex: Dex,
    node_env: dict[str, str],
    start_worker: Callable[..., Worker],
) -> None:
    """RabbitMQ closes the channel of a consumer that holds a delivery unacknowledged longer
    than `consumer_timeout` and gives the message out again: a late-acknowledged read running
    longer than that is not cut short, its second copy is refused by the claim while it runs,
    and it ends succeeded with one execution (docs/rabbitmq.md, "consumer_timeout")."""
    dex = node_dex
    node.eval(f"application:set_env(rabbit, consumer_timeout, {SHORT_CONSUMER_TIMEOUT_MS}).")
    try:
        worker = start_worker(concurrency=2, extra_env=node_env)
        read = dex.client().request_call("s1", "t1", "r", "slow_read", {"seconds": 300})
        wait_started(read.key)
        wait_for(
            lambda: refused(dex, read.key) >= 1 or worker.died(),
            timeout=90,
            what="the channel to time out and the read's second copy to be refused",
        )
        assert not worker.died(), worker.log()[-4000:]
        assert "PRECONDITION_FAILED" in worker.log() or "timed out" in worker.log()
        assert lines(read.key, "end") == []
        release_tools(node_env)
        done = wait_finished(dex, read.key, timeout=60)
        assert done.status is CallStatus.SUCCEEDED, done
        assert done.attempts == 1
        _ran_once(read.key)
        assert not worker.died()
    finally:
        node.eval(f"application:set_env(rabbit, consumer_timeout, {DEFAULT_CONSUMER_TIMEOUT_MS}).")


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    link = TcpProxy(SHARED_PORT).start()
    yield link
    link.stop()


@pytest.fixture
def shared_dex(dex: Dex, env: dict[str, str]) -> Iterator[Dex]:
    yield from dex_with_sweeper({**env, "DEX_SCHEDULE_TO_START": SCHEDULE_TO_START})


@pytest.mark.parametrize("broker_kind", [RABBITMQ], indirect=True)
def test_a_copy_redelivered_after_a_connection_loss_is_refused_while_the_first_runs(
    shared_dex: Dex,
    env: dict[str, str],
    rabbitmq_vhost: str,
    proxy: TcpProxy,
    start_worker: Callable[..., Worker],
) -> None:
    """The worker's connection to RabbitMQ is cut while a read and a write run: RabbitMQ puts
    their unacknowledged messages (every tool task is acknowledged late) back in the queue and
    hands them to the reconnected worker, whose claims are refused while attempt 1 still runs
    (S3.3); each tool runs once and succeeds (S3.2)."""
    dex = shared_dex
    proxied = amqp_url(rabbitmq_vhost, port=proxy.port)
    worker = start_worker(
        concurrency=3,
        extra_env={"DEX_BROKER_URL": proxied, "DEX_SCHEDULE_TO_START": SCHEDULE_TO_START},
    )
    client = dex.client()
    read = client.request_call("s1", "t1", "r", "slow_read", {"seconds": 300})
    write = client.request_call("s1", "t1", "w", "slow_non_idempotent_write", {"seconds": 300})
    wait_started(read.key)
    wait_started(write.key)

    assert proxy.cut() > 0
    deadline = time.monotonic() + 2.0  # the link stays down: the fault itself, not a wait
    while time.monotonic() < deadline:
        time.sleep(0.05)
    proxy.restore()
    wait_for(
        lambda: (refused(dex, read.key) >= 1 and refused(dex, write.key) >= 1) or worker.died(),
        timeout=120,
        what="the redelivered copies of the read and the write to be refused",
    )
    assert not worker.died(), worker.log()[-4000:]
    assert lines(read.key, "end") == [] and lines(write.key, "end") == []

    release_tools(env)
    for key in (read.key, write.key):
        done = wait_finished(dex, key, timeout=60)
        assert done.status is CallStatus.SUCCEEDED, done
        assert done.attempts == 1
        _ran_once(key)


def test_the_private_node_keeps_its_own_files(node: RabbitNode) -> None:
    """The private node's data and logs are in its own folder, never the shared server's."""
    assert Path(node.environ["RABBITMQ_MNESIA_BASE"]).is_relative_to(node.directory)
    assert (node.directory / "log").exists()
    assert node.port != SHARED_PORT
