"""The order desk's outcome checks (not installed; see `dex_celery.examples.orderdesk.checks`)."""

from __future__ import annotations

from dex_celery.examples.orderdesk.checks import cancellation_check, checks, label_check

__all__ = ["cancellation_check", "checks", "label_check"]
