"""Beat applies the `retention` setting (S12.4; docs/operations.md, "Retention").

The job beat runs (`Retention.run_once`) prunes what ended more than `retention` ago into a new
archive file in `retention_archive`, and nothing when no retention is set; beat's threads
include the retention job exactly when the setting is set.
"""

from __future__ import annotations

import time
from pathlib import Path

from devtools.history_seed import seed_history
from devtools.toolapp import make_app
from dex_celery import Dex, Settings
from dex_celery.processes.beat import BeatServices
from dex_celery.store.archive import read_archive


def deployment(env: dict[str, str], **settings: str) -> Dex:
    _app, dex = make_app(Settings.from_env({**env, **settings}))
    dex.store.create_schema()
    return dex


def test_the_retention_job_prunes_what_ended_before_the_retention(
    env: dict[str, str], tmp_path: Path
) -> None:
    archives = tmp_path / "archives"
    dex = deployment(env, DEX_RETENTION="2d", DEX_RETENTION_ARCHIVE=str(archives))
    now = dex.ledger.now()
    seed_history(dex.store.engine, count=30, requested_at=now - 3 * 86400, prefix="old")
    seed_history(dex.store.engine, count=20, requested_at=now - 86400, prefix="young")

    report = dex.runtime.retention.run_once()
    assert report is not None
    assert (report.calls, report.sessions) == (30, 3)
    (archive,) = archives.iterdir()
    assert report.archive == str(archive)
    keys = {r["key"] for r in read_archive(archive) if r["kind"] == "call"}
    assert len(keys) == 30 and all(k.startswith("old-") for k in keys)
    young, _ = dex.store.snapshot("young-00000000")
    assert len(young) == 10


def test_without_retention_history_is_kept(env: dict[str, str], tmp_path: Path) -> None:
    dex = deployment(env, DEX_RETENTION_ARCHIVE=str(tmp_path / "archives"))
    seed_history(dex.store.engine, count=10, requested_at=time.time() - 400 * 86400)
    assert dex.runtime.retention.run_once() is None
    assert not (tmp_path / "archives").exists()
    assert len(dex.store.snapshot("old-00000000")[0]) == 10


def test_beat_runs_the_retention_job_only_when_retention_is_set(env: dict[str, str]) -> None:
    for retention, expected in ((None, False), ("30d", True)):
        extra = {"DEX_RETENTION": retention} if retention else {}
        dex = deployment(env, DEX_SWEEP_IN_BEAT="0", **extra)
        services = BeatServices(dex, lambda: 3600.0)
        services.start()
        try:
            assert ("dex-retention" in services.running) is expected
        finally:
            services.stop()
