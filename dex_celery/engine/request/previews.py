"""Previews (S13.5, docs/guardrails.md "Previews"): what a waiting call would do, in words.

A tool may declare `preview=fn`: a read-only function of the call's validated arguments that
returns short text ("Refund 42.00 EUR to Ada Lovelace for order 17"). When a call of it starts
waiting for approval, the requester publishes one `dex.preview` task; a worker runs the
function as a read (no ledger entry, no claim, no write fence; a transient error is tried
again), within `preview_timeout`, and keeps the text (or `preview unavailable: <reason>`) with
the call. Every place that shows the waiting call shows that text: the web approval page,
`approvals list`, the approval webhook and the frameworks' approval requests.

The preview never decides anything: approving or rejecting does not wait for it, and a preview
that raises, hangs or never ran only reads "preview unavailable". The worker's side is
`engine/preview_worker.py`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dex_celery.errors import InvalidToolSignature
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.tools.arguments import schema_properties
from dex_celery.tools.tool import Tool

if TYPE_CHECKING:
    from celery import Celery

    from dex_celery.settings import Settings
    from dex_celery.store.repository import Store

log = logging.getLogger("dex_celery.engine.request.previews")

#: The Celery task that runs a call's preview on a worker.
PREVIEW_TASK = "dex.preview"
#: Longest preview text kept; a longer one is cut, with `…`.
MAX_PREVIEW_CHARS = 500
#: How every failed preview reads.
UNAVAILABLE = "preview unavailable"
#: What a listing shows while the preview may still come.
PENDING = "preview pending: a worker has not finished it yet"
#: Seconds beyond `preview_timeout` before Celery's hard limit ends a stuck preview task.
HARD_LIMIT_SLACK = 5.0


def unavailable(reason: str) -> str:
    return f"{UNAVAILABLE}: {reason}"


# --- registration ----------------------------------------------------------------------------


def check_preview(tool: Tool) -> None:
    """At registration (S1.6): the preview takes the tool's arguments by name, nothing else."""
    fn = tool.preview
    if fn is None:
        return
    if not callable(fn):
        raise InvalidToolSignature(f"tool {tool.name!r}: preview must be a function")
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError) as e:
        raise InvalidToolSignature(
            f"tool {tool.name!r}: cannot read its preview's signature: {e}"
        ) from None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    known = schema_properties(tool.input_schema or {})
    wrong = [
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL)
        or (p.name not in known and p.default is inspect.Parameter.empty)
    ]
    if wrong:
        raise InvalidToolSignature(
            f"tool {tool.name!r}: its preview takes {', '.join(map(repr, wrong))}, which the "
            f"tool's arguments do not give by name (arguments: {', '.join(sorted(known)) or 'none'})"
        )


# --- the requester's side --------------------------------------------------------------------


def has_preview(tools: Mapping[str, Tool], record: ToolCallRecord) -> bool:
    tool = tools.get(record.tool_name)
    return tool is not None and tool.preview is not None


def request_previews(
    celery: Celery, settings: Settings, tools: Mapping[str, Tool], records: list[ToolCallRecord]
) -> None:
    """Publish the preview task of each call that starts waiting for approval and whose tool
    has a preview. Never raises: a preview that cannot be asked for reads "unavailable", and
    the call waits for its decision as it would without one."""
    for record in records:
        if record.status is not CallStatus.AWAITING_APPROVAL or not has_preview(tools, record):
            continue
        try:
            celery.send_task(
                PREVIEW_TASK,
                kwargs={"key": record.key},
                task_id=f"preview:{record.key}",
                # A message no worker took in time is dropped: its call reads "unavailable".
                expires=settings.preview_timeout,
                time_limit=settings.preview_timeout + HARD_LIMIT_SLACK,
                add_to_parent=False,
                retry=True,
                retry_policy={"max_retries": 1, "interval_start": 0.0},
            )
        except Exception as e:  # kombu raises several unrelated types for a broker that is down
            log.warning("could not ask for the preview of %s: %s", record.key, e)


# --- what every listing shows ----------------------------------------------------------------


def preview_deadline(record: ToolCallRecord, settings: Settings) -> float:
    """When a preview not kept yet reads "unavailable": its message may wait `preview_timeout`
    for a worker, and the function may run as long again."""
    return record.requested_at + 2 * settings.preview_timeout


def shown_preview(
    record: ToolCallRecord, tools: Mapping[str, Tool], settings: Settings, now: float
) -> str | None:
    """The preview of a call as every output shows it: the kept text; `PENDING` while it may
    still come; "unavailable" once it cannot; None for a tool without a preview."""
    if record.preview is not None:
        return record.preview
    if record.status is not CallStatus.AWAITING_APPROVAL or not has_preview(tools, record):
        return None
    if now >= preview_deadline(record, settings):
        return unavailable(
            f"no worker ran it within {2 * settings.preview_timeout:g}s (2 x preview_timeout)"
        )
    return PENDING


def preview_pending(
    record: ToolCallRecord, tools: Mapping[str, Tool], settings: Settings, now: float
) -> bool:
    return shown_preview(record, tools, settings, now) == PENDING


def settled_preview(
    store: Store, record: ToolCallRecord, tools: Mapping[str, Tool], settings: Settings
) -> str | None:
    """The call's preview once it is kept or can no longer come (at most `2 x preview_timeout`
    after the request): what a framework's approval request carries. Polls the record, on
    the ledger's clock (S10.1) read once."""
    offset = store.clock() - time.monotonic()
    while preview_pending(record, tools, settings, time.monotonic() + offset):
        time.sleep(0.05)
        current = store.get_call(record.key)
        if current is None:
            return None
        record = current
    return shown_preview(record, tools, settings, time.monotonic() + offset)


async def asettled_preview(
    store: Store, record: ToolCallRecord, tools: Mapping[str, Tool], settings: Settings
) -> str | None:
    """`settled_preview` for async code (in a thread: the store is synchronous)."""
    return await asyncio.to_thread(settled_preview, store, record, tools, settings)
