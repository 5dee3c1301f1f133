"""The README's "Writing a tool" recipe: its blocks, in order; and the environment a reader's
shell gives the commands the docs show."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from devtools.processes import ROOT

BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)


def recipe() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Writing a tool")
    end = text.index("\n## ", start + 1)
    return BLOCK.findall(text[start:end])


def reader_env(**extra: str) -> dict[str, str]:
    """A reader's shell: none of this process's `DEX_` settings, this environment's scripts first
    on `PATH`, output unbuffered; then `extra`."""
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEX_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env
