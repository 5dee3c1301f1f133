"""Where dex-celery's CPU per call goes, process by process and function by function, next to
plain Celery's in the same run.

The throughput bench's two sides (`bench/throughput.py`: plain Celery A, no result backend, and
dex-celery's `noop` read with its record in SQL; task events on, one private redis-server, a
`prefork` worker each), one after the other, every thread of each worker's processes profiled by
CPU time (`bench/thread_profiles.py`), and the requester (this driver: it publishes or
requests, and waits for the completions) likewise. After a warm-up, a snapshot; then `--calls`
calls; then a second snapshot: the difference, divided by the calls, is each function's own
CPU per call in each role (requester, worker main, pool, recorder). A profiler multiplies the
CPU a call costs (two to four times here, more for code of many small calls): the tables say
where the time goes and what dex-celery adds; `bench.cpu_budget` says how much there is.

    .venv/bin/python -m bench.cpu_profile --calls 2000
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import marshal
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from bench import round_trips
from bench.common import RedisServer, header, wait_for, workdir
from bench.thread_profiles import PROFILE_DIR_ENV
from bench.throughput import Setup, _dex, _dex_batch, _plain_batch, _worker

REQUESTER = "requester"
ROLES = (REQUESTER, round_trips.MAIN, round_trips.POOL, round_trips.RECORDER)
PLAIN, DEX = "plain", "dex"
#: A pstats key: (file, line, function).
Func = tuple[str, int, str]


def own_time(stats: dict[Func, Any]) -> Counter[Func]:
    """Own (not cumulative) seconds per function, from a profile's raw stats."""
    return Counter({func: row[2] for func, row in stats.items()})


def snapshot(folder: Path, n: int, pids: dict[int, str]) -> dict[str, Counter[Func]]:
    """Ask every worker process for its profiles; their own time per role."""
    (folder / f"snap-{n}").touch()
    wait_for(
        lambda: all((folder / f"snap{n}-{pid}.done").exists() for pid in pids),
        timeout=60,
        what=f"every worker process to write snapshot {n}",
    )
    out: dict[str, Counter[Func]] = {}
    for pid, role in pids.items():
        for path in folder.glob(f"snap{n}-{pid}-*.prof"):
            out.setdefault(role, Counter()).update(own_time(marshal.loads(path.read_bytes())))
    return out


def label(func: Func) -> str:
    file, line, name = func
    if file == "~":
        return name  # a builtin, as pstats names it
    parts = Path(file).parts
    where = "/".join(parts[parts.index("dex_celery") :]) if "dex_celery" in parts else parts[-1]
    return f"{where}:{line} {name}"


def package(func: Func) -> str:
    """Whose code a function is: a dex-celery room, a library, the standard library, or C."""
    file = func[0]
    if file == "~":
        return "C builtins"
    parts = Path(file).parts
    if "dex_celery" in parts:
        room = parts[parts.index("dex_celery") :]
        return "/".join(room[:2]) if len(room) > 2 else "dex_celery"
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    if "bench" in parts:
        return "bench"
    return "stdlib"


def by_package(spent: Counter[Func]) -> Counter[str]:
    out: Counter[str] = Counter()
    for func, seconds in spent.items():
        out[package(func)] += seconds
    return out


def report(role: str, spent: Counter[Func], calls: int, limit: int) -> None:
    total = sum(spent.values()) / calls * 1e6
    print(f"\n## {role}: {total:,.0f} us per call under the profiler")
    print("| code (own time) | us per call | share |")
    print("|---|---|---|")
    for name, seconds in by_package(spent).most_common(limit):
        us = seconds / calls * 1e6
        print(f"| {name} | {us:,.1f} | {us / total:.1%} |")
    print("\n| function (own time) | us per call | share |")
    print("|---|---|---|")
    for func, seconds in spent.most_common(limit):
        us = seconds / calls * 1e6
        print(f"| {label(func)} | {us:,.1f} | {us / total:.1%} |")


Spent = dict[str, Counter[Func]]


def profiled_run(setup: Setup, side: str, calls: int, warmup: int) -> Spent:
    """One side's worker, profiled: each role's own time per function over `calls`."""
    profiles = setup.folder / f"profiles-{side}"
    profiles.mkdir()
    if side == DEX:
        dx = _dex(setup)  # creates the schema the worker needs

        def batch(n: int) -> None:
            _dex_batch(dx, n, setup.batch)

        module, env = "bench.dex_app", setup.dex_env()
    else:
        os.environ.update(setup.plain_env(backend=False))
        import bench.plain_app as plain

        plain = importlib.reload(plain)  # the run's broker
        client = redis.Redis.from_url(setup.url)

        def batch(n: int) -> None:
            _plain_batch(plain, client, n, backend=False)

        module, env = "bench.plain_app", setup.plain_env(backend=False)
    worker = _worker(setup, module, {**env, PROFILE_DIR_ENV: str(profiles)})
    try:
        assert worker.process is not None
        batch(warmup)
        pids = round_trips.roles(worker.process.pid)
        before = snapshot(profiles, 0, pids)
        requester = cProfile.Profile(time.thread_time)
        requester.enable()
        batch(calls)
        requester.disable()
        after = snapshot(profiles, 1, pids)
    finally:
        worker.stop(warm=True)
    requester.create_stats()
    spent = {role: after[role] - before.get(role, Counter()) for role in after}
    spent[REQUESTER] = own_time(requester.stats)  # type: ignore[attr-defined]
    return spent


def compare(dex: Spent, plain: Spent, calls: int, limit: int) -> None:
    """dex-celery minus plain Celery, per role and by code: where the extra CPU goes."""
    print("\n## dex-celery - plain Celery, own time per call under the profiler")
    print("| role | plain us | dex us | dex - plain | the largest differences by code (us) |")
    print("|---|---|---|---|---|")
    for role in ROLES:
        d = by_package(dex.get(role, Counter()))
        p = by_package(plain.get(role, Counter()))
        diff = {k: (d.get(k, 0.0) - p.get(k, 0.0)) / calls * 1e6 for k in set(d) | set(p)}
        top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:4]
        listed = ", ".join(f"{k} {v:+,.0f}" for k, v in top)
        dt, pt = sum(d.values()) / calls * 1e6, sum(p.values()) / calls * 1e6
        print(f"| {role} | {pt:,.0f} | {dt:,.0f} | {dt - pt:+,.0f} | {listed} |")
    for role in ROLES:
        d, p = dex.get(role, Counter()), plain.get(role, Counter())
        diff = {f: (d.get(f, 0.0) - p.get(f, 0.0)) / calls * 1e6 for f in set(d) | set(p)}
        top = sorted(diff.items(), key=lambda kv: -kv[1])[:limit]
        print(f"\n### {role}: the functions dex-celery spends most more in (own time)")
        print("| function | plain us | dex us | dex - plain |")
        print("|---|---|---|---|")
        for func, delta in top:
            before, now = p.get(func, 0.0) / calls * 1e6, d.get(func, 0.0) / calls * 1e6
            print(f"| {label(func)} | {before:,.1f} | {now:,.1f} | {delta:+,.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--limit", type=int, default=20)
    args = parser.parse_args(argv)
    header("CPU profile per process: plain Celery, then dex-celery, the same no-op")
    folder = workdir("cpu-profile")
    (folder / "sql").mkdir()
    server = RedisServer(folder / "redis").start()
    setup = Setup(
        folder, server, f"sqlite:///{folder / 'dex.db'}", args.concurrency, args.batch, True
    )
    try:
        plain = profiled_run(setup, PLAIN, args.calls, args.warmup)
        dex = profiled_run(setup, DEX, args.calls, args.warmup)
    finally:
        server.kill()
    print(f"{args.calls} calls a side, prefork -c {args.concurrency}, SQLite, task events on")
    for side, spent in ((PLAIN, plain), (DEX, dex)):
        for role in ROLES:
            if role in spent:
                report(f"{side}, {role}", spent[role], args.calls, args.limit)
    compare(dex, plain, args.calls, args.limit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
