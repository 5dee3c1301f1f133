"""Write budgets under a race (S13.1.2): three requester processes and two prefork workers, one
budget of N per session, over many rounds; exactly N calls are admitted and run, every other one
waits for a person saying why, and the tools' own log agrees. A count budget
(`slow_non_idempotent_write`) and an amount budget (`charge`, summing `amount`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.processes import ROOT, Worker, wait_for
from devtools.toolapp import charges, log_dir
from dex_celery import CallStatus, Dex
from tests.support.faults.crash import lines, wait_finished
from tests.support.processes.budget_requester import order
from tests.support.stores.env_dex import dex_of

ROUNDS = 5
N = 3
#: The amount each `charge` asks for, and the amount budget: room for exactly N of them.
AMOUNT = 250
BUDGETS = (
    f"writes: tools=slow_non_idempotent_write limit={N} label=writes; "
    f"spend: tools=charge limit={N * AMOUNT} measure=amount label=refunds"
)
#: Calls each requester asks for per round.
EACH = 3


@pytest.fixture
def budgeted(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Dex]:
    env["DEX_BUDGETS"] = BUDGETS
    dex = dex_of(env, monkeypatch)
    yield dex


def _race(env: dict[str, str], tmp: Path, session: str, tool: str) -> dict[str, str]:
    """Three requester processes ask at once; returns key -> status as each request returned."""
    gate = tmp / f"gate-{session}"
    outs = [tmp / f"{session}-{n}.out" for n in range(3)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.processes.budget_requester",
                str(gate),
                session,
                f"r{n}",
                str(EACH),
                tool,
                str(AMOUNT),
                str(out),
            ],
            cwd=ROOT,
            env={**os.environ, **env},
        )
        for n, out in enumerate(outs)
    ]
    try:
        wait_for(
            lambda: all(Path(f"{out}.ready").exists() for out in outs),
            timeout=60,
            what="three requesters ready",
        )
        gate.write_text("go")
        for proc in procs:
            assert proc.wait(timeout=60) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    statuses: dict[str, str] = {}
    for out in outs:
        for line in out.read_text().splitlines():
            key, status = line.split()
            statuses[key] = status
    return statuses


@pytest.mark.parametrize("tool", ["slow_non_idempotent_write", "charge"])
def test_three_requesters_two_workers_admit_exactly_the_budget(
    budgeted: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    tmp_path: Path,
    tool: str,
) -> None:
    start_worker(concurrency=2)
    start_worker(concurrency=2)
    for round_ in range(ROUNDS):
        session = f"race-{tool}-{round_}"
        for n in range(3):  # `charge` holds until its order is released: let each run at once
            for i in range(EACH):
                (log_dir() / f"release-{order(session, f'r{n}', i)}").write_text("go")
        statuses = _race(env, tmp_path, session, tool)
        assert len(statuses) == 3 * EACH
        admitted = [k for k, s in statuses.items() if s == CallStatus.PENDING.value]
        waiting = [k for k, s in statuses.items() if s == CallStatus.AWAITING_APPROVAL.value]
        assert len(admitted) == N, statuses
        assert len(waiting) == 3 * EACH - N, statuses
        for key in admitted:
            assert wait_finished(budgeted, key).status is CallStatus.SUCCEEDED
        for key in waiting:
            record = budgeted.store.get_call(key)
            assert record is not None and record.status is CallStatus.AWAITING_APPROVAL
            assert record.budget_reason is not None
            assert record.budget_reason.startswith(
                f"{N} of {N} writes in this session"
                if tool != "charge"
                else f"{N * AMOUNT} of {N * AMOUNT} amount (refunds) in this session"
            ), record.budget_reason
        # The tools' own witness: exactly N ran, each once.
        ran = [k for k in statuses for _ in lines(k, "start")]
        assert len(ran) == N, ran
        if tool == "charge":
            made = [
                c
                for n in range(3)
                for i in range(EACH)
                for c in charges(order(session, f"r{n}", i))
            ]
            assert len(made) == N, made
        totals = budgeted.ledger.read_budget(
            budgeted.ledger.keys.budget(
                "spend" if tool == "charge" else "writes", f"session:{session}"
            ),
            window=0.0,
        )
        assert totals == (0.0, float(N * (AMOUNT if tool == "charge" else 1)), 0.0)
