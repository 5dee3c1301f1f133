"""The order desk's deployment: one Celery app running the order desk's tools.

    celery -A dex_celery.examples.orderdesk.app worker -P prefork -Q celery,labels
    celery -A dex_celery.examples.orderdesk.app beat
    celery -A dex_celery.examples.orderdesk.app flower

Everything is configured from the environment (`DEX_*`, see `dex_celery.settings` and the README's
settings table). `app` is the Celery app the commands above find; `dex` is its `Dex`
(`dex-celery -A dex_celery.examples.orderdesk.app calls list` finds it through the app).
The repository's `config.celery_app`, used by docker-compose.yml, is this module.
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


app, dex, desk = create_app()
