"""The order desk's beat wiring (not installed; see `dex_celery.examples.orderdesk.beat`)."""

from __future__ import annotations

from dex_celery.examples.orderdesk.beat import beat_schedule, register_checks

__all__ = ["beat_schedule", "register_checks"]
