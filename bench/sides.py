"""The three sides of the agent-shaped latency benchmarks (`bench/per_step.py`,
`bench/agent_turn.py`): dex-celery, plain Celery with a Redis result backend, and DBOS, asked
one unit (a step, a turn) at a time, each unit waited for before the next, as an agent loop does.

One private redis-server and one database for the run (`bench/throughput.py`'s `Setup` and
`database`), the two Celery workers (`bench/dex_app.py`, and `bench/plain_app.py` on a queue of
its own, as `bench/latency.py` runs them) up for the whole run; the DBOS worker
(`bench/peers.py`'s `DbosPeer`, on the PostgreSQL the tests use) only during its own sessions,
since its queue polls PostgreSQL every `--dbos-poll` s even when idle and would load the Celery
sides' sessions. Each timed session counts the network reads redis-server processed (`INFO
stats`, `total_reads_processed`: one per round trip a client made, a pipeline being one) and the
commands it ran (`INFO commandstats`, commands inside scripts included); `commands_by_role`
attributes the commands clients sent to the process that sent them (`bench/round_trips.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from bench import round_trips
from bench.agent_shaped import _not_succeeded
from bench.common import (
    BenchWorker,
    CeleryWorker,
    RedisServer,
    median,
    percentile,
    spawn_elsewhere,
    start_worker,
    workdir,
)
from bench.peers import SKIP_MESSAGE, DbosPeer, _plain_url, dbos_available
from bench.throughput import Setup, _dex, database

PLAIN, DEX, DBOS = "plain", "dex", "dbos"
#: This driver, in `commands_by_role`.
REQUESTER = "requester"


def reads_and_commands(client: redis.Redis) -> tuple[int, int]:
    """redis-server's network reads processed and commands run so far (one `INFO`)."""
    info: Any = client.info("stats", "commandstats")
    commands = sum(int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_"))
    return int(info["total_reads_processed"]), commands


@dataclass
class Session:
    """One timed session of one side: each unit's seconds, the wall, Redis's counts."""

    side: str
    times: list[float]
    wall: float
    reads: int
    commands: int


@dataclass
class Sides:
    """The run's Redis, database, Celery workers and (if it can run) DBOS peer."""

    setup: Setup
    dx: Any
    plain: Any  # `bench.plain_app`, reloaded with its result backend and queue
    workers: dict[str, CeleryWorker]
    peer: DbosPeer | None
    skipped: str | None  # why DBOS is left out, when it is
    redis: redis.Redis = field(init=False)
    #: Network reads per second redis-server processes with nothing asked (idle workers).
    idle_reads: float = 0.0

    def __post_init__(self) -> None:
        self.redis = redis.Redis.from_url(self.setup.url)

    @property
    def names(self) -> tuple[str, ...]:
        return (PLAIN, DEX, DBOS) if self.peer is not None else (PLAIN, DEX)

    def measure_idle(self, window: float) -> None:
        """The idle workers' own reads (Kombu's `BRPOP` timeouts), over `window` seconds."""
        r0, _ = reads_and_commands(self.redis)
        t0 = time.perf_counter()
        time.sleep(window)  # the measured window itself, not a synchronisation
        r1, _ = reads_and_commands(self.redis)
        self.idle_reads = (r1 - r0 - 1) / (time.perf_counter() - t0)

    def timed(self, side: str, units: int, one: Callable[[int], None], warmup: int) -> Session:
        """`warmup` untimed units, then `units` timed ones, one after the other."""
        if side == DBOS:
            assert self.peer is not None
            self.peer.start()  # outside the timed part, as `bench/peers.py` does
        try:
            for i in range(warmup):
                one(-1 - i)
            r0, c0 = reads_and_commands(self.redis)
            times = []
            t0 = time.perf_counter()
            for i in range(units):
                a = time.perf_counter()
                one(i)
                times.append(time.perf_counter() - a)
            wall = time.perf_counter() - t0
            r1, c1 = reads_and_commands(self.redis)
        finally:
            if side == DBOS:
                assert self.peer is not None
                self.peer.stop()
        # The second INFO's read, and the first INFO's command, fall inside the deltas.
        return Session(side, times, wall, r1 - r0 - 1, c1 - c0 - 1)

    def commands_by_role(self, side: str, run: Callable[[], None]) -> dict[str, Counter[str]]:
        """The commands each process sent while `run` ran, under `MONITOR` (untimed)."""
        pids = round_trips.roles(self.workers[side].pid)
        pids[os.getpid()] = REQUESTER
        with round_trips.monitored(self.setup.url) as sent:
            run()
            ports = round_trips.owners(pids)
        return round_trips.by_role(sent, ports)


def dbos_peer(folder: Any, concurrency: int, poll: float) -> tuple[DbosPeer | None, str | None]:
    """The DBOS peer on the tests' PostgreSQL, or why it cannot run here."""
    if not dbos_available():
        return None, SKIP_MESSAGE
    from devtools.pg_schema import DEFAULT_POSTGRES_URL

    base = os.environ.get("DEX_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    engine = create_engine(base, poolclass=NullPool, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as e:
        return None, (
            f"DBOS skipped: PostgreSQL at {_plain_url(base)} is not reachable "
            f"({type(e).__name__}); measuring dex-celery and plain Celery only"
        )
    finally:
        engine.dispose()
    return DbosPeer(folder, _plain_url(base), concurrency, poll), None


@contextlib.contextmanager
def started(
    name: str,
    *,
    kind: str,
    pool: str,
    concurrency: int,
    dbos: bool,
    dbos_concurrency: int,
    dbos_poll: float,
) -> Iterator[Sides]:
    """Everything up (DBOS's worker excepted: `Sides.timed` starts it), torn down after."""
    folder = workdir(name)
    (folder / "sql").mkdir()
    with spawn_elsewhere():
        server = RedisServer(folder / "redis").start()
    try:
        with database(kind, folder) as url:
            setup = Setup(folder, server, url, concurrency, 1, pool=pool)
            plain_env = {**setup.plain_env(backend=True), "BENCH_QUEUE": "plain"}
            os.environ.update(plain_env)
            import bench.plain_app as plain_app

            plain_app = importlib.reload(plain_app)  # with the result backend, on its own queue
            dx = _dex(setup)
            peer, skipped = (
                dbos_peer(folder, dbos_concurrency, dbos_poll)
                if dbos
                else (None, "DBOS skipped: --no-dbos")
            )
            workers: dict[str, CeleryWorker] = {}
            try:
                workers[DEX] = start_worker(
                    BenchWorker("bench.dex_app", setup.dex_env(), folder, concurrency, pool)
                )
                workers[PLAIN] = start_worker(
                    BenchWorker(
                        "bench.plain_app",
                        plain_env,
                        folder,
                        concurrency,
                        pool,
                        extra_args=("-Q", "plain"),
                    )
                )
                yield Sides(setup, dx, plain_app, workers, peer, skipped)
            finally:
                for w in workers.values():
                    w.stop(warm=True)
                if peer is not None:
                    peer.close()
    finally:
        server.kill()


def add_side_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every side-by-side bench takes: the database, the Celery pool, DBOS's, and the
    window the idle background is measured over."""
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--pool", choices=("prefork", "threads"), default="prefork")
    parser.add_argument("--concurrency", type=int, default=2, help="Celery pool size")
    parser.add_argument("--dbos-concurrency", type=int, default=8, help="DBOS worker threads")
    parser.add_argument("--dbos-poll", type=float, default=0.01, help="DBOS polling interval s")
    parser.add_argument("--no-dbos", action="store_true", help="leave DBOS out")
    parser.add_argument(
        "--idle",
        type=float,
        default=2.0,
        help="seconds over which the idle workers' background reads are measured",
    )


def started_for(name: str, args: argparse.Namespace) -> contextlib.AbstractContextManager[Sides]:
    """`started` with the options of `add_side_arguments`."""
    return started(
        name,
        kind=args.database,
        pool=args.pool,
        concurrency=args.concurrency,
        dbos=not args.no_dbos,
        dbos_concurrency=args.dbos_concurrency,
        dbos_poll=args.dbos_poll,
    )


def timed_rounds(
    sides: Sides,
    args: argparse.Namespace,
    count: int,
    unit: str,
    make: Callable[[str], tuple[Callable[[int], None], str | None]],
) -> list[Session]:
    """`args.rounds` interleaved rounds of `count` units a side (`make(side)`: the unit and,
    for dex, its session, whose calls must all have succeeded), after the idle background is
    measured; each round printed as it ends."""
    if sides.skipped:
        print(sides.skipped, flush=True)
    sides.measure_idle(args.idle)
    sessions: list[Session] = []
    for r, side in interleaved(sides, args.rounds):
        one, session = make(side)
        done = sides.timed(side, count, one, args.warmup)
        if session is not None and (failed := _not_succeeded(sides.dx, session)):
            raise SystemExit(f"dex calls did not all succeed: {failed}")
        sessions.append(done)
        print(
            f"round {r + 1} {side:>5}: {done.wall:6.2f} s for {count} {unit}s "
            f"({done.wall / count * 1e3:6.2f} ms/{unit})",
            flush=True,
        )
    return sessions


def setup_line(args: argparse.Namespace, sides: Sides) -> str:
    """The run's database, pool and DBOS settings, for the summary."""
    line = f"database {args.database}; Celery {args.pool} -c {args.concurrency}, task events off"
    if DBOS in sides.names:
        line += (
            f"; DBOS worker concurrency {args.dbos_concurrency}, polling "
            f"{args.dbos_poll * 1000:.0f} ms"
        )
    return line


def new_session() -> str:
    return f"s{uuid.uuid4().hex[:12]}"


def interleaved(sides: Sides, rounds: int) -> Iterator[tuple[int, str]]:
    """(round, side) in the order they run: every side each round, the order rotating by one
    each round so no side always follows the same one."""
    names = sides.names
    for r in range(rounds):
        for k in range(len(names)):
            yield r, names[(r + k) % len(names)]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:7.2f}"


def latency_lines(sessions: list[Session], names: tuple[str, ...], unit: str) -> list[str]:
    """p50 / p99 / mean of each side's units over every round, the median wall of a session,
    and the ratios against plain Celery (and dex against DBOS) taken in the same run."""
    by = {n: [s for s in sessions if s.side == n] for n in names}
    times = {n: [t for s in by[n] for t in s.times] for n in names}
    walls = {n: [s.wall for s in by[n]] for n in names}
    out = [
        f"| side | {unit} p50 ms | {unit} p99 ms | {unit} mean ms | session wall s "
        "(median of rounds) |",
        "|---|---|---|---|---|",
    ]
    for n in names:
        t = times[n]
        out.append(
            f"| {n} | {ms(percentile(t, 50))} | {ms(percentile(t, 99))} | "
            f"{ms(sum(t) / len(t))} | {median(walls[n]):.2f} |"
        )
    pairs = [(DEX, PLAIN)] + ([(DBOS, PLAIN), (DEX, DBOS)] if DBOS in names else [])
    for a, b in pairs:
        per_round = [x / y for x, y in zip(walls[a], walls[b], strict=True)]
        out.append(
            f"ratio {a}/{b}: p50 {percentile(times[a], 50) / percentile(times[b], 50):.2f}  "
            f"p99 {percentile(times[a], 99) / percentile(times[b], 99):.2f}  "
            f"mean {sum(times[a]) / len(times[a]) / (sum(times[b]) / len(times[b])):.2f}  "
            f"wall: median of rounds {median(per_round):.2f} (per round "
            + " ".join(f"{x:.2f}" for x in per_round)
            + ")"
        )
    return out


def redis_lines(sides: Sides, sessions: list[Session], unit: str) -> list[str]:
    """Network round trips (reads processed) and commands per unit, each Celery side, over its
    timed sessions; the idle workers' background reads are subtracted and shown."""
    out = []
    for n in (PLAIN, DEX):
        done = [s for s in sessions if s.side == n]
        units = sum(len(s.times) for s in done)
        background = sides.idle_reads * sum(s.wall for s in done)
        reads = (sum(s.reads for s in done) - background) / units
        commands = sum(s.commands for s in done) / units
        out.append(
            f"redis {n:>5}: {reads:5.2f} network round trips/{unit}, {commands:5.2f} commands/"
            f"{unit} run (scripts' own commands included)"
        )
    out.append(
        f"(idle workers' background, subtracted above: {sides.idle_reads:.2f} reads/s; "
        "DBOS uses no Redis)"
    )
    return out


def role_table(counted: dict[str, dict[str, Counter[str]]], units: int, unit: str) -> list[str]:
    """Commands sent per unit by each process (`MONITOR`), each Celery side a column."""
    roles = [REQUESTER, round_trips.MAIN, round_trips.POOL, round_trips.RECORDER, "other"]
    out = [f"| process (commands sent per {unit}) | plain | dex |", "|---|---|---|"]
    for role in [*roles, "total"]:
        cells = []
        for side in (PLAIN, DEX):
            by_role = counted[side]
            if role == "total":
                sent = Counter[str]()
                for c in by_role.values():
                    sent.update(c)
            else:
                sent = by_role.get(role, Counter())
            top = ", ".join(f"{k} {v / units:.2f}" for k, v in sent.most_common(4))
            cells.append(f"{sum(sent.values()) / units:.2f}" + (f" ({top})" if top else ""))
        out.append(f"| {role} | {cells[0]} | {cells[1]} |")
    return out
