"""`celery worker -B`: the embedded beat starts each of dex-celery's beat threads exactly once.

Celery sends both `beat_init` and `beat_embedded_init` to an embedded beat; dex-celery's beat
side (`dex_celery/processes/beat.py`) listens to `beat_init` only and starts at most once per
process, so one sweeper, one reconcile loop, one webhook sender and one retention job run (docs/architecture.md,
"Process wiring"). Real worker with `-B`, real Redis; the threads announce themselves in the log.
"""

from __future__ import annotations

from pathlib import Path

from devtools.processes import Worker, wait_for
from devtools.toolapp import LOG_ENV
from dex_celery import Dex
from dex_celery.engine.counters import last_sweep

STARTS = {
    "sweeper": "the dex sweeper runs every",
    "reconcile": "reconciling outcome_unknown calls every",
    "webhooks": "webhooks: sending to",
    "retention": "removing history older than",
}


def test_worker_with_embedded_beat_starts_one_of_each_beat_thread(
    dex: Dex, env: dict[str, str], tmp_path: Path
) -> None:
    hook_env = {
        # Nothing listens there: the sender only needs to be configured to start.
        "DEX_WEBHOOK_URLS": "http://127.0.0.1:9/hooks",
        "DEX_RECONCILE_INTERVAL": "0.5",
        "DEX_RETENTION": "30d",
        "DEX_RETENTION_ARCHIVE": str(tmp_path / "archive"),
    }
    worker = Worker(
        {**env, **hook_env},
        Path(env[LOG_ENV]),
        concurrency=1,
        extra_args=("-B", "-s", str(tmp_path / "beat-schedule")),
    ).start()
    try:
        wait_for(
            lambda: all(line in worker.log() for line in STARTS.values()),
            timeout=30,
            what="the embedded beat's threads to announce themselves",
        )
        # Both signals are sent before beat's loop starts; two sweeps later the second one is
        # long handled, so whatever it was going to start has announced itself by now.
        first = last_sweep(dex.ledger)
        wait_for(
            lambda: (
                (s := last_sweep(dex.ledger)) is not None
                and (first is None or s.finished_at > first.finished_at)
            ),
            timeout=15,
            what="two sweeps of the embedded beat",
        )
        log = worker.log()
        counts = {name: log.count(line) for name, line in STARTS.items()}
        assert counts == {"sweeper": 1, "reconcile": 1, "webhooks": 1, "retention": 1}, log[-3000:]
        # The retention job ran its first prune at start (nothing old to remove).
        wait_for(
            lambda: "history prune: removed 0 calls" in worker.log(),
            timeout=15,
            what="the retention job's first prune",
        )
    finally:
        worker.stop()
