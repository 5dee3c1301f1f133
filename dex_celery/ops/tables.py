"""Plain-text layout shared by the CLI and the demo (neither imports the other for it)."""

from __future__ import annotations

from collections.abc import Sequence


def shorten(text: str | None, width: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain aligned table: readable in a terminal, a log file and a CI transcript alike."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])
