"""The Celery options dex-celery sets on a deployment's app (and on the development stack's
ping app), in one place."""

from __future__ import annotations

from celery import Celery

from dex_celery.ledger.connection import broker_transport_options
from dex_celery.settings import Settings


def configure_celery(app: Celery, settings: Settings) -> None:
    """The Celery options dex-celery relies on (docs/ledger.md, "Celery options by class").

    JSON only (S9.2); results live in the ledger and SQL, not in a result backend; task events
    for Flower (`Settings.task_events`); one message prefetched per process so a long tool does
    not hold others back.
    """
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        event_serializer="json",
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
        broker_connection_retry_on_startup=True,
    )
    if not app.conf.broker_url or app.conf.broker_url.startswith("amqp://guest@localhost"):
        app.conf.broker_url = settings.effective_broker_url
    # A `sentinel://` broker needs the master's name (Kombu's transport option).
    sentinel_options = broker_transport_options(settings)
    if sentinel_options:
        app.conf.broker_transport_options = {
            **sentinel_options,
            **(app.conf.broker_transport_options or {}),
        }
