"""Greenlets writing to SQLite in one gevent-patched process (a `-P gevent` worker's pool) never
stall each other (docs/operations.md, "Worker pools and SQLite").

SQLite makes a writer that meets another's write lock wait in its C busy handler, where gevent
cannot switch: if the greenlet holding the lock yields inside its transaction (a Redis round
trip), the waiting greenlet holds the process's only thread, the holder never runs again, and
after SQLite's 30 s busy timeout the waiter fails `database is locked`. The audit entry of a
record is written in the record's transaction and is timed by the ledger's clock, which asks
Redis every few seconds: so every few seconds, with two greenlets writing, the worker stalled.
Here a real gevent-patched process runs four greenlets writing records (each with its audit
entry) for longer than the clock's refresh, against the tests' redis-server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: Long enough for the ledger's clock to ask Redis again at least twice (it does every 2 s).
SECONDS = 5.0

SCRIPT = """
from gevent import monkey

monkey.patch_all()

import json, os, sys, time

import gevent

from devtools.toolapp import make_app
from dex_celery import Settings

_app, dex = make_app(Settings.from_env(dict(os.environ)))
dex.store.create_schema()
seconds = float(sys.argv[1])
slowest = [0.0]
writes = [0]


def write(n: int) -> None:
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        i += 1
        started = time.monotonic()
        dex.store.record_late_result(f"s/t{n}/c{i}", "late")
        slowest[0] = max(slowest[0], time.monotonic() - started)
        writes[0] += 1


gevent.joinall([gevent.spawn(write, n) for n in range(4)], raise_error=True)
print(json.dumps({"slowest": slowest[0], "writes": writes[0]}))
"""


def test_greenlets_writing_records_with_audit_entries_never_wait_out_sqlites_busy_timeout(
    env: dict[str, str], tmp_path: Path
) -> None:
    assert env["DEX_DATABASE_URL"].startswith("sqlite")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(SECONDS)],
        env={**env, "PYTHONPATH": str(Path(__file__).parents[3])},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["writes"] > 0
    # A stall is SQLite's busy timeout (30 s) or a failed write; a loaded machine is not 10 s.
    assert figures["slowest"] < 10.0, figures
