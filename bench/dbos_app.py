"""The DBOS peer's worker (bench/peers.py): one process running a durable queue of no-op
workflows, each with one no-op step, on the same PostgreSQL as dex-celery.

Run as `python -m bench.dbos_app`; configured by variables (set by `bench/peers.py`):
`BENCH_DBOS_URL` (the system database), `BENCH_DBOS_SCHEMA` (its own schema, so it never meets
dex-celery's tables), `BENCH_DBOS_CONCURRENCY` (the queue's worker concurrency),
`BENCH_DBOS_POLL` (seconds between the queue's polls) and `BENCH_READY_DIR` (where it drops
`ready-<pid>` once the queue is registered and listened to). Workflows are enqueued from another
process (the driver, through `DBOSClient`), the way a web process hands work to a worker.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from dbos import DBOS

QUEUE = "dex_bench"
WORKFLOW = "noop_workflow"


@DBOS.step()
def noop_step() -> None:
    """The one step of each workflow: no work, but checkpointed like any step."""


@DBOS.workflow(name=WORKFLOW)
def noop_workflow() -> str:
    noop_step()
    return "ok"


def config() -> Any:
    return {
        "name": "dex_bench_peer",
        "system_database_url": os.environ["BENCH_DBOS_URL"],
        "dbos_system_schema": os.environ["BENCH_DBOS_SCHEMA"],
        "log_level": "WARNING",
    }


def main() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    DBOS(config=config())
    DBOS.launch()
    DBOS.register_queue(
        QUEUE,
        worker_concurrency=int(os.environ.get("BENCH_DBOS_CONCURRENCY", "8")),
        polling_interval_sec=float(os.environ.get("BENCH_DBOS_POLL", "0.01")),
        on_conflict="always_update",
    )
    folder = os.environ.get("BENCH_READY_DIR")
    if folder:
        (Path(folder) / f"ready-{os.getpid()}").write_text(str(time.time()))
    stop.wait()
    DBOS.destroy()


if __name__ == "__main__":
    main()
