"""docs/frameworks.md's examples (Reconciliation, Approvals in context, Google ADK, Microsoft
Agent Framework) and commands, run as written in a fresh folder against a real redis-server and
database (S12.1)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from dex_celery import Dex
from tests.support.docs.docs_files import run_in, write_files

REPORT = "Note from the payment system: the refund on order 1002 went through."


@pytest.fixture
def folder(tmp_path: Path, dex: Dex) -> Path:
    return write_files("docs/frameworks.md", tmp_path)


def test_the_report_reaches_the_langgraph_model_once(folder: Path, env: dict[str, str]) -> None:
    printed = run_in(folder, env, sys.executable, "report_reaches_langgraph.py")
    user_texts = ast.literal_eval(printed.strip().splitlines()[-1])
    assert user_texts.count(REPORT) == 1
    assert user_texts[0] == "Where is my refund?" and "Thanks." in user_texts


def test_the_approval_shows_the_request_without_the_card(folder: Path, env: dict[str, str]) -> None:
    printed = run_in(folder, env, sys.executable, "approval_in_context.py")
    assert printed.strip() == "conv-7/turn-1/call_1"
    shown = run_in(
        folder, env, str(Path(sys.executable).with_name("dex-celery")),
        "-A", "shop", "calls", "show", "conv-7/turn-1/call_1",
    )  # fmt: skip
    section = shown.split("conversation before the call", 1)[1]
    assert "Refund order 1002 to my card ***." in section
    assert "[assistant]" in section and "I will refund order 1002." in section
    assert "4111" not in shown


def test_the_adk_confirmation_names_the_waiting_call_without_the_card(
    folder: Path, env: dict[str, str], dex: Dex
) -> None:
    printed = run_in(folder, env, sys.executable, "adk_approval.py")
    payload = ast.literal_eval(printed.strip().splitlines()[-1])
    assert payload["dex_key"] == "adk-7/turn-1/call_1"
    assert payload["arguments"]["card"] == "***" and "4111" not in printed
    shown = run_in(
        folder, env, str(Path(sys.executable).with_name("dex-celery")),
        "-A", "shop", "calls", "show", "adk-7/turn-1/call_1",
    )  # fmt: skip
    assert "awaiting_approval" in shown
    assert "Refund order 1002 to ***." in shown.split("conversation before the call", 1)[1]


def test_the_claude_agent_sdk_example_asks_the_person_and_records_the_rejection(
    folder: Path, env: dict[str, str], dex: Dex
) -> None:
    """The example drives the npm CLI of tests/js/claude (skipped, saying why, without Node.js)
    against its scripted Messages API server."""
    from tests.support.frameworks.claude_agent import claude_cli

    cli = claude_cli()
    printed = run_in(folder, {**env, "CLAUDE_CLI": str(cli)}, sys.executable, "claude_approval.py")
    shown_line, read = printed.strip().splitlines()[-2:]
    shown = ast.literal_eval(shown_line)
    assert shown["dex_key"] == "claude-7/turn-1/toolu_1" and shown["tool"] == "refund"
    assert shown["arguments"]["card"] == "***" and "4111" not in printed
    record = dex.client().get_call("claude-7/turn-1/toolu_1")
    assert record.approval is not None and record.approval.decided_by == "alice"
    assert "not without the receipt" in (record.error or "")
    assert read.startswith("The call was rejected and did not run")


def test_the_agent_framework_approval_request_names_the_call_and_a_rejection_is_recorded(
    folder: Path, env: dict[str, str], dex: Dex
) -> None:
    printed = run_in(folder, env, sys.executable, "maf_approval.py")
    lines = printed.strip().splitlines()
    shown = ast.literal_eval(lines[0])
    assert shown["dex_key"] == "maf-7/turn-1/call_1"
    assert shown["arguments"]["card"] == "***" and "4111" not in printed
    assert lines[-1] == "Not refunded."
    record = dex.client().get_call("maf-7/turn-1/call_1")
    assert record.status.value == "rejected"
    assert record.approval is not None and record.approval.decided_by == "alice"
    assert "not to this card" in (record.error or "")
    shown_call = run_in(
        folder, env, str(Path(sys.executable).with_name("dex-celery")),
        "-A", "shop", "calls", "show", "maf-7/turn-1/call_1",
    )  # fmt: skip
    assert "rejected" in shown_call and "alice" in shown_call
    assert "Refund order 1002 to ***." in shown_call.split("conversation before the call", 1)[1]
