"""The Redis round trips of a call, per process, through a real prefork worker (docs/benchmarks.md,
section 15).

A pool process's hot path is `claim`, the tool, `finish`: two script round trips and nothing
else. Its outcome reaches the recorder through a pipe, and the recorder announces a batch of
outcomes at once. On a private redis-server under `MONITOR`, each command a client sent (not the
ones a script runs inside Redis) is put down to the process that holds its socket
(`bench/round_trips.py`); a change that adds a Redis command to the pool's path, or takes the
recorder's work back into the pool, fails here instead of showing up as a slower benchmark.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bench import round_trips
from bench.dex_app import build
from bench.throughput import Setup, _dex_batch, _worker
from devtools.processes import RedisServer
from dex_celery import Settings

CALLS = 120
#: Besides one command per call: a connection's health-check `PING` (one per 30 s of use), and
#: the recorder's reading of the ledger's clock (`now.lua`, at most every 2 s).
SLACK = 3


def test_the_pool_sends_two_commands_per_call_and_the_recorder_at_most_one(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path / "redis").start()
    (tmp_path / "sql").mkdir()
    try:
        setup = Setup(tmp_path, server, f"sqlite:///{tmp_path / 'dex.db'}", 2, 40)
        settings = Settings(
            redis_url=server.url,
            database_url=setup.database_url,
            key_prefix="bench",
            task_events=True,
        )
        _app, dx = build(settings, "bench_client")
        dx.store.create_schema()
        worker = _worker(setup, "bench.dex_app", setup.dex_env())
        assert worker.process is not None
        try:
            _dex_batch(dx, 20, 20)  # scripts loaded, connections open
            pids = round_trips.roles(worker.process.pid)
            assert sorted(pids.values()).count(round_trips.POOL) == 2
            with round_trips.monitored(server.url) as sent:
                _dex_batch(dx, CALLS, 40)
                ports = round_trips.owners(pids)
        finally:
            worker.stop(warm=True)
    finally:
        server.kill()
    counted = round_trips.by_role(sent, ports)
    pool = counted.get(round_trips.POOL, Counter())
    assert pool["evalsha"] == 2 * CALLS, pool  # claim and finish, nothing more
    assert set(pool) <= {"evalsha", "ping"}, pool
    assert sum(pool.values()) <= 2 * CALLS + SLACK, pool
    recorder = counted.get(round_trips.RECORDER, Counter())
    # `recorded` of each outcome, pipelined per batch: at most one command per call.
    assert set(recorder) <= {"evalsha", "ping"}, recorder
    assert CALLS <= recorder["evalsha"] <= CALLS + SLACK, recorder
    assert sum(recorder.values()) <= CALLS + SLACK, recorder
