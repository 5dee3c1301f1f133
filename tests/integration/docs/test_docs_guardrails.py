"""docs/guardrails.md's budget files, run as written in a fresh folder against a real
redis-server and database (S13.1): what they print is what the page says they print."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dex_celery import Dex
from tests.support.docs_files import run_in, write_files

PAGE = "docs/guardrails.md"


def test_four_refunds_print_what_the_page_shows(
    tmp_path: Path, env: dict[str, str], dex: Dex
) -> None:
    folder = write_files(PAGE, tmp_path)
    printed = run_in(folder, env, sys.executable, "four_refunds.py")
    shown = re.search(
        r"prints\n\n```\n(.*?)```", (Path(__file__).parents[3] / PAGE).read_text(), re.S
    )
    assert shown is not None
    assert [line.rstrip() for line in printed.splitlines()] == shown.group(1).splitlines()
