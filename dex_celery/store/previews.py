"""The preview text kept with a call waiting for approval (docs/guardrails.md, "Previews").

One column, `dex_tool_calls.preview`, written by the worker that ran the tool's preview
function; every listing reads it with the call's record, so showing it costs no extra query.
"""

from __future__ import annotations

from sqlalchemy import update

from dex_celery.store.repository import Store
from dex_celery.store.schema import tool_calls


def store_preview(store: Store, key: str, text: str) -> bool:
    """Keep `text` as the call's preview; True if the call exists. The first text written
    stays: a run repeated after a redelivery does not replace what a person may have read."""
    query = (
        update(tool_calls)
        .where(tool_calls.c.key == key)
        .where(tool_calls.c.preview.is_(None))
        .values(preview=text)
    )
    with store.engine.begin() as conn:
        return bool(conn.execute(query).rowcount)
