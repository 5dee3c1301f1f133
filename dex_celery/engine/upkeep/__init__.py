"""The upkeep room: what moves the calls nobody else moves (the sweeper), settles unknown
outcomes (reconcile, S8), bounds history (retention, S12.4) and holds writes (the write freeze,
S13.2).

This face is what the engine's own face takes from the room; its modules are private to it
(`tests/unit/test_architecture.py`).
"""

from dex_celery.engine.upkeep.freeze import WriteFreezeControl
from dex_celery.engine.upkeep.reconcile import (
    RECONCILE_TASK,
    AnyOutcomeCheck,
    CannotTellYet,
    DidNotRun,
    OutcomeCheck,
    OutcomeChecks,
    Reconciler,
    ReconcileReport,
    SessionMessenger,
    WentThrough,
    reconcile_once,
    report_unknown_outcomes,
)
from dex_celery.engine.upkeep.retention import PruneReport, Retention, archive_path, prune
from dex_celery.engine.upkeep.sweep import Sweeper, run_forever

__all__ = [
    "RECONCILE_TASK",
    "AnyOutcomeCheck",
    "CannotTellYet",
    "DidNotRun",
    "OutcomeCheck",
    "OutcomeChecks",
    "PruneReport",
    "ReconcileReport",
    "Reconciler",
    "Retention",
    "SessionMessenger",
    "Sweeper",
    "WentThrough",
    "WriteFreezeControl",
    "archive_path",
    "prune",
    "reconcile_once",
    "report_unknown_outcomes",
    "run_forever",
]
