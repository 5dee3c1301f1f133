"""Smoke runs of every benchmark and of the chaos run (issue 6), tiny sizes, no timing assertions.

Each runs the script as `python -m bench.<name>` the way docs/benchmarks.md and
docs/reliability.md do, so a broken benchmark fails CI long before someone needs its figures.
The figures themselves are never asserted: these machines are too noisy. The chaos smoke run does
assert its invariants (S3.2, S4.1-S4.3, S10.2): the script exits non-zero on any violation.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from devtools.processes import ROOT
from tests.support.processes.bench import run


def test_throughput_smoke() -> None:
    """Throughput: the three variants run interleaved and the ratios are reported."""
    out = run("throughput", "--calls", "60", "--rounds", "1", "--warmup", "10", "--batch", "20")
    assert "ratio dex/A" in out and "ratio dex/B" in out
    assert "sql commits/call" in out and "commands/call" in out


def test_cpu_budget_smoke() -> None:
    """CPU per call of every process and the commands each sends, both sides interleaved."""
    out = run(
        "cpu_budget", "--calls", "40", "--rounds", "1", "--warmup", "10", "--monitor-calls", "10"
    )
    for role in ("requester", "worker main", "pool", "recorder", "redis-server", "total"):
        assert f"| {role} |" in out, out
    assert "ratio dex/plain" in out, out


def test_latency_smoke() -> None:
    out = run("latency", "--samples", "8", "--warmup", "2", "--pause", "0.01")
    for line in (
        "dex wait()          : p50",
        "dex wait(recorded=False): p50",
        "dex (record in SQL) : p50",
        "dex (ledger decided): p50",
        "plain               : p50",
        "requester cpu: dex request_call mean",
    ):
        assert line in out, out


def test_requester_cpu_smoke() -> None:
    out = run("requester_cpu", "--rounds", "2", "--block", "5", "--phases")
    for line in ("dex request_call: min", "plain delay()   : min", "dex - plain     :"):
        assert line in out, out
    assert "open script (EVALSHA)" in out and "SQL transaction (insert_calls)" in out, out


def test_detection_smoke() -> None:
    """Detection (S4.3): after the kill, reads and idempotent writes are retried to success and
    the writes end outcome_unknown; plain Celery's early-ack task stays STARTED, its late-ack
    task (visibility timeout 2 s instead of 5 s) is run again."""
    out = run(
        "detection",
        "--trials",
        "1",
        "--configs",
        "tight",
        "--plain-trials",
        "1",
        "--plain-wait",
        "2",
        "--plain-visibility",
        "2",
    )
    assert "outcomes {'outcome_unknown': 1}" in out
    assert "outcomes {'succeeded': 1}" in out
    assert "ran 1 time(s) and its state is STARTED" in out
    assert "run again" in out


def test_sweep_cost_smoke() -> None:
    out = run(
        "sweep_cost",
        "--history",
        "100,1000",
        "--repeat",
        "3",
        "--in-flight",
        "200",
        "--due",
        "10",
        "--due-repeat",
        "1",
        "--ledger-entries",
        "100",
    )
    assert "ratio 1,000 / 100" in out
    assert "10 attempts moved" in out


def test_memory_smoke() -> None:
    out = run("memory", "--attempts", "200", "--finished-ttl", "1")
    assert "running:" in out and "after expiry: keys left 3" in out


@pytest.mark.filterwarnings("ignore")
def test_chaos_smoke() -> None:
    """S3.2, S4.1-S4.3, S10.2 under kills, a Redis restart and a rollback of Redis to an older
    snapshot (on by default): every invariant holds (exit 0)."""
    out = run(
        "chaos",
        "--calls",
        "60",
        "--kill-every",
        "1",
        "--window",
        "20",
        "--schedule-to-start",
        "4",
        "--rollback-after",
        "2",
        timeout=180,
    )
    assert "restarting redis-server" in out
    assert "redis snapshot taken" in out
    assert "redis-server restarted from the snapshot" in out
    assert "rollbacks to an older snapshot 1" in out
    assert out.count(": OK") == 6


def test_io_bound_smoke() -> None:
    """IO-bound throughput (issue 11): both sides, sync and async, on the threads pool."""
    out = run(
        "io_bound",
        "--calls", "40", "--rounds", "1", "--warmup", "5",
        "--concurrency", "10", "--seconds", "0.01",
    )  # fmt: skip
    assert "sync: plain" in out and "async: plain" in out and "ratio dex/plain" in out
    assert "worker CPU per call" in out


def test_scrape_cost_smoke() -> None:
    """Scrape cost (issue 24): scrapes at two history sizes, the grouped scan they replaced (and
    the check that the maintained counts equal it), the write cost with and without counts."""
    out = run(
        "scrape_cost",
        "--history",
        "100,1000",
        "--repeat",
        "3",
        "--scan-repeat",
        "1",
        "--write-batches",
        "4",
    )
    assert "history     1,000: scrape median" in out and "the grouped scan it replaced" in out
    assert "ratio 1,000 / 100:" in out
    assert "us/outcome with counts kept" in out and "count upsert alone" in out


def test_retention_smoke() -> None:
    """Pruning history (S12.4): the real `history prune` beside calls; every history call is
    removed and the calls beside it all succeed (the script raises otherwise)."""
    out = run(
        "retention",
        "--history",
        "300",
        "--database",
        "sqlite",
        "--baseline",
        "0.5",
        "--warmup",
        "0.2",
        "--batch",
        "50",
    )
    assert "sqlite: pruned 300 calls, 30 sessions, 330 messages" in out
    assert "beside the prune" in out and "calls/s beside / before" in out


@pytest.mark.postgres
def test_peers_smoke() -> None:
    """Peers (issue 25): dex-celery, plain Celery and DBOS on the same PostgreSQL, one run;
    the DBOS variant is what this test is for, so it is skipped without the `dbos` package."""
    pytest.importorskip("dbos")
    out = run(
        "peers",
        "--calls", "40", "--rounds", "1", "--warmup", "5", "--batch", "20",
        "--samples", "4", "--pause", "0.01",
        timeout=300,
    )  # fmt: skip
    assert "DBOS skipped" not in out
    for line in ("median    A:", "median  dex:", "median dbos:", "ratio dex/dbos:", "dbos : p50"):
        assert line in out, out


@pytest.mark.postgres
def test_peers_without_dbos_says_so() -> None:
    """Without the `dbos` package (hidden here: `sys.modules["dbos"] = None` makes its import
    fail as if it were not installed) the peers bench says DBOS was skipped and why, and still
    measures dex-celery and plain Celery."""
    code = (
        "import sys; sys.modules['dbos'] = None; from bench.peers import main; "
        "raise SystemExit(main(['--calls', '30', '--rounds', '1', '--warmup', '5', "
        "'--batch', '15', '--samples', '3', '--pause', '0.01']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "DBOS skipped: the `dbos` package is not installed" in out
    assert "median  dex:" in out and "ratio dex/A:" in out and "dex  : p50" in out
    assert "median dbos:" not in out and "dbos : p50" not in out
