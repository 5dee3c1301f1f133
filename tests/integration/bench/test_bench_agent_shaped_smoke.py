"""Smoke runs of the agent-shaped benchmark (`bench/agent_shaped.py`), tiny sizes, no timings.

Like tests/integration/test_bench_smoke.py: the script runs as `python -m bench.agent_shaped` the
way docs/benchmarks.md gives it, so a broken benchmark fails CI before someone needs its figures.
The figures are never asserted; that the dex side's calls all succeeded (approved ones included)
is, since the script exits non-zero otherwise.
"""

from __future__ import annotations

from tests.support.processes.bench import run


def test_agent_shaped_mix_smoke() -> None:
    """The mix on the threads pool: both sides run, the ratio and the approval wait print."""
    out = run("agent_shaped", "--calls", "40", "--rounds", "1", "--warmup", "10", "--seed", "3")
    assert "threads: plain" in out and "ratio dex/plain" in out, out
    assert "approval wait added (request -> approved): median" in out, out
    assert "'agent_write_approved': 0" not in out, out


def test_agent_shaped_in_flight_smoke() -> None:
    """The in-flight mode: Redis CPU per second of both sides and their ratio print."""
    out = run("agent_shaped", "--in-flight", "50", "--window", "1", "--hold", "60")
    assert "plain: redis CPU" in out and "  dex: redis CPU" in out, out
    assert "in-flight redis CPU ratio dex/plain" in out, out


def test_gevent_fetch_smoke() -> None:
    """The plain gevent worker's fetching (docs/benchmarks.md, section 17): it runs, every
    sample line prints, and the tasks complete."""
    out = run(
        "gevent_fetch",
        "--concurrency",
        "10",
        "--calls",
        "40",
        "--seconds",
        "0.01",
        "--every",
        "0.25",
        "--duration",
        "3",
    )
    assert "t (s)   done  unacked  queued" in out, out
    samples = [
        line.split() for line in out.splitlines() if line[:6].strip().replace(".", "").isdigit()
    ]
    assert len(samples) >= 3 and int(samples[-1][1]) > 0, out
