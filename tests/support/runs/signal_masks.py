"""A process's signal masks as the kernel shows them (`/proc/<pid>/task/<tid>/status`): what a
process it starts inherits (an ignored or blocked SIGINT outlives `exec`)."""

from __future__ import annotations

from pathlib import Path

#: Pending (thread, process), blocked and ignored signals.
ALL_MASKS = ("SigPnd", "ShdPnd", "SigBlk", "SigIgn")


def signal_masks(pid: int, names: tuple[str, ...] = ALL_MASKS, *, thread: int | None = None) -> str:
    """The `names` lines of the status of `pid` (its thread `thread`: the main one by default,
    whose masks a child forked from it inherits), or why they could not be read."""
    try:
        status = Path(f"/proc/{pid}/task/{thread or pid}/status").read_text().splitlines()
    except OSError as e:
        return f"unreadable ({e})"
    return ", ".join(line for line in status if line.startswith(names))
