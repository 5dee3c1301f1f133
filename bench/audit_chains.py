"""One audit chain in a total order, or one chain per writer? Measured (docs/benchmarks.md).

Several processes (standing for prefork recorders, threads-pool workers and requesters) each
commit transactions that do a call's work (an INSERT into a table of their own) and append
three audit entries, all at once, for a fixed time:

- `per-writer`: the shipped `AuditLog.append` (each writer's own chain and head row: no row is
  shared between writers);
- `total`: one chain for everyone: the append takes the one head row (an UPDATE, which locks
  it until the commit), numbers and hashes its entries after it, inserts them and sets the new
  head; every writer's transaction waits for the one before it to commit.

Reports transactions per second and each transaction's p50/p99 time, per mode, alternating.

    .venv/bin/python -m bench.audit_chains --database postgres --writers 6 --seconds 8
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
import uuid
from typing import Any

from sqlalchemy import Column, Float, Integer, MetaData, String, Table, create_engine, text, update

from dex_celery.audit.entries import AuditKind, Entry, canonical, entry_hash
from dex_celery.audit.keys import Signer
from dex_celery.store.repository import Store
from dex_celery.store.schema import audit_heads, audit_log

PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
_work_meta = MetaData()
work = Table(
    "bench_work",
    _work_meta,
    Column("id", Integer, primary_key=True),
    Column("w", String(40)),
    Column("at", Float),
)
ENTRIES = 3


def _entries(i: int) -> list[Entry]:
    return [
        Entry(AuditKind.ATTEMPT_CLAIMED, {"n": i, "k": k}, f"s/t/{i}", "s") for k in range(ENTRIES)
    ]


def _total_append(conn: Any, store: Store, entries: list[Entry]) -> None:
    """The total-order variant: the one head row, locked by its UPDATE until the commit."""
    n = len(entries)
    head = audit_heads.c
    seq0, prev = conn.execute(
        update(audit_heads)
        .where(head.writer == "total")
        .values(seq=head.seq + n)
        .returning(head.seq - n, head.hash)
    ).one()
    rows = []
    now = time.time()
    for k, entry in enumerate(entries):
        seq = int(seq0) + k + 1
        body = canonical(dict(entry.body))
        kind = entry.kind.value
        digest = entry_hash(prev, "total", seq, now, kind, entry.call_key, entry.session_id, body)
        rows.append(
            dict(
                writer="total",
                seq=seq,
                at=now,
                kind=kind,
                call_key=entry.call_key,
                session_id=entry.session_id,
                body=body,
                prev=prev,
                hash=digest,
                signature=None,
                key_id=None,
            )
        )
        prev = digest
    signer = store.audit.signer
    rows[-1]["signature"] = signer.sign(prev) if signer is not None else None
    conn.execute(audit_log.insert(), rows)
    conn.execute(update(audit_heads).where(head.writer == "total").values(hash=prev))


def _writer(url: str, schema: str | None, mode: str, seconds: float, start: Any, out: Any) -> None:
    store = Store(url, schema=schema, signer=Signer.generate())
    me = uuid.uuid4().hex[:8]
    times: list[float] = []
    start.wait()
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        with store.engine.begin() as conn:
            conn.execute(work.insert().values(w=me, at=time.time()))
            if mode == "total":
                _total_append(conn, store, _entries(i))
                appended = None
            else:
                appended = store.audit.append(conn, *_entries(i))
        if appended is not None:
            appended.committed()
        times.append(time.perf_counter() - t0)
        i += 1
    out.put(times)


def run(
    url: str, schema: str | None, mode: str, writers: int, seconds: float
) -> tuple[float, float, float]:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(url, schema, mode, seconds, start, out))
        for _ in range(writers)
    ]
    for p in procs:
        p.start()
    time.sleep(1.0)  # every writer connected and waiting
    start.set()
    times = [t for _ in procs for t in out.get()]
    for p in procs:
        p.join()
    q = statistics.quantiles(times, n=100)
    return len(times) / seconds, q[49] * 1000, q[98] * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="postgres")
    parser.add_argument("--writers", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for round_ in range(args.rounds):
        for mode in ("per-writer", "total"):
            if args.database == "sqlite":
                url, schema = f"sqlite:///{tempfile.mkdtemp()}/audit.db", None
            else:
                url, schema = PG, "bench_" + uuid.uuid4().hex[:8]
                with create_engine(PG).begin() as conn:
                    conn.execute(text(f"CREATE SCHEMA {schema}"))
            store = Store(url, schema=schema)
            store.create_schema()
            _work_meta.create_all(store.engine)
            with store.engine.begin() as conn:
                conn.execute(
                    audit_heads.insert().values(writer="total", seq=0, hash="0" * 64, at=0.0)
                )
            store.engine.dispose()
            rate, p50, p99 = run(url, schema, mode, args.writers, args.seconds)
            print(
                f"round {round_ + 1} {args.database} {mode:10s} {args.writers} writers: {rate:7.1f} tx/s  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms",
                flush=True,
            )
            if schema is not None:
                with create_engine(PG).begin() as conn:
                    conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))


if __name__ == "__main__":
    main()
