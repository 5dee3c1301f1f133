"""Memory: Redis bytes per in-flight attempt, and back to baseline once finished entries expire.

Opens and claims N attempts through the ledger (the scripts a real call runs: open, claim), then
finishes and records them (finish, recorded) with a short `finished_ttl`, and waits for the
entries to expire. Reports `MEMORY USAGE` of one call hash (enqueued, running, finished) and
`INFO memory` used_memory deltas. The events stream (capped at `events_maxlen`, shared by all
calls) grows with every transition; it is reported apart. Broker messages are Celery's and are
not counted here.

    .venv/bin/python -m bench.memory --attempts 10000
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

import redis

from bench.common import RedisServer, header, wait_for, workdir
from dex_celery.ledger.keys import KeySpace
from dex_celery.ledger.ledger import Cause, Ledger
from dex_celery.model.policy import EffectClass, ToolPolicy, resolve_policy
from dex_celery.settings import Settings


def used(client: redis.Redis) -> int:
    info: Any = client.info("memory")
    return int(info["used_memory"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=10_000)
    parser.add_argument("--finished-ttl", type=int, default=2)
    args = parser.parse_args(argv)
    header("memory: Redis bytes per in-flight attempt")
    folder = workdir("memory")
    server = RedisServer(folder / "redis").start()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        keys = KeySpace(f"m{uuid.uuid4().hex[:6]}")
        ledger = Ledger(client, keys=keys, finished_ttl=args.finished_ttl)
        snapshot = resolve_policy(ToolPolicy(effect=EffectClass.READ), {}, None, Settings())
        epoch = "bench"
        ledger.rotate(expected_dataset="", dataset="bench", epoch=epoch)
        call_keys = [
            f"session-{i // 100:05d}/turn-{i % 100:03d}/call-1" for i in range(args.attempts)
        ]
        client.memory_purge()
        base = used(client)
        for key in call_keys:
            ledger.open(key, snapshot, epoch=epoch)
        sample = keys.call(call_keys[0])
        enqueued_hash = client.memory_usage(sample, samples=0)
        stream_after_open = client.memory_usage(keys.events, samples=0) or 0
        after_open = used(client)
        for i, key in enumerate(call_keys):
            ledger.claim(key, 1, owner=f"worker-host:{1000 + i % 4}", fence=uuid.uuid4().hex)
        running_hash = client.memory_usage(sample, samples=0)
        stream = client.memory_usage(keys.events, samples=0) or 0
        after_claim = used(client)
        n = args.attempts
        print(f"{n:,} attempts; baseline used_memory {base:,} bytes")
        print(
            f"enqueued: used_memory +{(after_open - base) / n:.0f} B/attempt "
            f"(+{(after_open - base - stream_after_open) / n:.0f} without the events stream); "
            f"MEMORY USAGE of one call hash {enqueued_hash} B"
        )
        in_flight = (after_claim - base - stream) / n
        print(
            f"running:  used_memory +{(after_claim - base) / n:.0f} B/attempt "
            f"(+{in_flight:.0f} without the events stream, "
            f"{'ok' if in_flight <= 1024 else 'MISSES'} target <= 1024); "
            f"MEMORY USAGE of one call hash {running_hash} B; events stream {stream:,} B"
        )
        for key in call_keys:
            entry = client.hget(keys.call(key), "fence")
            step = ledger.finish(key, 1, fence=str(entry), cause=Cause.OK, payload="null")
            assert step.status == "succeeded", step
            ledger.recorded(key, status="succeeded", error="")
        finished_hash = client.memory_usage(sample, samples=0)
        after_finish = used(client)
        print(
            f"finished (TTL {args.finished_ttl}s): used_memory +{(after_finish - base) / n:.0f} "
            f"B/attempt; MEMORY USAGE of one finished call hash {finished_hash} B"
        )
        wait_for(lambda: client.exists(sample) == 0, timeout=60, what="finished entries to expire")
        wait_for(
            lambda: client.dbsize() <= 3,
            timeout=120,
            what="every finished entry to expire",
            interval=0.5,
        )
        time.sleep(0.5)
        client.memory_purge()
        stream = client.memory_usage(keys.events, samples=0) or 0
        end = used(client)
        print(
            f"after expiry: keys left {client.dbsize()} (epoch, dataset marker, events stream); used_memory "
            f"{end - base:+,} bytes vs baseline, of which the events stream {stream:,} B "
            f"({client.xlen(keys.events):,} events, capped at events_maxlen); "
            f"without the stream {end - base - stream:+,} B"
        )
    finally:
        server.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
