"""Kombu's Redis channels of a closed connection fail as a dead link does (issue 19, finding 8;
docs/operations.md): with a connection error Kombu's and Celery's handlers catch, never an
`AttributeError` that ends the worker's main process."""

from __future__ import annotations

import pytest
import redis
from kombu import Connection

from devtools.processes import RedisServer
from dex_celery.processes.consumer import guard_closed_channels


def test_a_channel_of_a_collected_connection_raises_a_connection_error(
    redis_server: RedisServer,
) -> None:
    guard_closed_channels()
    guard_closed_channels()  # idempotent: wraps once
    connection = Connection(redis_server.url)
    channel = connection.default_channel
    assert channel.client.ping()  # a live channel works as before
    # What Celery's consumer does with a lost connection: the transport forgets its client
    # while the channel object lives on (with its unacknowledged messages).
    connection.collect()
    kombu_own = type(channel)._connparams.__wrapped__
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute"):
        kombu_own(channel)  # the fault of the issue, in Kombu itself
    with pytest.raises(redis.ConnectionError):
        channel._connparams()
    # ... a connection error, which Kombu's `maybe_close_channel` and Celery's `ack_log_error`
    # catch (the transport's `connection_errors`).
    assert issubclass(redis.ConnectionError, connection.connection_errors)
