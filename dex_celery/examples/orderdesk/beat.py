"""Wiring of the order desk's outcome checks and the beat jobs (S8.4).

`register_checks` hands each check to the library's registry on the `Dex`
(`dex.register_outcome_check`); the reconcile job, which runs inside the beat process, then
surfaces every new `outcome_unknown` call and, for these tools, asks the desk and reports the
real outcome to the session. `beat_schedule` is the deployment's whole
`app.conf.beat_schedule`: empty, since the sweeper and the reconcile job both run inside beat.
"""

from __future__ import annotations

from typing import Any

from dex_celery import Dex
from dex_celery.examples.orderdesk.checks import checks
from dex_celery.examples.orderdesk.desk import OrderDesk


def register_checks(dex: Dex, desk: OrderDesk) -> None:
    for tool_name, check in checks(desk).items():
        dex.register_outcome_check(tool_name, check)


def beat_schedule(dex: Dex) -> dict[str, dict[str, Any]]:
    """Both jobs' intervals come from the settings (`DEX_SWEEP_INTERVAL`, `DEX_RECONCILE_INTERVAL`)."""
    return dict(dex.beat_schedule())
