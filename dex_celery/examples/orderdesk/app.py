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

from dex_celery.examples.orderdesk.factory import create_app

app, dex, desk = create_app()

__all__ = ["app", "create_app", "desk", "dex"]
