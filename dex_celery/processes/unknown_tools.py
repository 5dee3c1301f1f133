"""A message of a tool this worker does not have: handed back, never dropped (version skew;
docs/reliability.md, "Deploys").

During a rolling deploy a requester of the new release may ask for a tool that a worker of the
old release does not know. Celery would log "Received unregistered task" and drop the message,
and the call would wait, unexplained, until its schedule-to-start deadline. Here the worker:

1. says on the attempt why it still waits (`Ledger.note_waiting`: "no running worker has this
   tool yet ..."), shown by `calls show` and joined to the did-not-run text if the deadline
   passes first;
2. holds the message `unknown_tool_requeue_delay` seconds (not acknowledged, so a crash
   returns it), then publishes the very message again at the tail of its queue and
   acknowledges the copy it held: a worker that has the tool takes it; old workers pass it on,
   one pass per delay each, never in a tight loop, and calls behind it in the queue go first;
3. drops a message whose attempt no longer waits (claimed elsewhere, ended, expired, or of an
   older ledger life): it is stale, and so the passing on ends at the attempt's deadline.

The schedule-to-start deadline stays the ledger's: if no worker with the tool comes, the sweeper
ends the attempt "did not run" as for any attempt that never reached a worker (S4.2).
"""

from __future__ import annotations

import logging
from typing import Any

from dex_celery.errors import DexError
from dex_celery.model.ids import parse_task_id
from dex_celery.processes.worker import WorkerServices

log = logging.getLogger("dex_celery.processes.unknown_tools")

#: How a republished copy's publish is retried (the broker is briefly away).
_PUBLISH_RETRY = {
    "max_retries": 3,
    "interval_start": 0.0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}


def waiting_note(node: str, tool: str) -> str:
    """What the attempt says while workers without its tool hand it back."""
    return (
        f"no running worker has this tool yet: worker {node} does not have tool {tool!r} (an "
        "older release?) and handed the attempt back to the queue for one that does"
    )


def park(consumer: Any, message: Any, tool: str, services: WorkerServices) -> bool:
    """Celery's consumer met a `dex.tool.<tool>` message this worker has no task for. False:
    the message is no dex attempt (a forged task id), left to Celery (logged, dropped)."""
    task_id = str((message.headers or {}).get("id", ""))
    try:
        call, attempt = parse_task_id(task_id)
    except DexError:
        return False
    note = waiting_note(str(consumer.hostname), tool)
    if not _still_waits(services, call.key, attempt, note):
        log.info(
            "stale message %s of unknown tool %r dropped: the attempt waits no more", task_id, tool
        )
        message.ack_log_error(log, consumer.connection_errors)
        return True
    delay = services.source.settings.unknown_tool_requeue_delay
    log.warning(
        "attempt %d of %s is for tool %r, which this worker does not have (an older release?); "
        "handing it back to the queue in %.1f s for a worker that has it",
        attempt,
        call.key,
        tool,
        delay,
    )
    consumer.timer.call_after(
        delay, hand_back, (consumer, message, services, call.key, attempt, note)
    )
    return True


def hand_back(
    consumer: Any, message: Any, services: WorkerServices, key: str, attempt: int, note: str
) -> None:
    """Publish the held message again at its queue's tail, then acknowledge the held copy; a
    message whose attempt waits no more is acknowledged only."""
    if not _still_waits(services, key, attempt, note):
        log.info("attempt %d of %s waits no more; its held message is dropped", attempt, key)
        message.ack_log_error(log, consumer.connection_errors)
        return
    try:
        republish(consumer.app, message)
    except Exception as e:  # the broker refused: put the held copy back as it is
        log.warning("could not republish attempt %d of %s (%s); requeued instead", attempt, key, e)
        message.reject_log_error(log, consumer.connection_errors, requeue=True)
        return
    message.ack_log_error(log, consumer.connection_errors)


def _still_waits(services: WorkerServices, key: str, attempt: int, note: str) -> bool:
    """Note why the attempt waits; False if the ledger says it waits no more. A ledger that
    cannot be reached says nothing: the message is handed back (its deadline still holds)."""
    try:
        return services.source.runtime.ledger.note_waiting(key, attempt, note)
    except Exception as e:
        log.warning("could not note on %s why it waits (%s); handing it back anyway", key, e)
        return True


def republish(celery: Any, message: Any) -> None:
    """The very message (body, headers, routing) published again, through the app's producer
    (publisher confirms on RabbitMQ). Headers the broker adds (`x-...`) are left out."""
    info = message.delivery_info or {}
    properties = message.properties or {}
    headers = {k: v for k, v in (message.headers or {}).items() if not str(k).startswith("x-")}
    with celery.producer_or_acquire() as producer:
        producer.publish(
            message.body,
            exchange=info.get("exchange") or "",
            routing_key=info.get("routing_key") or "",
            headers=headers,
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            correlation_id=properties.get("correlation_id"),
            reply_to=properties.get("reply_to"),
            retry=True,
            retry_policy=_PUBLISH_RETRY,
        )
