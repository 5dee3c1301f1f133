"""Every time a model reads is a UTC time written out (`2026-12-06 06:36:19 UTC`), never Unix
seconds (`deadline 1796538979.7609718`): the text of a call waiting for approval that each
framework adapter returns, the MCP task's status message, and the engine's texts of a passed
approval deadline (`dex_celery/model/times.format_utc`, the one way times are shown).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from dex_celery.integrations.frameworks.calls import pending_text
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord

DEADLINE = 1796538979.7609718
SHOWN = "2026-12-06 06:36:19 UTC"
#: Unix seconds as a model would see them leak: ten digits, with or without a fraction.
UNIX_SECONDS = re.compile(r"\b\d{9,11}(?:\.\d+)?\b")


def assert_reads_utc(text: str) -> None:
    assert SHOWN in text, text
    assert not UNIX_SECONDS.search(text), text


def test_the_framework_adapters_text_of_a_waiting_call(
    record_of: Callable[..., ToolCallRecord],
) -> None:
    """CrewAI, Google ADK and every adapter built on `frameworks.calls` return this text."""
    assert_reads_utc(pending_text(record_of(CallStatus.AWAITING_APPROVAL, deadline=DEADLINE)))


def test_the_mcp_task_status_message_of_a_waiting_call(
    record_of: Callable[..., ToolCallRecord],
) -> None:
    pytest.importorskip("mcp")
    from dex_celery.integrations.mcp.tasks import task_of  # needs the mcp extra

    task = task_of(
        record_of(CallStatus.AWAITING_APPROVAL, deadline=DEADLINE), None, poll_interval=1.0
    )
    assert_reads_utc(task["statusMessage"])
