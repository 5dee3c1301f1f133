"""Smoke run of the capacity benchmark (docs/scale.md), tiny sizes, no timing assertions: the
ledger and the broker on servers of their own, each one's Redis CPU per call reported beside
plain Celery's, for more than one count of worker processes.

Run as `python -m bench.capacity` the way docs/benchmarks.md and docs/scale.md do; the figures
are never asserted (these machines are too noisy), only that each is reported. The idle CPU
subtracted from each run is measured over 0.5 s instead of the bench's 2 s: still measured and
subtracted, which is what the smoke run checks.
"""

from __future__ import annotations

import shutil

import pytest

from tests.support.processes.bench import run


def test_capacity_smoke() -> None:
    out = run(
        "capacity", "--calls", "40", "--rounds", "1", "--workers", "1,2", "--warmup", "10",
        "--batch", "20", "--idle", "0.5", timeout=300,
    )  # fmt: skip
    assert "broker a second redis-server" in out
    assert "redis cpu/call (median of all runs): dex ledger" in out
    assert "plain celery broker" in out
    assert out.count("calls/s per core, from these: ledger server") == 1, out
    assert out.count("without the idle subtraction: dex ledger") == 1, out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [row[0] for row in rows] == ["1", "2"], out  # one row per count of processes
    for row in rows:
        assert all(float(row[i]) > 0 for i in (1, 2, 5, 7, 8)), row  # rates and Redis CPU


@pytest.mark.skipif(shutil.which("rabbitmqctl") is None, reason="no RabbitMQ on this machine")
def test_capacity_smoke_on_rabbitmq() -> None:
    """The broker on RabbitMQ, in a vhost made for the run and deleted after it."""
    out = run(
        "capacity", "--calls", "30", "--rounds", "1", "--workers", "1", "--warmup", "5",
        "--batch", "15", "--idle", "0.5", "--rabbitmq", timeout=300,
    )  # fmt: skip
    assert "broker RabbitMQ" in out
    assert "dex ledger" in out
