"""The attempt's room: what a worker does with one attempt (claim, write fence, run the tool
under its heartbeat and start-to-close watchdog, finish) and how its outcome reaches SQL (the
outcome writer, the recorder's channel); the pause points the crash tests stop a worker at.

This face is what the other rooms and the engine's own face take from the room; its modules are
private to it (`tests/unit/test_architecture.py`).
"""

from dex_celery.engine.attempt.invoke import TRANSIENT_ERRORS, is_async
from dex_celery.engine.attempt.outcome_writer import OutcomeChannel, OutcomeWriter
from dex_celery.engine.attempt.owners import parse_owner
from dex_celery.engine.attempt.pause_points import (
    PAUSE_AT_ENV,
    PAUSE_DIR_ENV,
    PausePoint,
    pause_at,
)
from dex_celery.engine.attempt.shutdown_gate import ShutdownGate
from dex_celery.engine.attempt.worker import Worker

__all__ = [
    "PAUSE_AT_ENV",
    "PAUSE_DIR_ENV",
    "TRANSIENT_ERRORS",
    "OutcomeChannel",
    "OutcomeWriter",
    "PausePoint",
    "ShutdownGate",
    "Worker",
    "is_async",
    "parse_owner",
    "pause_at",
]
