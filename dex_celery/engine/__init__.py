"""The life of a call: request, attempts, the worker's task body, outcomes, sweeps, approvals,
reconciliation. This module is the engine's public face: the rest of `dex_celery` imports the
engine from here and from nowhere else (`tests/unit/test_architecture.py`).

Behind it, three rooms, each with a face of its own that is all the other rooms see of it
(docs/architecture.md, "The engine's rooms"):

- `request/`: requests become records and first attempts; a person's decisions (approvals,
  previews);
- `attempt/`: a worker's attempt, claim to finish, and the outcome writer;
- `upkeep/`: the sweeper, reconcile, retention, the write freeze;

and, at this level, what every room uses (`steps.py`: the one place a ledger step becomes an
action; `epoch.py`, `decided_outcomes.py`, `tracing.py`, `task_events.py`, `counters.py`,
`held_back_evidence.py`) and the wiring: `runtime.py` builds this process's components once and
hands each its collaborators (`preview_worker.py`, `worker_starts.py` act from a `Runtime`).
Nothing here imports the façade (`dex_celery.app`), the CLI, the web app or the operators' side.
"""

from dex_celery.engine.attempt import (
    PAUSE_AT_ENV,
    PAUSE_DIR_ENV,
    OutcomeChannel,
    PausePoint,
    ShutdownGate,
    parse_owner,
    pause_at,
)
from dex_celery.engine.counters import (
    CLAIMS_REFUSED,
    SQL_WRITE_ERRORS,
    last_sweep,
    stats_fields,
    with_prefix,
)
from dex_celery.engine.decided_outcomes import decided, decided_step
from dex_celery.engine.epoch import LedgerEpoch
from dex_celery.engine.held_back_evidence import repeat_evidence
from dex_celery.engine.preview_worker import register_preview_task
from dex_celery.engine.request import (
    DEFAULT_LIST_LIMIT,
    Approvals,
    CallRequest,
    Dispatcher,
    PendingApproval,
    asettled_preview,
    check_preview,
    preview_pending,
    settled_preview,
    shown_preview,
)
from dex_celery.engine.runtime import Runtime, RuntimeSource
from dex_celery.engine.task_events import AttemptFailed
from dex_celery.engine.upkeep import (
    RECONCILE_TASK,
    AnyOutcomeCheck,
    CannotTellYet,
    DidNotRun,
    OutcomeCheck,
    OutcomeChecks,
    PruneReport,
    Reconciler,
    ReconcileReport,
    SessionMessenger,
    Sweeper,
    WentThrough,
    WriteFreezeControl,
    archive_path,
    prune,
    reconcile_once,
    report_unknown_outcomes,
    run_forever,
)
from dex_celery.engine.worker_starts import SILENT_WINDOW, WorkerStart, read_starts, record_start

__all__ = [
    "CLAIMS_REFUSED",
    "DEFAULT_LIST_LIMIT",
    "PAUSE_AT_ENV",
    "PAUSE_DIR_ENV",
    "RECONCILE_TASK",
    "SILENT_WINDOW",
    "SQL_WRITE_ERRORS",
    "AnyOutcomeCheck",
    "Approvals",
    "AttemptFailed",
    "CallRequest",
    "CannotTellYet",
    "DidNotRun",
    "Dispatcher",
    "LedgerEpoch",
    "OutcomeChannel",
    "OutcomeCheck",
    "OutcomeChecks",
    "PausePoint",
    "PendingApproval",
    "PruneReport",
    "ReconcileReport",
    "Reconciler",
    "Runtime",
    "RuntimeSource",
    "SessionMessenger",
    "ShutdownGate",
    "Sweeper",
    "WentThrough",
    "WorkerStart",
    "WriteFreezeControl",
    "archive_path",
    "asettled_preview",
    "check_preview",
    "decided",
    "decided_step",
    "last_sweep",
    "parse_owner",
    "pause_at",
    "preview_pending",
    "prune",
    "read_starts",
    "reconcile_once",
    "record_start",
    "register_preview_task",
    "repeat_evidence",
    "report_unknown_outcomes",
    "run_forever",
    "settled_preview",
    "shown_preview",
    "stats_fields",
    "with_prefix",
]
