"""The worker's side of previews (S13.5, docs/guardrails.md "Previews"): the `dex.preview` task.

It runs a waiting call's preview function as a read: no ledger entry, no claim, no write fence;
a transient error is tried again within the one `preview_timeout`. The function runs in a thread
of its own, so its time limit holds on every pool, with the call's secret values opened for it
and scrubbed from its text and log lines (docs/secrets.md). One run at a time per call: a lock
in Redis (`KeySpace.preview_lock`) is held until the function returns.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from dex_celery.async_bridge import run_sync
from dex_celery.engine.attempt import TRANSIENT_ERRORS, is_async
from dex_celery.engine.request import (
    HARD_LIMIT_SLACK,
    MAX_PREVIEW_CHARS,
    PREVIEW_TASK,
    unavailable,
)
from dex_celery.errors import DexError, ToolError
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.store.previews import store_preview
from dex_celery.tools.arguments import check_arguments
from dex_celery.tools.log_scrub import scrubbing
from dex_celery.tools.sealing import Scrubber, unseal
from dex_celery.tools.tool import Tool

if TYPE_CHECKING:
    from celery import Celery

    from dex_celery.engine.runtime import Runtime
    from dex_celery.settings import Settings

log = logging.getLogger("dex_celery.engine.request.previews")

#: Tries of a preview that raised a transient error (a connection reset, a time-out, a
#: `RetryableToolError`), all within its one `preview_timeout`.
TRIES = 3


def register_preview_task(celery: Celery, runtime: Callable[[], Runtime]) -> None:
    """The `dex.preview` task of this app: late acknowledged (a worker's warm shutdown hands an
    untaken message back), never requeued after a lost pool process (its message may have
    expired, and the listing says "unavailable" once `preview_timeout` passed)."""

    def preview(key: str) -> None:
        run_preview(runtime(), key)

    celery.task(
        name=PREVIEW_TASK,
        shared=False,
        acks_late=True,
        reject_on_worker_lost=False,
        ignore_result=True,
        typing=False,
    )(preview)


# --- the worker's side -----------------------------------------------------------------------


def run_preview(runtime: Runtime, key: str) -> None:
    """Run the preview of a waiting call once and keep its text (the `dex.preview` task)."""
    store, settings = runtime.store, runtime.settings
    record = store.get_call(key)
    if record is None or record.status is not CallStatus.AWAITING_APPROVAL:
        return  # decided already: nobody will read it
    if record.preview is not None:
        return  # a redelivered message: the text is kept already
    tool = runtime.tools.get(record.tool_name)
    if tool is None or tool.preview is None:
        store_preview(store, key, unavailable("this worker's tool has no preview function"))
        return
    client: Any = runtime.redis
    lock, token = runtime.keys.preview_lock(key), uuid.uuid4().hex
    hold_ms = int((settings.preview_timeout * 2 + HARD_LIMIT_SLACK) * 1000)
    if not client.set(lock, token, nx=True, px=hold_ms):
        log.info("the preview of %s is running elsewhere; not running it twice", key)
        return

    def release() -> None:
        try:
            if client.get(lock) == token:
                client.delete(lock)
        except Exception:  # the lock expires on its own
            log.warning("could not release the preview lock of %s", key)

    text = preview_text(tool, record, settings, release)
    store_preview(store, key, text)


def preview_text(
    tool: Tool, record: ToolCallRecord, settings: Settings, release: Callable[[], None]
) -> str:
    """The preview's text, or `preview unavailable: <reason>`; `release` is called once the
    function has returned (a hung one keeps its lock until it does, or until the lock ends)."""
    scrubber = Scrubber()
    try:
        shown = json.loads(record.arguments)
        secrets = unseal(record.sealed_arguments, settings.secret_key)
        scrubber = Scrubber(secrets)
        kwargs = check_arguments(tool, {**shown, **secrets})
    except (DexError, ValueError) as e:
        release()
        return unavailable(scrubber.text(f"the arguments could not be read: {e}"))
    done: Future[str] = Future()
    timeout = settings.preview_timeout
    thread = threading.Thread(
        target=_run,
        args=(tool, kwargs, scrubber, done, release, time.monotonic() + timeout),
        name="dex-preview",
        daemon=True,
    )
    thread.start()
    try:
        return done.result(timeout=timeout)
    except FutureTimeout:
        return unavailable(f"it did not finish within {timeout:g}s (preview_timeout)")


def _run(
    tool: Tool,
    kwargs: dict[str, Any],
    scrubber: Scrubber,
    done: Future[str],
    release: Callable[[], None],
    deadline: float,
) -> None:
    """The function itself, in a thread of its own, so its time limit holds on every pool."""
    fn = tool.preview
    assert fn is not None
    try:
        with scrubbing(scrubber):
            for attempt in range(1, TRIES + 1):
                try:
                    value = run_sync(fn(**kwargs)) if is_async(fn) else fn(**kwargs)
                    done.set_result(_text(value, scrubber))
                    return
                except _RETRIED as e:
                    transient = not isinstance(e, ToolError) or e.retryable
                    if not transient or attempt == TRIES or time.monotonic() > deadline:
                        raise
                    time.sleep(min(0.2 * attempt, max(deadline - time.monotonic(), 0)))
    except BaseException as e:  # whatever it raised, the preview is unavailable
        message = e.message if isinstance(e, ToolError) else f"{type(e).__name__}: {e}"
        if not done.done():
            done.set_result(unavailable(_cut(scrubber.text(f"it raised {message}"))))
    finally:
        release()


#: What a preview may raise and be tried again for (a `ToolError` only when `retryable`).
_RETRIED: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, ToolError)


def _text(value: Any, scrubber: Scrubber) -> str:
    if not isinstance(value, str):
        return unavailable(f"it returned {type(value).__name__}, not text")
    text = " ".join(scrubber.text(value).split())
    return _cut(text) if text else unavailable("it returned no text")


def _cut(text: str) -> str:
    return text if len(text) <= MAX_PREVIEW_CHARS else text[: MAX_PREVIEW_CHARS - 1] + "…"
