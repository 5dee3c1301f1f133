"""One requester process of the write-budget race (tests/integration/engine/test_budget_race.py).

`python -m tests.support.processes.budget_requester GATE SESSION PREFIX COUNT TOOL AMOUNT OUT` writes
`<OUT>.ready`, waits until the file GATE exists (the test opens it once every requester is
ready, so they all request at once), then requests COUNT calls of TOOL in SESSION (tool-call ids
`PREFIX-<i>`, the argument `amount` = AMOUNT and an order of its own for the `charge` tool) and writes each call's key
and status as the request returned it, one per line, to OUT. Settings from the environment.
"""

from __future__ import annotations

import sys
from pathlib import Path

from devtools.processes import wait_for
from devtools.toolapp import make_app
from dex_celery import Settings


def order(session: str, prefix: str, index: int) -> str:
    """The `charge` tool's order of one request (its side-effect log's name)."""
    return f"{session}-{prefix}-{index}"


def arguments(tool: str, session: str, prefix: str, index: int, amount: int) -> dict[str, object]:
    if tool == "charge":
        return {"order": order(session, prefix, index), "amount": amount}
    return {"seconds": 0.05, "value": f"{prefix}-{index}"}


def main(
    gate: Path, session: str, prefix: str, count: int, tool: str, amount: int, out: Path
) -> None:
    _app, dex = make_app(Settings.from_env())
    client = dex.client()
    dex.store.get_call(f"{session}/warm/up")  # connect before the gate opens
    Path(f"{out}.ready").write_text("ready")
    wait_for(gate.exists, timeout=60, what="the race's gate")
    lines = []
    for i in range(count):
        record = client.request_call(
            session,
            f"t-{prefix}",
            f"{prefix}-{i}",
            tool,
            arguments(tool, session, prefix, i, amount),
        )
        lines.append(f"{record.key} {record.status.value}\n")
    out.write_text("".join(lines))


if __name__ == "__main__":
    gate, session, prefix, count, tool, amount, out = sys.argv[1:8]
    main(Path(gate), session, prefix, int(count), tool, int(amount), Path(out))
