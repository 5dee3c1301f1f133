"""A pool process runs no SQL for a read call (docs/semantics.md: a read is not fenced, so its
claim is the ledger's alone; docs/architecture.md: the outcome goes to the recorder process).

A real prefork worker with one pool process logs every statement each of its processes sends
(`store/statement_trace.py`, `DEX_TESTING_SQL_TRACE`): read calls leave the pool process's log
empty, while a fenced write's claim (the write fence, an UPDATE) shows in it, so the log is
known to see the pool's statements, and the recorder's log holds the outcomes' writes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from devtools.processes import Worker
from dex_celery import CallStatus, Dex
from dex_celery.store.statement_trace import TRACE_ENV, traced_statements
from tests.support.stores.databases import ON_BOTH_DATABASES

pytestmark = [ON_BOTH_DATABASES]


def test_a_read_call_runs_no_sql_in_the_pool_process(
    dex: Dex, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    folder = tmp_path / "sql"
    folder.mkdir()
    worker = start_worker(concurrency=1, extra_env={TRACE_ENV: str(folder)})
    (pool,) = worker.children()
    recorder = worker.recorder()
    assert recorder is not None
    client = dex.client()

    reads = [client.request_call("s1", f"t{i}", "c", "echo", {"q": i}) for i in range(3)]
    done = client.wait([r.key for r in reads], timeout=30)
    assert [d.status for d in done] == [CallStatus.SUCCEEDED] * 3
    assert traced_statements(folder, pool) == [], "the pool process ran SQL for read calls"
    written = traced_statements(folder, recorder)
    assert any("UPDATE" in line.upper() for line in written), written  # the outcomes, there

    write = client.request_call("s1", "tw", "c", "slow_non_idempotent_write", {"seconds": 0})
    (ended,) = client.wait([write.key], timeout=30)
    assert ended.status is CallStatus.SUCCEEDED
    fenced = traced_statements(folder, pool)
    assert any("claim_fence" in line for line in fenced), fenced  # the write fence's UPDATE
