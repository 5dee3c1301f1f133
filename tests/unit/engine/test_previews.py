"""Previews (S13.5): what a registration refuses, and the one display rule every output uses
(`shown_preview`): the kept text, pending while it may come, unavailable once it cannot."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from dex_celery import Dex, EffectClass, Settings, ToolContext, ToolPolicy
from dex_celery.engine.preview_worker import _text
from dex_celery.engine.request.previews import MAX_PREVIEW_CHARS, PENDING, shown_preview
from dex_celery.errors import InvalidToolSignature
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import resolve_policy
from dex_celery.model.records import ToolCallRecord
from dex_celery.tools.sealing import Scrubber
from tests.support.stores.call_records import call_record

WRITE = ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE)


def _dex() -> Dex:
    return Dex(Celery("previews-unit"), Settings(preview_timeout=2.0))


def _refund(ctx: ToolContext, order: str, amount: int = 0) -> Any:
    return order


def test_a_preview_must_take_the_tools_arguments_by_name() -> None:
    dex = _dex()
    dex.tool("ok", policy=WRITE, preview=lambda order, amount=0: f"refund {order}")(_refund)
    dex.tool("any", policy=WRITE, preview=lambda **arguments: "refund")(_refund)
    with pytest.raises(InvalidToolSignature, match="'ordr'"):
        dex.tool("typo", policy=WRITE, preview=lambda ordr: "refund")(_refund)
    with pytest.raises(InvalidToolSignature, match="preview must be a function"):
        dex.tool("text", policy=WRITE, preview="refund")(_refund)  # type: ignore[arg-type]
    assert "typo" not in dex.tools and dex.tools["ok"].preview is not None


def _record(status: CallStatus = CallStatus.AWAITING_APPROVAL, **changes: Any) -> ToolCallRecord:
    policy = resolve_policy(WRITE, None, None, Settings())
    return call_record(
        status, **{"policy": policy, "tool_name": "ok", "requested_at": 100.0, **changes}
    )


def test_every_output_shows_the_kept_text_pending_or_unavailable() -> None:
    dex = _dex()
    dex.tool("ok", policy=WRITE, preview=lambda order: order)(_refund)
    dex.tool("plain", policy=WRITE)(_refund)
    tools, settings = dex.tools, dex.settings
    assert shown_preview(_record(), tools, settings, 100.5) == PENDING
    assert shown_preview(_record(), tools, settings, 104.0) == (
        "preview unavailable: no worker ran it within 4s (2 x preview_timeout)"
    )
    kept = _record(preview="Refund 42.00 EUR")
    assert shown_preview(kept, tools, settings, 104.0) == "Refund 42.00 EUR"
    assert shown_preview(_record(tool_name="plain"), tools, settings, 100.5) is None
    assert shown_preview(_record(CallStatus.SUCCEEDED), tools, settings, 100.5) is None


def test_preview_text_is_one_short_line_without_secrets() -> None:
    scrubber = Scrubber({"card": "4111-1111-1111-1111"})
    assert _text("Refund\n  to card 4111-1111-1111-1111", scrubber) == "Refund to card ***"
    assert _text("x" * 900, scrubber) == "x" * (MAX_PREVIEW_CHARS - 1) + "…"
    assert _text(42, scrubber) == "preview unavailable: it returned int, not text"
    assert _text("  ", scrubber) == "preview unavailable: it returned no text"
