"""Smoke runs of the per-step and agent-turn benchmarks (`bench/per_step.py`,
`bench/agent_turn.py`), tiny sizes, no timings.

Like tests/integration/bench/test_bench_smoke.py: each script runs as `python -m bench.<name>` the
way docs/benchmarks.md gives it, so a broken benchmark fails CI before someone needs its figures.
The figures are never asserted; that every dex call succeeded is, since the scripts exit non-zero
otherwise. The idle workers' background is measured over 0.5 s (`--idle`), not 2 s. DBOS runs
where the `dbos` package and the tests' PostgreSQL are there; without them the scripts say it was
skipped, which the `--no-dbos` runs check.
"""

from __future__ import annotations

import pytest

from tests.support.processes.bench import run


def _sides_reported(out: str, unit: str, sides: tuple[str, ...]) -> None:
    assert f"| side | {unit} p50 ms | {unit} p99 ms |" in out, out
    for side in sides:
        assert f"| {side} |" in out, out
    assert "ratio dex/plain: p50" in out, out
    assert f"network round trips/{unit}" in out, out


def test_per_step_smoke_without_dbos() -> None:
    """Write steps, SQLite, threads pool: both Celery sides run, the skip is said, and the
    commands each process sent per step print."""
    out = run(
        "per_step",
        "--steps", "15", "--rounds", "2", "--warmup", "2", "--monitor-steps", "5",
        "--tool", "write", "--pool", "threads", "--no-dbos", "--idle", "0.5",
    )  # fmt: skip
    _sides_reported(out, "step", ("plain", "dex"))
    assert "DBOS skipped: --no-dbos" in out and "| dbos |" not in out, out
    assert "| requester |" in out and "| recorder |" in out and "| total |" in out, out


@pytest.mark.postgres
def test_per_step_smoke_with_dbos_on_postgres() -> None:
    """Read steps, PostgreSQL: the three sides and the ratios against plain and DBOS."""
    pytest.importorskip("dbos")
    out = run(
        "per_step",
        "--steps", "10", "--rounds", "1", "--warmup", "2", "--monitor-steps", "5",
        "--database", "postgres", "--idle", "0.5",
        timeout=300,
    )  # fmt: skip
    assert "DBOS skipped" not in out, out
    _sides_reported(out, "step", ("plain", "dex", "dbos"))
    assert "ratio dbos/plain" in out and "ratio dex/dbos" in out, out


def test_agent_turn_smoke_without_dbos() -> None:
    """Turns of 3 parallel reads and a write, both ways of waiting for plain Celery's group."""
    for group_get in ("join", "get"):
        out = run(
            "agent_turn",
            "--turns", "4", "--rounds", "1", "--warmup", "1", "--reads", "3",
            "--no-dbos", "--plain-group-get", group_get, "--idle", "0.5",
        )  # fmt: skip
        _sides_reported(out, "turn", ("plain", "dex"))
        assert f"plain waits for the group with {group_get}()" in out, out


@pytest.mark.postgres
def test_agent_turn_smoke_with_dbos() -> None:
    pytest.importorskip("dbos")
    out = run(
        "agent_turn", "--turns", "3", "--rounds", "1", "--warmup", "1", "--reads", "3",
        "--idle", "0.5", timeout=300,
    )  # fmt: skip
    assert "DBOS skipped" not in out, out
    _sides_reported(out, "turn", ("plain", "dex", "dbos"))
