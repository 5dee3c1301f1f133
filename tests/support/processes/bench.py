"""Runs one `bench/` module the way a person would, for the benchmark smoke tests."""

from __future__ import annotations

import subprocess
import sys

from devtools.processes import ROOT


def run(module: str, *args: str, timeout: float = 120) -> str:
    """`python -m bench.<module> <args>` from the repository root; its stdout, or a failure
    carrying the tail of both streams."""
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout
