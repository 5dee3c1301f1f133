"""The Celery options dex-celery sets on a deployment's app (and on the development stack's
ping app), in one place."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from celery import Celery

from dex_celery.ledger.connection import broker_transport_options
from dex_celery.processes.consumer import CELERY_CONSUMER, DEX_CONSUMER, guard_closed_channels
from dex_celery.settings import Settings


def configure_celery(app: Celery, settings: Settings) -> None:
    """The Celery options dex-celery relies on (docs/ledger.md, "Celery options").

    JSON only (S9.2); results live in the ledger and SQL, not in a result backend; task events
    for Flower (`Settings.task_events`); a prefetch of one message per pool slot. The prefetch
    alone does not keep a long tool from holding others back: a message acknowledged when its
    task starts no longer counts against it, so every tool task is acknowledged late
    (`Dex.add_tool`) and a worker holds no more calls than it has slots, running ones included,
    whatever their effect class. A worker whose broker link breaks keeps reconnecting for as long as
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
    if is_amqp_url(app.conf.broker_url):
        options = rabbitmq_options()
        app.conf.update({k: v for k, v in options.items() if k != "broker_transport_options"})
        app.conf.broker_transport_options = {
            **options["broker_transport_options"],
            **(app.conf.broker_transport_options or {}),
        }


#: The URL schemes of Kombu's AMQP transports (py-amqp); `librabbitmq` is gone from Kombu 5.
AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp"})


def is_amqp_url(url: object) -> bool:
    """Is `url` a RabbitMQ (AMQP 0-9-1) broker URL? A `;`-separated failover list counts by its
    first URL, as Kombu reads it."""
    if not isinstance(url, str) or not url:
        return False
    return urlsplit(url.split(";", 1)[0].strip()).scheme in AMQP_SCHEMES


def rabbitmq_options() -> dict[str, Any]:
    """What a RabbitMQ broker gets on top of the common options (docs/rabbitmq.md).

    - Quorum queues (`task_default_queue_type`, and `task_create_missing_queue_type` for the
      queues tools are routed to): replicated, durable, and a message a consumer held when its
      channel closed goes back to the queue. Quorum queues refuse a global QoS, so Celery's
      detection of them stays on (`worker_detect_quorum_queues`: per-consumer prefetch).
    - Celery's native delayed delivery (the `celery_delayed_*` queues a worker declares when it
      sees quorum queues) is for countdown and ETA messages; dex-celery sends none (a retry's
      backoff waits in the ledger, docs/ledger.md), so those queues are classic, not 28 more
      Raft groups.
    - A channel error is recovered like a lost connection (`broker_channel_error_retry`): when
      a late-acknowledged attempt outlives RabbitMQ's `consumer_timeout`, RabbitMQ closes the
      consumer's channel with `PRECONDITION_FAILED`, which Celery otherwise treats as
      "Unrecoverable error" and shuts the worker down (tests/crash/broker/test_rabbitmq_broker.py).
      Reconnected, the worker gets the message again and the ledger refuses that copy's claim
      while the attempt runs on.
    - Publisher confirms (`confirm_publish`): `send_task` returns only once RabbitMQ has taken
      the message, so a request that says "started" has a message in the queue, and a refused
      publish raises, which the dispatcher records as an attempt that never reached a worker.
    """
    return {
        "task_default_queue_type": "quorum",
        "task_create_missing_queue_type": "quorum",
        "worker_detect_quorum_queues": True,
        "broker_native_delayed_delivery_queue_type": "classic",
        "broker_channel_error_retry": True,
        "broker_transport_options": {"confirm_publish": True},
    }
