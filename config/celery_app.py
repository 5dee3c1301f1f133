"""The reference deployment of docker-compose.yml: the order desk example shipped in the package.

    celery -A config.celery_app worker -P prefork -Q celery,labels
    celery -A config.celery_app beat
    dex-celery -A config.celery_app calls list

This folder is not installed with the package; it exists so the compose file's commands stay
short. Everything lives in `dex_celery.examples.orderdesk.app`.
"""

from __future__ import annotations

from dex_celery.examples.orderdesk.app import app, create_app, desk, dex

__all__ = ["app", "create_app", "desk", "dex"]
