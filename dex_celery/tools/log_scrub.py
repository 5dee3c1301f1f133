"""Secret values kept out of the worker's log, whoever writes the line (docs/secrets.md).

The worker scrubs what it logs itself (a tool's traceback). A tool may also log or print its
secret (`log.info("logging in with %s", credentials)`, `print(token)`); Celery sends a pool
process's stdout and stderr to its logger too. While an attempt with secret arguments runs,
`scrubbing(scrubber)` puts its `Scrubber` on the list this module keeps, and a filter on every
log handler of the process replaces the secret values (each leaf of a secret dict or list,
`sealing.Scrubber`) in each record's message, exception text and stack before any handler
writes it.

All running attempts' scrubbers apply to every record of the process (a threads pool runs
several at once, and a log line does not say which attempt wrote it): scrubbing another
attempt's line of a value it happens to contain hides text, never shows a secret. A record
logged when no attempt with secrets runs costs one empty-list check.
"""

from __future__ import annotations

import logging
import threading
import traceback
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from dex_celery.forks import after_fork
from dex_celery.tools.sealing import Scrubber

_lock = threading.Lock()
_active: list[Scrubber] = []
#: Handlers that already carry the filter (a handler added later gets it at the next attempt).
_filtered: weakref.WeakSet[logging.Handler] = weakref.WeakSet()


class ScrubbingFilter(logging.Filter):
    """Replaces the running attempts' secret values in a record before it is written."""

    def filter(self, record: logging.LogRecord) -> bool:
        scrubbers = list(_active)  # a copy: attempts start and end in other threads
        if not scrubbers:
            return True

        def clean(text: str) -> str:
            for scrubber in scrubbers:
                text = scrubber.text(text)
            return text

        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let the handler report it as it would
            return True
        scrubbed = clean(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        if record.exc_info and not record.exc_text:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if record.exc_text:
            record.exc_text = clean(record.exc_text)
        if record.stack_info:
            record.stack_info = clean(record.stack_info)
        return True


_FILTER = ScrubbingFilter()


def _handlers() -> Iterator[logging.Handler]:
    """Every handler of the process: the root logger's and every named logger's."""
    yield from logging.getLogger().handlers
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            yield from logger.handlers


def _install() -> None:
    for handler in _handlers():
        if handler not in _filtered:
            handler.addFilter(_FILTER)
            _filtered.add(handler)


@contextmanager
def scrubbing(scrubber: Scrubber) -> Iterator[None]:
    """While the block runs, no log line of this process shows the scrubber's values."""
    if not scrubber:
        yield
        return
    with _lock:
        _install()
        _active.append(scrubber)
    try:
        yield
    finally:
        with _lock:
            _active.remove(scrubber)


def _forget_process_state() -> None:
    """After a fork (`dex_celery.forks`): the child runs none of the parent's attempts."""
    global _lock
    _lock = threading.Lock()
    _active.clear()


after_fork(_forget_process_state)
