"""The chaos run at full size (docs/reliability.md): 2,000 calls of all four effect classes while
workers and pool processes are SIGKILLed every ~2 s, Redis is restarted once and later brought
back from a snapshot taken seconds earlier. An attempt may wait 10 s for a worker (the bench's
default is 30 s): an attempt whose message a killed worker or the rolled-back Redis lost ends, or
is retried, 10 s after it was sent instead of 30 s, so the run ends sooner with the same faults.
Every invariant must hold: no non-idempotent write ran twice (per the tools' own logs), no call
whose tool ran is recorded "did not run", every call ends with exactly one record and one
finished event (S3.2, S4.1-S4.3, S7.3, S10.2)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devtools.processes import ROOT

pytestmark = pytest.mark.crash

#: Seconds an attempt may wait for a worker: long enough for a killed worker's successor to
#: start on a loaded machine, short enough that the calls whose messages a kill or a Redis fault
#: lost (up to three attempts each) do not hold the end of the run for minutes.
SCHEDULE_TO_START = ("--schedule-to-start", "10")


def _chaos(*args: str) -> str:
    """Run the chaos bench with `args`; its report, once it exited 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.chaos", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.timeout(900)
def test_chaos_run_with_an_older_snapshot_holds_every_invariant() -> None:
    out = _chaos("--calls", "2000", *SCHEDULE_TO_START)
    assert "redis-server restarted from the snapshot" in out, out[-2000:]
    assert "rollbacks to an older snapshot 1" in out, out[-2000:]
    assert out.count(": OK") == 6, out[-3000:]


@pytest.mark.timeout(900)
def test_chaos_run_on_a_redis_cluster_holds_every_invariant() -> None:
    """The same run, shorter, with the ledger on a real local Redis Cluster (three primaries
    with a replica each, three shards; the broker a separate redis-server) and a failover of one
    primary instead of the restart (docs/redis.md, "Redis Cluster")."""
    out = _chaos("--cluster", "--calls", "300", *SCHEDULE_TO_START)
    assert "replica" in out and "promoted" in out, out[-2000:]
    assert "cluster primary failovers 1" in out, out[-2000:]
    assert out.count(": OK") == 6, out[-3000:]
