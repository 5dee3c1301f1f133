"""Smoke runs of the hot-path measurements of docs/benchmarks.md section 6, tiny sizes.

The figures are never asserted (the machines are too noisy); what is asserted is that each
measurement runs and reports what the page quotes: the ledger's own cost per call with the time
inside each script, the CPU per call of each part, and the driver pinned to one CPU.
"""

from __future__ import annotations

import os

import pytest

from tests.support.processes.bench import run


def test_ledger_cost_reports_commands_cpu_and_time_inside_each_script() -> None:
    out = run("ledger_cost", "--calls", "50", "--warmup", "5")
    # The ledger's budget (tests/unit/ledger/test_command_budget.py): 30 with `tool_call_ended`
    # and the `budgets` field `recorded.lua` reads to settle write budgets.
    assert "redis commands/call: 30.00" in out
    assert "redis-server cpu:" in out
    inside = next(line for line in out.splitlines() if line.startswith("inside redis"))
    for script in ("open", "claim", "finish", "recorded"):
        assert f"{script} " in inside


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two CPUs")
def test_throughput_with_the_driver_pinned_reports_cpu_per_call() -> None:
    out = run(
        "throughput",
        *("--calls", "60", "--rounds", "1", "--warmup", "10", "--batch", "20"),
        *("--driver-cpu", str(min(os.sched_getaffinity(0)))),
    )
    for variant in ("A", "B", "dex"):
        assert f"cpu us/call {variant:>3}: total" in out


def test_cpu_profile_reports_each_process_by_code_and_function() -> None:
    """`bench.cpu_profile`: every role of each side's worker and the requester, each with its
    table by code (dex-celery's rooms, the libraries) and by function, then dex-celery minus
    plain Celery per role."""
    out = run("cpu_profile", "--calls", "40", "--warmup", "10", "--limit", "5")
    for role in ("plain, requester", "plain, worker main", "plain, pool"):
        assert f"## {role}: " in out, out
    for role in ("requester", "worker main", "pool", "recorder"):
        assert f"## dex, {role}: " in out, out
        assert f"### {role}: the functions dex-celery spends most more in" in out, out
    assert "| dex_celery/engine |" in out and "| celery |" in out, out
    assert out.count("| function (own time) | us per call | share |") == 7, out
    assert "## dex-celery - plain Celery, own time per call" in out, out
