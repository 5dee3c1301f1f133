"""A side-effect counter for the user's own tool body, independent of dex-celery's record.

The tool calls `effects.record("charge", ctx.idempotency_key)` where its real effect happens;
the test asks `effects.count("charge", key)`. Each record is one line appended (and fsynced) to
`$DEX_TESTING_EFFECTS_DIR/<name>/<key>` by the process that ran the tool, so a count survives
that process's SIGKILL and says how many times the body really ran, whatever the ledger or SQL
say. Outside a test (the variable unset) `record` does nothing.

`record` is also the `in_tool` pause point (dex_celery/engine/attempt/pause_points.py): a worker started
by the kit to stop there blocks right after the effect was counted, before the tool returns.
"""

from __future__ import annotations

import os
from pathlib import Path

from dex_celery.engine import PausePoint, pause_at
from dex_celery.errors import ConfigurationError

EFFECTS_DIR_ENV = "DEX_TESTING_EFFECTS_DIR"


def _folder() -> Path | None:
    value = os.environ.get(EFFECTS_DIR_ENV)
    return Path(value) if value else None


def _file(folder: Path, name: str, key: str) -> Path:
    return folder / name / key.replace("/", "__")


def record(name: str, key: str) -> None:
    """Count one effect `name` of the call `key` (its idempotency key), then pause if asked."""
    folder = _folder()
    if folder is None:
        return
    path = _file(folder, name, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(f"{os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())
    pause_at(PausePoint.IN_TOOL, key)


def count(name: str, key: str | None = None) -> int:
    """How many times effect `name` happened: for the call `key`, or for all calls."""
    folder = _folder()
    if folder is None:
        raise ConfigurationError(
            f"{EFFECTS_DIR_ENV} is not set: enable the pytest plugin dex_celery.testing"
        )
    if key is not None:
        path = _file(folder, name, key)
        return len(path.read_text().splitlines()) if path.exists() else 0
    base = folder / name
    if not base.exists():
        return 0
    return sum(len(p.read_text().splitlines()) for p in base.iterdir())
