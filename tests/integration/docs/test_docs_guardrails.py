"""docs/guardrails.md's files run as written in a fresh folder, against a real redis-server,
database and (for "Previews") a prefork worker: the listing shows the preview (S13.5); the
budgets' example prints what the page says it prints (S13.1)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.processes import ROOT, CeleryWorker, wait_for
from dex_celery import Dex
from tests.support.docs.docs_files import reader_path, run_in, write_files

#: The reader's `celery -A refunds worker`, plus the ready file the test waits for.
READY_APP = """import os, time
from pathlib import Path
from celery import signals
from refunds import app, dex


@signals.worker_ready.connect
def _ready(**_):
    (Path(os.environ["READY_DIR"]) / f"ready-{os.getpid()}").write_text(str(time.time()))
"""


@pytest.fixture
def folder(tmp_path: Path, dex: Dex) -> Path:
    (tmp_path / "reader").mkdir()
    folder = write_files("docs/guardrails.md", tmp_path / "reader")
    (folder / "ready_app.py").write_text(READY_APP)
    return folder


@pytest.fixture
def worker(folder: Path, env: dict[str, str], tmp_path: Path) -> Iterator[CeleryWorker]:
    worker = CeleryWorker(
        "ready_app", {**env, "PYTHONPATH": reader_path(folder)}, tmp_path / "ready",
        ready_env="READY_DIR", cwd=folder,
    ).start()  # fmt: skip
    yield worker
    worker.stop()


def test_the_listing_shows_what_the_refund_would_do(
    folder: Path, env: dict[str, str], worker: CeleryWorker
) -> None:
    assert run_in(folder, env, sys.executable, "ask_refund.py").strip() == "awaiting_approval"
    dex_celery = str(Path(sys.executable).with_name("dex-celery"))

    def listed() -> str:
        return run_in(folder, env, dex_celery, "-A", "refunds", "approvals", "list")

    wait_for(lambda: "preview pending" not in listed(), timeout=30, what="the preview")
    text = listed()
    assert "    preview: Refund 42.00 EUR to Ada Lovelace for order 17\n" in text
    assert "4111" not in text


def test_four_refunds_print_what_the_budgets_section_shows(
    folder: Path, env: dict[str, str]
) -> None:
    """S13.1: three refunds of a session are admitted, the fourth waits saying why, a refund
    over the tenant's day of cents is rejected with text the model can act on."""
    printed = run_in(folder, env, sys.executable, "four_refunds.py")
    page = (ROOT / "docs/guardrails.md").read_text()
    shown = re.search(r"prints\n\n```\n(.*?)```", page, re.S)
    assert shown is not None
    assert [line.rstrip() for line in printed.splitlines()] == shown.group(1).splitlines()
