"""Plain Celery, the baseline: the same no-op as a plain task, on the same Redis and worker.

Configured from the environment so one module serves every variant:
- `BENCH_BROKER_URL`: the private redis-server of the run.
- `BENCH_RESULT_BACKEND`: empty for variant (a) (no result backend, `ignore_result`), a Redis
  URL for variant (b) (results stored, `task_track_started` on).
- `BENCH_ACKS_LATE`: `1` for late acknowledgement (the default here, as dex-celery's `read`).
- `BENCH_COUNTER_URL`: the Redis of the completion counter and run log (default: the broker,
  which must then be a Redis; set it when the broker is RabbitMQ, `bench/capacity.py`).
- `BENCH_VISIBILITY_TIMEOUT`: seconds; a short Kombu visibility timeout with a 1 s restore sweep
  (detection benchmark, late ack).

Without a result backend, completions are counted by the task itself (`INCR` of
`BENCH_COUNTER_KEY`), so the baseline pays one Redis round trip per call for being observable.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from bench import thread_profiles
from bench.common import announce_ready

thread_profiles.arm_from_env()  # `bench.cpu_profile` only: inert unless BENCH_PROFILE_DIR is set

BROKER = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6399/0")
BACKEND = os.environ.get("BENCH_RESULT_BACKEND") or None
COUNTER_KEY = os.environ.get("BENCH_COUNTER_KEY", "bench:plain:done")
COUNTER_URL = os.environ.get("BENCH_COUNTER_URL") or BROKER
RUNS_KEY = "bench:plain:runs"

app = Celery("bench_plain", broker=BROKER, backend=BACKEND)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    task_acks_late=os.environ.get("BENCH_ACKS_LATE", "1") == "1",
    task_reject_on_worker_lost=False,
    task_ignore_result=BACKEND is None,
    task_track_started=BACKEND is not None,
    broker_connection_retry_on_startup=True,
    # Task events as on the dex-celery side of the same run (`--task-events`).
    worker_send_task_events=os.environ.get("BENCH_TASK_EVENTS", "0") == "1",
    task_send_sent_event=os.environ.get("BENCH_TASK_EVENTS", "0") == "1",
    # A queue of its own (`BENCH_QUEUE`), so a dex worker alive at the same time never takes it.
    task_default_queue=os.environ.get("BENCH_QUEUE", "celery"),
)
visibility = os.environ.get("BENCH_VISIBILITY_TIMEOUT")
if visibility:
    app.conf.broker_transport_options = {
        "visibility_timeout": float(visibility),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }

_client: dict[int, redis.Redis] = {}


def _redis() -> redis.Redis:
    pid = os.getpid()
    if pid not in _client:
        _client.clear()
        _client[pid] = redis.Redis.from_url(COUNTER_URL)
    return _client[pid]


@app.task(name="bench.noop")
def noop() -> None:
    if BACKEND is None:
        _redis().incr(COUNTER_KEY)


@app.task(name="bench.hold")
def hold(tag: str, seconds: float) -> Any:
    """Runs `seconds`; records each run (`RPUSH bench:plain:runs tag`) so re-runs are visible."""
    _redis().rpush(RUNS_KEY, f"start {tag} {os.getpid()} {time.time()}")
    time.sleep(seconds)
    _redis().rpush(RUNS_KEY, f"end {tag} {os.getpid()} {time.time()}")
    return tag


announce_ready()
