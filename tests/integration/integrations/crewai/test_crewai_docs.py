"""docs/frameworks.md's CrewAI file, run as written in a fresh folder (in .venv-crewai) against
a real redis-server and database: the refund waits for a person, the model reads so, and the
call shown to the person names the conversation without the card."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.support.frameworks.crewai_skip import require_crewai

require_crewai()

from dex_celery import Dex  # noqa: E402
from tests.support.docs.docs_files import run_in, write_files  # noqa: E402


def test_the_crewai_refund_waits_for_a_person_and_the_card_is_never_shown(
    tmp_path: Path, env: dict[str, str], dex: Dex
) -> None:
    folder = write_files("docs/frameworks.md", tmp_path)
    printed = run_in(folder, env, sys.executable, "crewai_approval.py").strip().splitlines()
    assert printed[-2] == "The refund waits for a person's approval."
    read = printed[-1]
    assert read.startswith("The call ") and "is waiting for a person's approval" in read
    key = read.split()[2]
    assert re.fullmatch(r"[^/]+/run-[0-9a-f]{12}\.turn-1/call_1", key), key
    shown = run_in(
        folder, env, str(Path(sys.executable).with_name("dex-celery")),
        "-A", "shop", "calls", "show", key,
    )  # fmt: skip
    assert "awaiting_approval" in shown
    assert "Refund order 1002 to ***." in shown.split("conversation before the call", 1)[1]
    assert "4111" not in shown and "4111" not in read
