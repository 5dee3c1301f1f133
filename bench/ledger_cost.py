"""The ledger's own cost per successful call, without Celery: `open`, `claim`, `finish` and
`recorded` (the four scripts of a call that succeeds at once) in a loop against a private
redis-server, one client, nothing else running on it.

Reports, per call: Redis commands (`INFO commandstats`, the scripts' inner commands included, as
in `bench.throughput`), redis-server CPU (`INFO cpu`), the wall time of the four round trips, and
the median time Redis spends inside each script (`SLOWLOG` with a threshold of 0 over the last
1,000 calls: the server's own measurement, free of the client's and the network's share).
It isolates what the Lua scripts and `Ledger` cost from Celery, SQL and the other processes that
share the machine in `bench.throughput`.

    .venv/bin/python -m bench.ledger_cost --calls 20000
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections import defaultdict

import redis

from bench.common import (
    RedisServer,
    commandstats,
    header,
    pin_driver,
    redis_cpu,
    spawn_elsewhere,
    stats_delta,
    workdir,
)
from dex_celery.ledger.keys import KeySpace
from dex_celery.ledger.ledger import Cause, Ledger
from dex_celery.model.policy import EffectClass, ToolPolicy, resolve_policy
from dex_celery.settings import Settings

#: A read with the default policy, resolved as a tool registration resolves it.
SNAPSHOT = resolve_policy(ToolPolicy(effect=EffectClass.READ), None, None, Settings())


def one_call(ledger: Ledger, key: str, epoch: str) -> None:
    ledger.open(key, SNAPSHOT, epoch=epoch)
    fence = uuid.uuid4().hex
    assert ledger.claim(key, 1, owner="bench", fence=fence).ok
    step = ledger.finish(key, 1, fence=fence, cause=Cause.OK, payload="{}")
    assert step.status == "succeeded", step
    assert ledger.recorded(key, status="succeeded", error="")


def script_times(client: redis.Redis, ledger: Ledger, calls: int = 1000) -> dict[str, float]:
    """Median microseconds Redis spends running each script of a successful call."""
    # The registered scripts' SHA1s: a benchmark may look inside the ledger it measures.
    names = {ledger._scripts[name].sha: name for name in ("open", "claim", "finish", "recorded")}
    client.config_set("slowlog-max-len", 4 * calls + 100)
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    try:
        for i in range(calls):
            one_call(ledger, f"s{i}", "e1")
    finally:
        client.config_set("slowlog-log-slower-than", 10_000)
    times: dict[str, list[float]] = defaultdict(list)
    for entry in client.slowlog_get(4 * calls + 100):
        command = entry["command"]
        words = (command.decode() if isinstance(command, bytes) else str(command)).split(" ")
        if words[0].upper() == "EVALSHA" and words[1] in names:
            times[names[words[1]]].append(float(entry["duration"]))
    return {name: statistics.median(times[name]) for name in names.values() if times[name]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--driver-cpu", type=int, default=None, help="as in bench.throughput")
    args = parser.parse_args(argv)
    pin_driver(args.driver_cpu)
    header("ledger cost: open + claim + finish + recorded per successful call, no Celery")
    folder = workdir("ledger-cost")
    with spawn_elsewhere():
        server = RedisServer(folder / "redis").start()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        ledger = Ledger(client, keys=KeySpace("bench"))
        epoch = "e1"
        ledger.rotate(expected_dataset="", dataset="bench", epoch=epoch)
        for i in range(args.warmup):
            one_call(ledger, f"w{i}", epoch)
        before, cpu0 = commandstats(client), redis_cpu(client)
        t0 = time.perf_counter()
        for i in range(args.calls):
            one_call(ledger, f"c{i}", epoch)
        seconds = time.perf_counter() - t0
        cpu = redis_cpu(client) - cpu0
        delta = stats_delta(before, commandstats(client))
        delta.pop("info", None)
        inside = script_times(client, ledger)
    finally:
        server.kill()
    n = args.calls
    top = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(delta.items(), key=lambda kv: -kv[1]))
    print(f"{n} calls")
    print(f"redis commands/call: {sum(delta.values()) / n:.2f} ({top})")
    print(f"redis-server cpu: {cpu / n * 1e6:.1f} us/call")
    print(f"wall: {seconds / n * 1e6:.1f} us/call (four round trips, one client)")
    parts = ", ".join(f"{name} {us:.0f}" for name, us in inside.items())
    print(f"inside redis, median us per script: {parts}; sum {sum(inside.values()):.0f} us/call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
