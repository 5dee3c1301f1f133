"""Celery signal handlers of the operators' tools: the worker's metrics port, beat's webhooks.

`Dex` connects them once (`connect(dex)`); each acts only for its own Celery app and only when
its setting asks for it, so a deployment without `worker_metrics_port` or `webhook_urls`
runs exactly as before.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery import signals

from dex_celery.ops.webhooks import WebhookSender, receivers

if TYPE_CHECKING:
    from dex_celery.app import Dex

log = logging.getLogger("dex_celery.processes.hooks")


def connect(dex: Dex) -> None:
    def on_worker_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is dex.celery and dex.settings.worker_metrics_port:
            # deferred: prometheus_client is an optional dependency (extras `metrics`, `web`)
            from dex_celery.ops.metrics import serve_worker_metrics

            serve_worker_metrics(dex)

    def on_beat_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is dex.celery:
            start_webhooks(dex)

    signals.worker_init.connect(on_worker_init, weak=False)
    signals.beat_init.connect(on_beat_init, weak=False)
    signals.beat_embedded_init.connect(on_beat_init, weak=False)


def start_webhooks(dex: Dex) -> WebhookSender | None:
    """Start the webhook sender thread if receivers are configured (beat's side)."""
    if not receivers(dex.settings.webhook_urls):
        return None
    sender = WebhookSender(dex)
    sender.start()
    log.info("webhooks: sending to %d receiver(s)", len(sender.urls))
    return sender
