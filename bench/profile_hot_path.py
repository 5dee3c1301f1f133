"""Where the time of one dex-celery call goes: cProfile of the client's requests and of a
`--pool solo` worker (one process, so the profile holds every step of every attempt), plus the
top-level Redis commands per call seen by `MONITOR` (commands run inside Lua scripts excluded).

    .venv/bin/python -m bench.profile_hot_path --calls 2000
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import redis

from bench.common import ROOT, RedisServer, header, workdir
from bench.throughput import Setup, _dex, _dex_batch


def monitor_counts(url: str, stop: threading.Event, out: Counter[str]) -> None:
    """Count top-level commands (not the ones Lua scripts run) until `stop`."""
    client = redis.Redis.from_url(url)
    with client.monitor() as m:
        for entry in m.listen():
            if stop.is_set():
                return
            if entry.get("client_type") == "lua":
                continue
            command = str(entry.get("command", "")).split(" ")[0].lower()
            if command != "monitor":
                out[command] += 1


def print_stats(title: str, path_or_prof: Any, limit: int) -> None:
    stream = io.StringIO()
    stats = pstats.Stats(path_or_prof, stream=stream)
    stats.strip_dirs().sort_stats("tottime").print_stats(limit)
    print(f"## {title}: top {limit} by own time")
    print("\n".join(line for line in stream.getvalue().splitlines() if line.strip())[:6000])
    stream = io.StringIO()
    stats = pstats.Stats(path_or_prof, stream=stream)
    stats.sort_stats("cumulative").print_stats(HOT_PATH)
    print(f"## {title}: the steps of the hot path, cumulative")
    rows = [ln for ln in stream.getvalue().splitlines() if "(" in ln and "/" in ln]
    print("\n".join(rows[:30]))


#: Functions of the per-call path whose cumulative time is reported.
HOT_PATH = (
    r"(worker.py.*\((run|_execute)\)|invoke.py.*\((invoke_attempt)\)|ledger.py.*\((open|claim|finish|recorded)\)"
    r"|repository.py.*\((insert_calls|record_outcome)\)|dispatch.py.*\((request|start|publish"
    r"|apply|record)\)|base.py.*\(send_task\)|trace.py.*\(trace_task\)"
    r"|repository.py.*\(engine\)|base.py.*\(begin\))"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--monitor-calls", type=int, default=200)
    parser.add_argument("--limit", type=int, default=25)
    args = parser.parse_args(argv)
    header("profile of the dex-celery hot path")
    folder = workdir("profile")
    (folder / "sql").mkdir()
    server = RedisServer(folder / "redis").start()
    setup = Setup(folder, server, f"sqlite:///{folder / 'dex.db'}", 1, args.batch)
    dx = _dex(setup)
    prof_path = folder / "worker.prof"
    env = {**setup.dex_env()}
    import os

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            str(prof_path),
            "-m",
            "celery",
            "-A",
            "bench.dex_app",
            "worker",
            "-P",
            "solo",
            "-l",
            "warning",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # Top-level commands per call, with MONITOR on (a separate, untimed run).
        counts: Counter[str] = Counter()
        stop = threading.Event()
        thread = threading.Thread(target=monitor_counts, args=(server.url, stop, counts))
        thread.start()
        time.sleep(0.5)
        _dex_batch(dx, args.monitor_calls, args.batch)
        stop.set()
        redis.Redis.from_url(server.url).ping()  # wake the monitor loop
        thread.join(timeout=10)
        total = sum(counts.values())
        print(
            f"## top-level Redis commands per call (MONITOR, {args.monitor_calls} calls, "
            "worker and client, the worker's idle BRPOP polling included)"
        )
        print(
            f"total {total / args.monitor_calls:.2f}: "
            + ", ".join(f"{k} {v / args.monitor_calls:.2f}" for k, v in counts.most_common(12))
        )
        # The client's own cost per call without the profiler, against plain Celery's `delay()`
        # of the same no-op on the same broker (nothing consumes it: publishing only).
        t0 = time.perf_counter()
        _dex_batch_requests_only(dx, args.calls, args.batch, session="bare")
        bare = (time.perf_counter() - t0) / args.calls
        os.environ.update({"BENCH_BROKER_URL": server.url, "BENCH_QUEUE": "unconsumed"})
        from bench import plain_app

        t0 = time.perf_counter()
        for _ in range(args.calls):
            plain_app.noop.delay()
        plain = (time.perf_counter() - t0) / args.calls
        print(
            f"client cost per call, no profiler: dex request_calls {bare * 1e3:.3f} ms, "
            f"plain delay() {plain * 1e3:.3f} ms"
        )
        client_prof = cProfile.Profile()
        t0 = time.perf_counter()
        client_prof.enable()
        _dex_batch_requests_only(dx, args.calls, args.batch)
        client_prof.disable()
        t1 = time.perf_counter()
        _wait_all(dx, 2 * args.calls + args.monitor_calls)
        t2 = time.perf_counter()
        print(
            f"client: {args.calls} requests in {t1 - t0:.2f}s "
            f"({(t1 - t0) / args.calls * 1e3:.3f} ms/call, profiler on); "
            f"solo worker done {t2 - t0:.2f}s after the first request"
        )
        print_stats("client (request_calls)", client_prof, args.limit)
    finally:
        import os as _os
        import signal

        _os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        server.kill()
    print_stats("worker (--pool solo, whole run)", str(prof_path), args.limit)
    return 0


def _dex_batch_requests_only(dx: Any, n: int, batch: int, session: str = "prof") -> None:
    from dex_celery.engine.request.dispatch import CallRequest

    client = dx.client()
    for start in range(0, n, batch):
        client.request_calls(
            [
                CallRequest(session, f"t{start // batch}", f"c{i}", "noop", {})
                for i in range(start, min(n, start + batch))
            ]
        )


def _wait_all(dx: Any, n: int) -> None:
    from sqlalchemy import func, select

    from bench.common import wait_for
    from dex_celery.store.schema import tool_calls

    query = select(func.count()).select_from(tool_calls).where(tool_calls.c.status == "succeeded")

    def done() -> bool:
        with dx.store.engine.connect() as conn:
            return int(conn.execute(query).scalar_one()) >= n

    wait_for(done, timeout=600, what="every profiled call to finish", interval=0.05)


if __name__ == "__main__":
    raise SystemExit(main())
