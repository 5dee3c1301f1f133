"""Builds the order desk's deployment from settings given as an object (`create_app`).

Kept apart from `app.py`, which builds one from the environment when imported (what
`celery -A` needs), so the demo can build its own without importing that one.
"""

from __future__ import annotations

from celery import Celery

from dex_celery import Dex, Settings
from dex_celery.examples.orderdesk import tools as orders
from dex_celery.examples.orderdesk.beat import beat_schedule, register_checks
from dex_celery.examples.orderdesk.desk import OrderDesk


def create_app(settings: Settings | None = None) -> tuple[Celery, Dex, OrderDesk]:
    """Build the app, its tools, their outcome checks and the beat schedule."""
    settings = settings or Settings.from_env()
    app = Celery("dex_reference")
    dex = Dex(app, settings)
    desk = OrderDesk(settings.database_url)
    orders.register(dex, desk)
    register_checks(dex, desk)
    app.conf.task_routes = orders.task_routes()
    app.conf.task_default_queue = orders.DEFAULT_QUEUE
    app.conf.beat_schedule = beat_schedule(dex)
    return app, dex, desk
