"""The chaos run: calls of all four effect classes while workers and Redis are killed.

- `--calls` calls (default 2,000) of the four `chaos_<effect>` tools (`bench/chaos_app.py`), with
  a mix of durations (most instant, some up to 2 s), requested in turns of up to 10 while at most
  `--window` calls are in flight;
- `--workers` Celery workers (`prefork -c --concurrency`), each in its own process group;
- a killer that every ~2 s SIGKILLs either a random worker's whole process group (then starts it
  again) or one random pool child (its parent replaces it);
- one restart of the private redis-server (`--appendonly yes`, `--appendfsync` as given): SIGKILL,
  then start again on the same folder and port, partway through the run;
- one rollback of Redis to an older snapshot (`--snapshot-rollback`, on by default; S10.2): later
  in the run the append-only file is turned off and a snapshot taken (`SAVE`, the stock
  configuration's RDB file); `--rollback-after` seconds later, with calls requested, claimed,
  run and decided meanwhile, redis-server is SIGKILLed and started again on the same port from
  that dump, so the ledger and the broker both come back older than what they acknowledged
  (consumed messages queued again, claims and outcomes gone, messages published since gone);
  the append-only file is then turned back on and the run goes on;
- the sweeper loop in this process.

`--cluster` puts the ledger on a real local Redis Cluster (three primaries with a replica each,
`--shards` shards; docs/redis.md, "Redis Cluster") and keeps the private redis-server as the
broker only. The Redis restart then becomes a failover of one primary of the cluster (SIGKILL,
its replica promoted with `CLUSTER FAILOVER TAKEOVER`), and the snapshot rollback is left out
(a cluster node restarted from an older snapshot is what a failover to a lagging replica does).

At the end it checks, from SQL, the ledger and the tools' own log, and prints the results:
1. every call has exactly one terminal record (a terminal status and one tool-result message);
2. no `non_idempotent_write` / `unclassified` tool ran twice for one key;
3. no call recorded with the did-not-run error ran;
4. every `read` call with attempts left succeeded;
5. every `outcome_unknown` call was interrupted after its claim (a start without an end in the
   tool log, a claimed attempt in its attempt log, or, after a rollback, a write's claim that
   the database holds: the ledger that knew how it ended is gone; with `--cluster`, a call
   recorded in an older life of its shard, which the failover renewed, for the same reason);
6. every succeeded call's tool logged an end.
Exit status 1 on any violation.

    .venv/bin/python -m bench.chaos                 # 2,000 calls
    .venv/bin/python -m bench.chaos --calls 200 --kill-every 1.5   # short
    .venv/bin/python -m bench.chaos --no-snapshot-rollback        # kills and the restart only
    .venv/bin/python -m bench.chaos --cluster --calls 2000        # the ledger on a Redis Cluster
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import func, select

from bench.common import BenchWorker, CeleryWorker, RedisServer, header, wait_for, workdir
from devtools.redis_cluster import RedisClusterNodes
from dex_celery import EffectClass, Settings
from dex_celery.engine.request.dispatch import CallRequest
from dex_celery.engine.upkeep.sweep import run_forever
from dex_celery.model.outcomes import DID_NOT_RUN
from dex_celery.store.schema import messages, tool_calls

TIMINGS = {
    "DEX_HEARTBEAT_TIMEOUT": "2",
    "DEX_SWEEP_INTERVAL": "0.5",
    "DEX_SCHEDULE_TO_START": "30",
    "DEX_UNRECORDED_GRACE": "2",
    "DEX_ORPHAN_GRACE": "5",
    "DEX_BACKOFF_INITIAL": "0.2",
    "DEX_BACKOFF_MAX": "2",
}


class Rollback:
    """Redis comes back from an older snapshot: RDB only for that phase, as the stock
    configuration runs (S10.2)."""

    def __init__(self, server: RedisServer, after: float, log_path: Path) -> None:
        self.server = server
        self.after = after
        self.log_path = log_path
        self.executions_at_snapshot = 0
        self.taken_at: float | None = None
        self.sent_at_snapshot = 0
        self.done = False

    def due(self) -> bool:
        return (
            self.taken_at is not None
            and not self.done
            and time.monotonic() - self.taken_at >= self.after
        )

    def snapshot(self, sent: int) -> None:
        """Turn the append-only file off and take the snapshot the restart will load."""
        client = redis.Redis(port=self.server.port)
        client.config_set("appendonly", "no")
        client.save()
        self.taken_at = time.monotonic()
        self.sent_at_snapshot = sent
        self.executions_at_snapshot = self._executions()
        print(f"  redis snapshot taken ({sent} calls requested; append-only file off)", flush=True)

    def _executions(self) -> int:
        if not self.log_path.exists():
            return 0
        return sum(1 for line in self.log_path.read_text().splitlines() if line.startswith("start"))

    def roll_back(self, sent: int, in_flight: int) -> None:
        """SIGKILL redis-server and start it on the same port from the older snapshot."""
        assert self.taken_at is not None
        age = time.monotonic() - self.taken_at
        self.server.kill()
        unknown_runs = self._executions() - self.executions_at_snapshot
        self.server.appendonly = False  # load the dump, not the newer append-only file
        self.server.start()
        redis.Redis(port=self.server.port).config_set("appendonly", "yes")
        self.server.appendonly = True
        self.done = True
        print(
            f"  redis-server restarted from the snapshot taken {age:.1f}s earlier "
            f"({sent - self.sent_at_snapshot} calls requested and {unknown_runs} tool executions "
            f"started since it; {in_flight} calls in flight)",
            flush=True,
        )


class Killer(threading.Thread):
    """Every ~`every` s: SIGKILL a worker's process group (and restart it) or one pool child."""

    def __init__(self, workers: list[CeleryWorker], every: float) -> None:
        super().__init__(name="killer", daemon=True)
        self.workers = workers
        self.every = every
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.kills: Counter[str] = Counter()

    def run(self) -> None:
        while not self.stop.wait(random.uniform(0.75, 1.25) * self.every):
            with self.lock:
                i = random.randrange(len(self.workers))
                worker = self.workers[i]
                children = worker.children()
                if random.random() < 0.5 or not children:
                    worker.kill_all()
                    self.kills["worker (whole group)"] += 1
                    try:
                        self.workers[i] = BenchWorker(
                            worker.app, worker.env, worker.ready_dir.parent, worker.concurrency
                        ).start(timeout=90)
                    except Exception as e:
                        print(f"  killer: restart failed: {e}", flush=True)
                else:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(random.choice(children), signal.SIGKILL)
                    self.kills["pool child"] += 1

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=120)


def duration() -> float:
    r = random.random()
    if r < 0.7:
        return 0.0
    if r < 0.95:
        return round(random.uniform(0.02, 0.2), 3)
    return round(random.uniform(0.5, 2.0), 3)


def plan(calls: int) -> list[CallRequest]:
    effects = list(EffectClass)
    out = []
    for i in range(calls):
        effect = effects[i % 4]
        out.append(
            CallRequest(
                f"chaos{i // 100}",
                f"t{i // 10}",
                f"c{i}",
                f"chaos_{effect.value}",
                {"seconds": duration(), "n": i},
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--kill-every", type=float, default=2.0)
    parser.add_argument("--window", type=int, default=40, help="calls in flight at most")
    parser.add_argument(
        "--redis-restart-at",
        type=float,
        default=0.4,
        help="fraction of the calls requested when Redis is restarted",
    )
    parser.add_argument("--appendfsync", choices=("always", "everysec"), default="always")
    parser.add_argument(
        "--snapshot-rollback",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="restart Redis once from an older snapshot (RDB, no append-only file) mid-run",
    )
    parser.add_argument(
        "--snapshot-at",
        type=float,
        default=0.6,
        help="fraction of the calls requested when the snapshot is taken",
    )
    parser.add_argument(
        "--rollback-after",
        type=float,
        default=4.0,
        help="seconds after the snapshot when Redis is killed and restarted from it",
    )
    parser.add_argument("--settle", type=float, default=300, help="seconds to wait at the end")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="the ledger on a local Redis Cluster (3 primaries + 3 replicas); the restart is a "
        "failover of one primary; no snapshot rollback",
    )
    parser.add_argument("--shards", type=int, default=3, help="ledger shards with --cluster")
    parser.add_argument(
        "--schedule-to-start",
        type=float,
        default=30.0,
        help="seconds an attempt may wait for a worker (a message lost with a killed worker "
        "before its claim ends or is retried after this)",
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    random.seed(seed)
    header(f"chaos run (seed {seed})")
    folder = workdir("chaos")
    # The sweeper logs every Redis error of the restart; keep them out of the report.
    logging.basicConfig(filename=folder / "driver.log", level=logging.INFO)
    server = RedisServer(folder / "redis", appendonly=True, appendfsync=args.appendfsync)
    server.start()
    cluster: RedisClusterNodes | None = None
    ledger_env = {"DEX_REDIS_URL": server.url}
    if args.cluster:
        args.snapshot_rollback = False
        cluster = RedisClusterNodes(folder / "cluster").start()
        ledger_env = {
            "DEX_REDIS_URL": cluster.url,
            "DEX_BROKER_URL": server.url,
            "DEX_LEDGER_SHARDS": str(args.shards),
        }
    log_path = folder / "tool-side-effects.log"
    env = {
        **ledger_env,
        "DEX_DATABASE_URL": f"sqlite:///{folder / 'dex.db'}",
        "DEX_KEY_PREFIX": "chaos",
        "CHAOS_LOG": str(log_path),
        **TIMINGS,
        "DEX_SCHEDULE_TO_START": str(args.schedule_to_start),
    }
    os.environ.update(env)
    from bench.chaos_app import build

    _app, dx = build(Settings.from_env(env), "chaos_client")
    dx.store.create_schema()
    stop_sweep = threading.Event()
    sweeper = threading.Thread(
        target=run_forever, args=(dx,), kwargs={"stop": stop_sweep}, daemon=True
    )
    workers = [
        BenchWorker("bench.chaos_app", env, folder, args.concurrency).start(timeout=90)
        for _ in range(args.workers)
    ]
    killer = Killer(workers, args.kill_every)
    requests = plan(args.calls)
    keys = [f"{r.session_id}/{r.turn_id}/{r.tool_call_id}" for r in requests]
    restarted = False
    #: The shards a failover renewed (--cluster).
    held: set[int] = set()
    rollback = Rollback(server, args.rollback_after, log_path) if args.snapshot_rollback else None
    t0 = time.monotonic()
    try:
        sweeper.start()
        killer.start()
        sent = 0
        while sent < len(requests):
            if not restarted and sent >= args.redis_restart_at * len(requests):
                restarted = True
                if cluster is not None:
                    held = fail_over(cluster, dx, sent)
                else:
                    print(f"  restarting redis-server ({sent} calls requested)", flush=True)
                    server.kill()
                    time.sleep(1.0)
                    server.start()
            if rollback and rollback.taken_at is None and sent >= args.snapshot_at * len(requests):
                rollback.snapshot(sent)
            if rollback and rollback.due():
                rollback.roll_back(sent, sent - terminal_count(dx))
            if sent - terminal_count(dx) >= args.window:
                time.sleep(0.05)
                continue
            batch = [r for r in requests[sent : sent + 10] if r.turn_id == requests[sent].turn_id]
            try:
                dx.client().request_calls(batch)
            except Exception as e:
                print(f"  request failed ({type(e).__name__}); retrying the same ids", flush=True)
                time.sleep(0.5)
                continue
            sent += len(batch)
            if sent % 200 == 0:
                print(
                    f"  {sent} requested, {terminal_count(dx)} ended, {time.monotonic() - t0:.0f}s",
                    flush=True,
                )
        if rollback and not rollback.done:
            if rollback.taken_at is None:
                rollback.snapshot(sent)
            wait_for(rollback.due, timeout=args.rollback_after + 1, what="the rollback")
            rollback.roll_back(sent, sent - terminal_count(dx))
        killer.finish()
        print(
            f"  all requested in {time.monotonic() - t0:.0f}s; kills {dict(killer.kills)}; "
            "waiting for every call to end",
            flush=True,
        )
        wait_for(
            lambda: terminal_count(dx) >= len(requests),
            timeout=args.settle,
            what="every call to end",
            interval=0.5,
        )
    finally:
        killer.stop.set()
        for w in killer.workers:
            w.stop(warm=True)
        stop_sweep.set()
        sweeper.join(timeout=30)
    elapsed = time.monotonic() - t0
    try:
        violations = check(dx, keys, log_path, held)
    finally:
        server.kill()
        if cluster is not None:
            cluster.kill()
    what = "cluster primary failovers" if cluster is not None else "redis restarts"
    print(
        f"run took {elapsed:.0f}s; kills {dict(killer.kills)}; {what} "
        f"{int(restarted)} (appendfsync {args.appendfsync}); rollbacks to an older snapshot "
        f"{int(bool(rollback and rollback.done))}; workers {args.workers} x "
        f"prefork -c {args.concurrency}; folder {folder}"
    )
    return 1 if violations else 0


def fail_over(cluster: RedisClusterNodes, dx: Any, sent: int) -> set[int]:
    """SIGKILL the primary of shard 0 and promote its replica: the shards it held start a new
    life (their calls in flight are judged from the database), the others go on."""
    primary = cluster.primary_of(dx.keys.shard(0).epoch)
    held = [s.index for s in dx.keys.all_shards if cluster.primary_of(s.epoch) is primary]
    promoted = cluster.fail_over(primary)
    print(
        f"  cluster primary :{primary.port} killed, replica :{promoted.port} promoted "
        f"({sent} calls requested; shards {held} on it)",
        flush=True,
    )
    return set(held)


def terminal_count(dx: Any) -> int:
    query = (
        select(func.count())
        .select_from(tool_calls)
        .where(tool_calls.c.status.in_(("succeeded", "failed", "rejected", "outcome_unknown")))
    )
    with dx.store.engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def check(dx: Any, keys: list[str], log_path: Path, renewed_shards: set[int] | None = None) -> int:
    """`renewed_shards`: ledger shards a failover of their cluster primary renewed. A call of
    theirs recorded in the older life (its recorded epoch is not the final one) may have reached
    a worker there: that life is gone, so its `outcome_unknown` is the conservative judgement
    (S10.2), not a fault."""
    renewed_shards = renewed_shards or set()
    final_epoch = dx.runtime.epoch.recorded(dx.runtime.epoch.current(refresh=True))
    runs: dict[str, list[tuple[str, int]]] = defaultdict(list)
    if log_path.exists():
        for line in log_path.read_text().splitlines():
            what, key, attempt, _pid = line.split()
            runs[key].append((what, int(attempt)))
    with dx.store.engine.connect() as conn:
        rows = {r["key"]: dict(r) for r in conn.execute(select(tool_calls)).mappings()}
        tool_messages = Counter(
            r[0] for r in conn.execute(select(messages.c.call_key).where(messages.c.role == "tool"))
        )
    finished_events: Counter[str] = Counter()
    for _id, fields in (
        entry for shard in dx.keys.all_shards for entry in dx.ledger.client.xrange(shard.events)
    ):
        if fields.get("type") == "tool_call_finished":
            finished_events[fields.get("key")] += 1
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    problems: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        row = rows.get(key)
        if row is None or row["status"] not in (
            "succeeded",
            "failed",
            "rejected",
            "outcome_unknown",
        ):
            problems["1 exactly one terminal record"].append(f"{key}: {row and row['status']}")
            continue
        effect, status = row["effect"], row["status"]
        counts[effect][status] += 1
        if tool_messages[key] != 1:
            problems["1 exactly one terminal record"].append(
                f"{key}: {tool_messages[key]} tool messages"
            )
        starts = [a for what, a in runs[key] if what == "start"]
        ends = [a for what, a in runs[key] if what == "end"]
        if effect in ("non_idempotent_write", "unclassified") and len(starts) > 1:
            problems["2 writes ran at most once"].append(f"{key}: ran {len(starts)} times")
        if (row["error"] or "").startswith(DID_NOT_RUN) and starts:
            problems["3 did-not-run calls did not run"].append(f"{key}: ran {len(starts)} times")
        max_attempts = json.loads(row["policy"])["max_attempts"]
        if effect == "read" and status != "succeeded" and row["attempts"] < max_attempts:
            problems["4 reads with attempts left succeeded"].append(
                f"{key}: {status} after {row['attempts']} of {max_attempts}"
            )
        if status == "outcome_unknown":
            # A start with no end of its own: counted per attempt number, since a ledger
            # rolled back to an older snapshot may run the same attempt number again.
            interrupted = bool(Counter(starts) - Counter(ends))
            log = json.loads(row["attempt_log"] or "[]")
            claimed = any(e.get("claimed_at") for e in log) or row.get("claimed_by") is not None
            renewed = dx.keys.shard_of(key) in renewed_shards and row["ledger_epoch"] != final_epoch
            if not (interrupted or claimed or renewed):
                problems["5 unknown outcomes were interrupted after a claim"].append(
                    f"{key}: starts {starts} ends {sorted(ends)} log {log}"
                )
        if status == "succeeded" and not ends:
            problems["6 succeeded calls ran to their end"].append(key)
    print()
    print(
        f"{'effect class':<22} "
        + " ".join(f"{s:>16}" for s in ("succeeded", "failed", "outcome_unknown", "did_not_run"))
    )
    for effect in EffectClass:
        c = counts[effect.value]
        dnr = sum(
            1
            for k in keys
            if rows.get(k, {}).get("effect") == effect.value
            and (rows[k]["error"] or "").startswith(DID_NOT_RUN)
        )
        print(
            f"{effect.value:<22} "
            + " ".join(f"{c[s]:>16}" for s in ("succeeded", "failed", "outcome_unknown"))
            + f" {dnr:>16}"
        )
    total_runs = sum(1 for k in keys for what, _ in runs[k] if what == "start")
    retried = sum(1 for k in keys if rows.get(k, {}).get("attempts", 0) > 1)
    print(
        f"calls {len(keys)}, tool executions {total_runs}, calls with more than one attempt "
        f"{retried}, late results {sum(1 for k in keys if rows.get(k, {}).get('late_result'))}"
    )
    dup_events = sum(1 for k in keys if finished_events[k] != 1)
    no_event = sum(1 for k in keys if finished_events[k] == 0)
    print(
        f"(info) calls without exactly one tool_call_finished event in the stream: {dup_events} "
        f"({no_event} with none)"
    )
    names = [
        "1 exactly one terminal record",
        "2 writes ran at most once",
        "3 did-not-run calls did not run",
        "4 reads with attempts left succeeded",
        "5 unknown outcomes were interrupted after a claim",
        "6 succeeded calls ran to their end",
    ]
    violations = 0
    for name in names:
        found = problems.get(name, [])
        violations += len(found)
        print(f"invariant {name}: {'OK' if not found else f'VIOLATED ({len(found)})'}")
        for item in found[:5]:
            print(f"    {item}")
    return violations


if __name__ == "__main__":
    raise SystemExit(main())
