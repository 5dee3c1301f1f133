"""Named points of an attempt where a worker can be made to stop, so a crash test can SIGKILL it
exactly there (the user's kit `dex_celery.testing`, docs/testing.md, and the project's own
crash tests drive it).

Inert unless `DEX_TESTING_PAUSE_AT` names points (comma-separated) in the worker's environment,
which only a test sets: then a process reaching a named point writes a marker file
`<point>-<pid>-<key>` into `DEX_TESTING_PAUSE_DIR` (its content: the call's key) and blocks until
`release-<point>` appears there or `DEX_TESTING_PAUSE_TIMEOUT` seconds pass. The test waits for
the marker, reads the pid from its name and kills that process. When off, a point costs one
call of a cached function and a set lookup: no I/O, no environment read.

The points, in the order an attempt reaches them (docs/ledger.md, "Crash table"; docs/testing.md):

- `before_claim`: delivered to a worker process, not claimed; the tool has not run (S4.2).
- `before_hold`: the claim met a write freeze (S13.2) and took the call out of the ledger; the
  call is not yet held for a person (still `pending`) and its tool has not run.
- `tool_started`: claimed (and, for a write, fenced in SQL); the tool's code is about to run.
- `in_tool`: inside the tool, where it says so (`dex_celery.testing.effects.record` calls
  `pause_at(IN_TOOL)` right after writing its side effect): the effect happened, the tool has
  not returned.
- `after_tool`: the tool returned; the ledger has not been told (no finish yet).
- `before_record`: the ledger decided the outcome; the process's outcome writer has not written
  it to SQL (the sweeper records it after `unrecorded_grace`).
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from enum import StrEnum
from pathlib import Path

from dex_celery.errors import ConfigurationError

PAUSE_AT_ENV = "DEX_TESTING_PAUSE_AT"
PAUSE_DIR_ENV = "DEX_TESTING_PAUSE_DIR"
PAUSE_TIMEOUT_ENV = "DEX_TESTING_PAUSE_TIMEOUT"
#: How long a paused process waits for its kill (or release) before it carries on.
DEFAULT_TIMEOUT = 300.0


class PausePoint(StrEnum):
    BEFORE_CLAIM = "before_claim"
    BEFORE_HOLD = "before_hold"
    TOOL_STARTED = "tool_started"
    IN_TOOL = "in_tool"
    AFTER_TOOL = "after_tool"
    BEFORE_RECORD = "before_record"


@functools.cache
def armed() -> frozenset[str]:
    """The points this process pauses at (read once; `armed.cache_clear()` after a change)."""
    named = {p.strip() for p in os.environ.get(PAUSE_AT_ENV, "").split(",") if p.strip()}
    unknown = named - {p.value for p in PausePoint}
    if unknown:
        raise ConfigurationError(f"{PAUSE_AT_ENV}: no pause point {sorted(unknown)}")
    return frozenset(named)


def pause_dir() -> Path:
    return Path(os.environ.get(PAUSE_DIR_ENV) or Path(tempfile.gettempdir()) / "dex-pause")


def marker_name(point: PausePoint, pid: int, key: str) -> str:
    safe = key.replace("/", "__").replace("#", "-")
    return f"{point.value}-{pid}-{safe}"


def pause_at(point: PausePoint, key: str) -> None:
    """Block here if the environment names `point` (a test hook; see the module docstring)."""
    if point.value not in armed():
        return
    folder = pause_dir()
    folder.mkdir(parents=True, exist_ok=True)
    hold(
        folder / marker_name(point, os.getpid(), key),
        folder / f"release-{point.value}",
        float(os.environ.get(PAUSE_TIMEOUT_ENV) or DEFAULT_TIMEOUT),
        key,
    )


def hold(marker: Path, release: Path, timeout: float, content: str = "") -> None:
    """Write `marker` (whole, by rename), then wait for `release` or `timeout` seconds."""
    partial = marker.with_name(f".{marker.name}.partial")
    partial.write_text(content or str(os.getpid()))
    partial.replace(marker)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not release.exists():
        time.sleep(0.05)
