"""The one decoder of ledger script replies.

Every script answers with a flat list of field, value pairs (`{'kind', 'finished', 'status',
'succeeded', ...}`), so a reply names what it carries and no caller counts positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dex_celery.errors import LedgerError


def decode(script: str, reply: Any) -> dict[str, str]:
    """The reply of `script` as a dict; a malformed reply is a `LedgerError`."""
    if not isinstance(reply, Sequence) or isinstance(reply, str | bytes) or len(reply) % 2:
        raise LedgerError(f"ledger script {script} answered {reply!r}, not field/value pairs")
    fields = {str(reply[i]): _text(reply[i + 1]) for i in range(0, len(reply), 2)}
    if "kind" not in fields:
        raise LedgerError(f"ledger script {script} answered without a kind: {reply!r}")
    return fields


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
