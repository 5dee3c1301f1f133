"""The Celery options dex-celery sets on a deployment's app (and on the development stack's
ping app), in one place."""

from __future__ import annotations

from celery import Celery

from dex_celery.ledger.connection import broker_transport_options
from dex_celery.processes.consumer import CELERY_CONSUMER, DEX_CONSUMER, guard_closed_channels
from dex_celery.settings import Settings


def configure_celery(app: Celery, settings: Settings) -> None:
    """The Celery options dex-celery relies on (docs/ledger.md, "Celery options by class").

    JSON only (S9.2); results live in the ledger and SQL, not in a result backend; task events
    for Flower (`Settings.task_events`); one message prefetched per process so a long tool does
    not hold others back. A worker whose broker link breaks keeps reconnecting for as long as
    it takes, at start and later, and running tools go on meanwhile (their ledger lease and
    claim fence them, not the broker); its consumer survives Kombu's teardown of the lost link
    (`dex_celery.processes.consumer`, docs/operations.md).
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
        broker_connection_retry=True,
        broker_connection_max_retries=None,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    if app.conf.worker_consumer == CELERY_CONSUMER:
        app.conf.worker_consumer = DEX_CONSUMER
    guard_closed_channels()
    if not app.conf.broker_url or app.conf.broker_url.startswith("amqp://guest@localhost"):
        app.conf.broker_url = settings.effective_broker_url
    # A `sentinel://` broker needs the master's name (Kombu's transport option).
    sentinel_options = broker_transport_options(settings)
    if sentinel_options:
        app.conf.broker_transport_options = {
            **sentinel_options,
            **(app.conf.broker_transport_options or {}),
        }
