"""The order desk's tools (not installed; see `dex_celery.examples.orderdesk.tools`)."""

from __future__ import annotations

from dex_celery.examples.orderdesk.tools import (
    DEFAULT_QUEUE,
    LABELS_QUEUE,
    register,
    task_routes,
)

__all__ = ["DEFAULT_QUEUE", "LABELS_QUEUE", "register", "task_routes"]
