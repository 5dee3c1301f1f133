"""Wiring of the order desk's outcome checks and the beat jobs (S8.4).

`register_checks` hands each check to the library's registry on the `Dex`
(`dex.register_outcome_check`); the reconcile beat job (`dex.reconcile`, in
`dex.beat_schedule()`) then surfaces every new `outcome_unknown` call and, for these tools,
asks the desk and reports the real outcome to the session. `beat_schedule` is the deployment's
whole `app.conf.beat_schedule`: the reconcile job (beat runs the sweeper in a thread of its own,
see `dex_celery.startup`).
"""

from __future__ import annotations

from typing import Any

from dex_celery import Dex
from reconcile.orders import checks
from tasks.orderdesk import OrderDesk


def register_checks(dex: Dex, desk: OrderDesk) -> None:
    for tool_name, check in checks(desk).items():
        dex.register_outcome_check(tool_name, check)


def beat_schedule(dex: Dex) -> dict[str, dict[str, Any]]:
    """The interval comes from the settings (`DEX_RECONCILE_INTERVAL`)."""
    return dict(dex.beat_schedule())
