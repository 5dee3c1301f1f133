"""Requester CPU: what `DexClient.request_call` costs the calling process, against plain Celery's
`delay()` (with a Redis result backend, as in `bench/latency.py`), warm, without workers.

Blocks of `--block` calls alternate (dex, plain, dex, plain ...) on one private redis-server and
SQLite; no worker runs, so the messages wait in their queues and only the requester's own CPU is
measured (`time.process_time`, user and system). Reports per-call CPU, the minimum and median
over blocks (the minimum is the block least disturbed by other processes on a shared machine)
and the median of the per-block differences. `--phases` adds where a dex request's CPU goes
(each step's own `process_time`, summed over the calls of one more run).

    .venv/bin/python -m bench.requester_cpu --rounds 30 --block 100
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.common import RedisServer, header, spawn_elsewhere, workdir
from bench.throughput import Setup, _dex

#: (owner module, attribute path, label) of the steps `--phases` times.
_PHASES = (
    ("dex_celery.engine.request.dispatch", "Dispatcher.check", "check: ids, tool, arguments, seal"),
    ("dex_celery.store.calls", "CallRecords.insert_calls", "SQL transaction (insert_calls)"),
    ("dex_celery.store.calls", "session_default", "  session's default effect (read)"),
    (
        "dex_celery.engine.request.opening",
        "Opener.start_new",
        "open and publish (start_new)",
    ),
    (
        "dex_celery.engine.request.opening",
        "Opener._captured",
        "  the message, built by Celery",
    ),
    ("dex_celery.ledger.ledger", "Ledger.open_replies", "  open script (EVALSHA)"),
    ("dex_celery.engine.steps", "Steps.publish", "  publish after open (Celery)"),
)


def _timed(spent: collections.Counter[str]) -> None:
    """Wrap each step of `_PHASES` that exists to add its CPU seconds to `spent`."""
    import importlib

    for module_name, path, label in _PHASES:
        owner: Any = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        fn = getattr(owner, name, None)
        if fn is None:
            continue

        def wrapped(*a: Any, _fn: Callable[..., Any] = fn, _l: str = label, **k: Any) -> Any:
            t0 = time.process_time()
            try:
                return _fn(*a, **k)
            finally:
                spent[_l] += time.process_time() - t0

        setattr(owner, name, functools.wraps(fn)(wrapped))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--phases", action="store_true")
    args = parser.parse_args(argv)
    header("requester cpu: request_call against plain delay(), no workers")
    folder = workdir("requester-cpu")
    (folder / "sql").mkdir()
    with spawn_elsewhere():
        server = RedisServer(folder / "redis").start()
    try:
        setup = Setup(folder, server, f"sqlite:///{folder / 'dex.db'}", 2, 1)
        os.environ.update({**setup.plain_env(backend=True), "BENCH_QUEUE": "plain"})
        from bench import plain_app

        dx = _dex(setup)
        client = dx.client()
        session = f"r{uuid.uuid4().hex[:8]}"
        for i in range(200):  # warm up both
            client.request_call(session, f"w{i}", "c", "noop", {})
            plain_app.noop.delay()
        dex: list[float] = []
        plain: list[float] = []
        for r in range(args.rounds):
            t0 = time.process_time()
            for i in range(args.block):
                client.request_call(session, f"r{r}-{i}", "c", "noop", {})
            dex.append((time.process_time() - t0) / args.block)
            t0 = time.process_time()
            for _ in range(args.block):
                plain_app.noop.delay()
            plain.append((time.process_time() - t0) / args.block)
        diff = statistics.median(d - p for d, p in zip(dex, plain, strict=True))
        print(
            f"dex request_call: min {min(dex) * 1e6:5.0f} us  median "
            f"{statistics.median(dex) * 1e6:5.0f} us\n"
            f"plain delay()   : min {min(plain) * 1e6:5.0f} us  median "
            f"{statistics.median(plain) * 1e6:5.0f} us\n"
            f"dex - plain     : of the minima {(min(dex) - min(plain)) * 1e6:5.0f} us  median "
            f"of the blocks {diff * 1e6:5.0f} us"
        )
        if args.phases:
            spent: collections.Counter[str] = collections.Counter()
            _timed(spent)
            calls = args.block * 10
            t0 = time.process_time()
            for i in range(calls):
                client.request_call(session, f"p{i}", "c", "noop", {})
            total = time.process_time() - t0
            print(f"phases over {calls} calls: request_call {total / calls * 1e6:.0f} us")
            for _module, _path, label in _PHASES:
                if label in spent:
                    print(f"  {label:40s} {spent[label] / calls * 1e6:6.0f} us")
        print(f"load at the end {os.getloadavg()[0]:.2f}")
    finally:
        server.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
