"""What approvals bound to what was approved (docs/guardrails.md, S13.3) add per call, in-process
(no Redis, no SQL: the new work is CPU only, and no Redis command is added on any path).

- every request: the tool's definition digest (`tools/definition_digest.py`, computed once per
  tool and then looked up);
- every outcome a pool process hands its recorder: one more field in `encode_row`/`decode_row`;
- an approved call's worker only: its view of the binding (the arguments checked as the tool
  receives them, S12.2, and two digests), before its claim.

    .venv/bin/python -m bench.approval_binding --calls 200000
"""

from __future__ import annotations

import argparse
import marshal
import timeit
from typing import Any

from celery import Celery

from bench.common import header
from dex_celery import Dex, EffectClass, Settings, ToolContext, ToolPolicy
from dex_celery.engine.attempt.approval_claim import Bound, worker_view
from dex_celery.engine.attempt.outcome_writer import encode_row
from dex_celery.model.ids import CallKey
from dex_celery.model.outcomes import CallStatus
from dex_celery.store.values import Outcome, OutcomeRow
from dex_celery.tools.definition_digest import definition_digest


def refund(ctx: ToolContext, order: str, amount_cents: int, memo: str = "") -> Any:
    return order


def per_call_us(fn: Any, calls: int) -> float:
    best = min(timeit.repeat(fn, number=calls, repeat=5))
    return best / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200_000)
    calls = parser.parse_args().calls
    dex = Dex(Celery("bench"), Settings(secret_key="bench-key"))
    dex.tool("refund", policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE))(refund)
    tool = dex.get_tool("refund")
    row = OutcomeRow(
        CallKey("s", "t", "c"), "refund", '{"order":"o"}', Outcome(CallStatus.SUCCEEDED, "", "1")
    )
    bound = Bound(tool, '{"amount_cents":500,"order":"o-1"}', None)
    header(f"approval binding: CPU added per call (best of 5 x {calls} calls)")
    print(
        f"definition digest per request (cached): {per_call_us(lambda: definition_digest(tool), calls):.2f} us"
    )
    fields = marshal.loads(encode_row(row))
    before, after = fields[:-1], fields  # the row as it was encoded before the edit field
    print(
        "outcome row as marshal bytes, without / with the edit field: "
        f"{per_call_us(lambda: marshal.loads(marshal.dumps(before)), calls):.2f} / "
        f"{per_call_us(lambda: marshal.loads(marshal.dumps(after)), calls):.2f} us"
    )
    approved = max(calls // 20, 1)
    print(
        f"approved call only, the worker's binding: {per_call_us(lambda: worker_view(bound, None).binding, approved):.2f} us"
    )


if __name__ == "__main__":
    main()
