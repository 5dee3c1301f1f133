"""The broker options of `configure_celery` by the broker URL's scheme (docs/rabbitmq.md): a
RabbitMQ broker gets quorum queues and publisher confirms, a Redis broker exactly what it had."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from kombu import Queue

from dex_celery import Dex, Settings
from dex_celery.processes.celery_config import configure_celery, is_amqp_url

AMQP = "amqp://guest:guest@127.0.0.1:5672/dex"
REDIS = "redis://127.0.0.1:6379/0"
AMQP_ONLY = (
    "task_default_queue_type",
    "task_create_missing_queue_type",
    "broker_native_delayed_delivery_queue_type",
    "broker_channel_error_retry",
)


def _app(broker_url: str | None, **conf: Any) -> Celery:
    app = Celery("t")
    app.conf.update(conf)
    configure_celery(app, Settings(redis_url=REDIS, broker_url=broker_url))
    return app


@pytest.mark.parametrize(
    ("url", "amqp"),
    [
        (AMQP, True),
        ("amqps://u:p@rabbit:5671/v", True),
        ("pyamqp://rabbit//", True),
        (f"{AMQP};amqp://guest:guest@other:5672/dex", True),
        (REDIS, False),
        ("rediss://r:6380/0", False),
        ("sentinel://s:26379/0", False),
        ("", False),
        (None, False),
    ],
)
def test_amqp_urls_are_told_by_their_scheme(url: str | None, amqp: bool) -> None:
    assert is_amqp_url(url) is amqp


def test_a_rabbitmq_broker_gets_quorum_queues_and_publisher_confirms() -> None:
    app = _app(AMQP)
    assert app.conf.broker_url == AMQP
    assert app.conf.task_default_queue_type == "quorum"
    assert app.conf.task_create_missing_queue_type == "quorum"
    assert app.conf.worker_detect_quorum_queues is True
    assert app.conf.broker_native_delayed_delivery_queue_type == "classic"
    assert app.conf.broker_transport_options["confirm_publish"] is True
    assert app.conf.broker_channel_error_retry is True  # consumer_timeout closes a channel
    # What Kombu declares: the default queue and a queue a tool is routed to, both quorum.
    (default,) = app.amqp.queues.values()
    assert isinstance(default, Queue)
    assert default.queue_arguments == {"x-queue-type": "quorum"}
    assert app.amqp.queues["labels"].queue_arguments == {"x-queue-type": "quorum"}
    # The common options stay: one message per process, acks by class, retry forever.
    assert app.conf.worker_prefetch_multiplier == 1
    assert app.conf.broker_connection_max_retries is None


def test_transport_options_of_the_application_are_kept_beside_the_confirms() -> None:
    app = _app(AMQP, broker_transport_options={"max_retries": 3})
    assert app.conf.broker_transport_options == {"max_retries": 3, "confirm_publish": True}


def test_a_redis_broker_keeps_its_options_unchanged() -> None:
    """The Redis broker's configuration is what it was before RabbitMQ was supported: none of
    the AMQP-only options, no transport options unless the application set some."""
    app = _app(None)
    assert app.conf.broker_url == REDIS
    for name in AMQP_ONLY:
        assert app.conf[name] == Celery("plain").conf[name], name
    assert not app.conf.broker_transport_options
    (default,) = app.amqp.queues.values()
    assert not default.queue_arguments


def test_a_dex_on_rabbitmq_declares_its_queue_as_quorum() -> None:
    app = Celery("t")
    Dex(app, Settings(redis_url=REDIS, broker_url=AMQP))
    assert app.conf.task_default_queue_type == "quorum"
