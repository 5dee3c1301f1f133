"""The worker's broker link: Celery's consumer and Kombu's Redis channel, made to outlive the
teardown of a lost connection (issue 19, finding 8; docs/operations.md).

When the link to a Redis broker breaks, Celery's consumer closes the lost connection and
connects again. Kombu's redis transport then uses channels of the closed connection whose
transport no longer knows its host: if the loss is noticed on a pub/sub link while the task
channel's `BRPOP` is pending, `Connection.collect()` gives up on that channel yet drops the
transport's client, and the `close()` that follows tries to put the channel's unacknowledged
messages back through it; a task acknowledged after the reconnect is acknowledged on its old
channel the same way. Both raised `AttributeError("'NoneType' object has no attribute
'hostname'")`, which is no connection error, so the worker's main process ended with
"Unrecoverable error" and, with nothing to restart it, calls waited until their attempts
expired.

Two guards, both installed by `dex_celery.app.configure_celery`:

- `guard_closed_channels()`: a channel whose connection is closed raises Redis's
  `ConnectionError` when it needs a client, as any other use of a dead link does, so Kombu's
  and Celery's own handlers (`maybe_close_channel`, `ack_log_error`) deal with it: the close
  goes on, the acknowledgement is logged as impossible.
- `Consumer` (the app's `worker_consumer`, unless the app names its own): whatever else the
  teardown of the lost connection raises is logged in one line, and Celery reconnects as it
  would have; the connection is already detached, so nothing of it is used again.

The consumer also takes part in deploys (docs/reliability.md, "Deploys"): when it stops at a
warm shutdown it hands back the messages no pool process has started
(`shutdown.hand_back_unstarted`), and a message of a tool this worker does not have is handed
back to the queue for a worker that has it instead of being dropped (`unknown_tools.park`).

Messages that could not be put back or acknowledged stay in Kombu's unacknowledged set in
Redis; its visibility timeout restores them, and a redelivered attempt is refused by its claim
(S3.2, S3.3) or ended by its schedule-to-start deadline (S3.5) like any attempt that did not
reach a worker: no tool runs twice because a link broke.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import redis
from celery.exceptions import CPendingDeprecationWarning
from celery.worker.consumer import Consumer as CeleryConsumer
from celery.worker.state import active_requests
from kombu.transport import redis as kombu_redis

from dex_celery.processes.shutdown import hand_back_unstarted
from dex_celery.processes.unknown_tools import park
from dex_celery.processes.worker import services_of
from dex_celery.tools.tool import TASK_PREFIX

log = logging.getLogger("dex_celery.processes.consumer")

#: Celery's default `worker_consumer`; `configure_celery` replaces only this one.
CELERY_CONSUMER = "celery.worker.consumer:Consumer"
#: What `configure_celery` sets `worker_consumer` to.
DEX_CONSUMER = "dex_celery.processes.consumer:Consumer"


class Consumer(CeleryConsumer):  # type: ignore[misc]  # Celery ships no type hints
    """Celery's consumer; a failure while closing a lost broker connection is not fatal, a
    warm shutdown hands back what was never started, and a tool this worker does not have is
    handed back rather than dropped."""

    def stop(self) -> None:
        services = services_of(self.app)
        if services is not None:
            # Shut already by SIGTERM; shut here too for a shutdown without the signal (a
            # remote `shutdown` command): no pool process claims from now on.
            services.shutdown.gate.shut()
        super().stop()  # the task consumer is cancelled: nothing new arrives
        hand_back_unstarted()

    def on_unknown_task(self, body: Any, message: Any, exc: BaseException) -> None:
        name = (message.headers or {}).get("task") if message is not None else None
        services = services_of(self.app)
        if (
            isinstance(name, str)
            and name.startswith(TASK_PREFIX)
            and services is not None
            and park(self, message, name[len(TASK_PREFIX) :], services)
        ):
            return
        super().on_unknown_task(body, message, exc)

    def on_connection_error_after_connected(self, exc: BaseException) -> None:
        if not self.app.conf.worker_cancel_long_running_tasks_on_connection_loss:
            # Celery warns at every reconnect that a future default will cancel running tasks;
            # dex-celery chose to keep them running (`configure_celery`) and says so in one line.
            warnings.filterwarnings(
                "ignore", message=CANCEL_WARNING, category=CPendingDeprecationWarning
            )
            log.info(
                "consumer: running tools go on while the broker link is down; their leases "
                "and claims in the ledger decide their outcome"
            )
        try:
            super().on_connection_error_after_connected(exc)
        except Exception as teardown:  # Kombu's cleanup of a dead link; never SystemExit & co.
            # Celery detached the connection (`self.connection = None`) before closing it, so
            # the reconnect that follows builds a new one and never touches this one again.
            self.connection = None
            log.warning(
                "consumer: closing the lost broker connection failed (%r); connecting again "
                "anyway (docs/operations.md)",
                teardown,
            )
            self._after_failed_teardown()

    def _after_failed_teardown(self) -> None:
        """What Celery's handler does after closing the connection, which the failure skipped:
        with `worker_cancel_long_running_tasks_on_connection_loss`, cancel the running tasks
        that are acknowledged late (dex-celery leaves the setting off: see `configure_celery`)."""
        if not self.app.conf.worker_cancel_long_running_tasks_on_connection_loss:
            return
        for request in tuple(active_requests):
            task: Any = request.task
            if task.acks_late and not request.acknowledged:
                try:
                    request.cancel(self.pool)
                except Exception:  # as Celery does: one failure does not stop the others
                    log.warning("could not cancel %r after the connection loss", request)


#: The start of the warning Celery 5 gives at each reconnect while
#: `worker_cancel_long_running_tasks_on_connection_loss` is off (a regular expression).
CANCEL_WARNING = r"\s*In Celery 5\.1 we introduced an optional breaking change"
#: Marks Kombu's `_connparams` once it is guarded, so installing twice wraps once.
_GUARDED = "__dex_guarded__"


def guard_closed_channels() -> None:
    """Make a Kombu Redis channel of a closed connection raise a connection error, not
    `AttributeError`, when it needs a new client (see the module's docstring). Idempotent."""
    channel_class: Any = kombu_redis.Channel
    original = channel_class._connparams
    if getattr(original, _GUARDED, False):
        return

    def _connparams(channel: Any, asynchronous: bool = False) -> Any:
        transport = channel.connection
        if transport is None or transport.client is None:
            raise redis.ConnectionError(
                "the broker connection of this channel was closed (the link was lost); "
                "a new connection serves the worker"
            )
        return original(channel, asynchronous=asynchronous)

    setattr(_connparams, _GUARDED, True)
    _connparams.__doc__ = original.__doc__
    _connparams.__wrapped__ = original  # type: ignore[attr-defined]  # Kombu's own, for tests
    channel_class._connparams = _connparams
