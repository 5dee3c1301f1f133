"""A deployment with one `refund` tool in two releases, for approvals bound to what was approved
(docs/guardrails.md, S13.3): release 1 takes `order` and `amount_cents`; release 2 adds an
optional `currency` (another schema, the same call still fits it). Both need a person's approval
(a `non_idempotent_write`) and take a secret `card`.

The tool keeps its own side-effect log, `refunds-<order>.log` in the test tools' log folder
(`devtools.toolapp.log_dir`): one line per refund it made, with the values it received (the
card's last two characters only). A worker runs `celery -A tests.support.apps.refund_worker:app`,
whose release is `$DEX_TEST_REFUND_RELEASE`; it announces readiness like the test tools' app.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from devtools.toolapp import log_dir
from dex_celery import Dex, EffectClass, Settings, ToolContext, ToolPolicy

RELEASE_ENV = "DEX_TEST_REFUND_RELEASE"
POLICY = ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, secret_arguments=("card",))


def refunds(order: str) -> list[str]:
    """The tool's side-effect log of `order`: one line per refund made."""
    path = log_dir() / f"refunds-{order}.log"
    return path.read_text().splitlines() if path.exists() else []


def _refund(ctx: ToolContext, order: str, amount_cents: int, currency: str, card: str) -> Any:
    with (log_dir() / f"refunds-{order}.log").open("a") as f:
        f.write(f"refund {ctx.idempotency_key} {amount_cents} {currency} {card[-2:]}\n")
        f.flush()
        os.fsync(f.fileno())
    return {"refunded": order, "amount_cents": amount_cents, "currency": currency}


def make_app(settings: Settings | None = None, release: str | None = None) -> tuple[Celery, Dex]:
    release = release or os.environ.get(RELEASE_ENV, "1")
    app = Celery(f"dex_test_refunds_{release}")
    dex = Dex(app, settings or Settings.from_env())
    if release == "1":

        def refund(ctx: ToolContext, order: str, amount_cents: int, card: str = "") -> Any:
            """Refund an order."""
            return _refund(ctx, order, amount_cents, "EUR", card)

    else:

        def refund(  # type: ignore[misc]
            ctx: ToolContext, order: str, amount_cents: int, currency: str = "EUR", card: str = ""
        ) -> Any:
            """Refund an order."""
            return _refund(ctx, order, amount_cents, currency, card)

    dex.tool("refund", policy=POLICY)(refund)
    return app, dex
