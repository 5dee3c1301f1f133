"""The README's "Writing a tool" recipe: its blocks, in order."""

from __future__ import annotations

import re

from devtools.processes import ROOT

BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)


def recipe() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Writing a tool")
    end = text.index("\n## ", start + 1)
    return BLOCK.findall(text[start:end])
