"""A worker that starts on a database whose schema is current logs nothing of Alembic's at INFO.

Looking up the schema's revision at start (the worker's "is the database ready?" check) goes
through Alembic's migration context, whose INFO lines ("Context impl ...", "Will assume ...
DDL") said nothing an operator needs on every start; `dex-celery db upgrade`, which changes the
schema, still says what it runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from devtools.processes import Worker, wait_for
from dex_celery.store.migrate import upgrade

#: What Alembic logs at INFO: its plugins' set-up at import (alembic/runtime/plugins.py) and a
#: migration context's dialect and DDL mode (alembic/runtime/migration.py).
ALEMBIC_INFO = re.compile(
    r"INFO/[^\]]*\] (setup plugin alembic|Context impl \w+|Will assume \w+ DDL|Running \w+ )"
)


def test_a_worker_start_on_a_current_schema_logs_no_alembic_info(
    env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    upgrade(env["DEX_DATABASE_URL"])
    worker = start_worker(concurrency=1)
    wait_for(lambda: " ready." in worker.log(), timeout=60, what="the worker to be ready")
    log = worker.log()
    assert "the database is not ready" not in log  # the start's schema check ran and passed
    assert not ALEMBIC_INFO.findall(log), log
