"""A first attempt's message as the broker's own Redis commands, for the ledger's open to run.

Where the broker is the ledger's Redis, a request opens each call and publishes its first attempt
in one script (`open.lua`), so the two are one atomic step and one round trip instead of two
(docs/ledger.md, "Opening a call"). The message is built by Celery and Kombu exactly as a publish
would build it: `Celery.send_task` runs through a Kombu `Producer` whose channel is the pool's own
broker channel, except that `basic_publish` hands Kombu's Redis transport a collector for the
final commands (Kombu's publish-batch protocol: the transport calls `add("lpush", queue, body)`,
and `add("publish", ...)` for a `task-sent` event, instead of sending them). Nothing reaches the
broker here; the ledger's script sends what was collected only if it opens the call.

Used only where it is exact: a Redis broker at the ledger's own URL, no Kombu `global_keyprefix`
(its keys would be prefixed by the client, not here), a ledger of one shard that is not a Redis
Cluster (a script's keys must share one slot). Anywhere else the request opens the calls in one
round trip and publishes each through Celery, as before (`Opener.start_new`, `request/opening.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kombu.messaging import Producer

from dex_celery.ledger.ledger import BrokerCommand

#: The broker commands `open.lua` runs (Kombu's Redis transport sends nothing else to publish).
_COMMANDS = frozenset({"lpush", "publish", "pexpire"})


class _CollectingChannel:
    """The producer's broker channel, publishing into a list of commands instead of Redis.

    Everything but `basic_publish` is the channel's own (declarations, the message's encoding,
    routing tables), so the message is the one Celery would have sent."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self.commands: list[BrokerCommand] = []
        self.refused: str | None = None

    def basic_publish(self, message: Any, exchange: Any, routing_key: Any, **kwargs: Any) -> Any:
        return self._channel.basic_publish(
            message, exchange, routing_key, _publish_batch=self, **kwargs
        )

    def add(self, name: str, *args: Any) -> None:
        """Kombu's transport adds one final command of the message being routed."""
        if name not in _COMMANDS or len(args) != 2:
            self.refused = name
            return
        target, value = args
        self.commands.append((name, str(target), value if isinstance(value, bytes) else str(value)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


def can_capture(producer: Any, broker_url: Any, ledger_url: str, may_publish: bool) -> bool:
    """Whether a first attempt may be published by the ledger's open (the module's rules)."""
    if not may_publish or not isinstance(broker_url, str):
        return False
    if broker_url.strip() != ledger_url.strip():
        return False
    channel = producer.channel
    # Kombu's Redis transport (5.7 and later) takes a publish batch; other transports send.
    if not hasattr(channel, "create_publish_batch") or not hasattr(channel, "_put"):
        return False
    return not getattr(channel, "global_keyprefix", "")


def capture(producer: Any, send: Callable[[Any], Exception | None]) -> list[BrokerCommand] | None:
    """The broker commands of what `send(producer)` publishes through a collecting copy of
    `producer`; None if it raised or Kombu asked for a command `open.lua` does not run (then
    nothing was sent: the caller publishes the ordinary way)."""
    channel = _CollectingChannel(producer.channel)
    collecting = Producer(  # type: ignore[no-untyped-call]
        channel,
        exchange=producer.exchange,
        routing_key=producer.routing_key,
        serializer=producer.serializer,
        compression=producer.compression,
        auto_declare=producer.auto_declare,
    )
    if send(collecting) is not None or channel.refused is not None or not channel.commands:
        return None
    return channel.commands
