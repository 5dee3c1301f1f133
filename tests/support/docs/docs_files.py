"""The docs' `# file: NAME` Python blocks, written into a folder and run there as a reader would
(a fresh folder on `PYTHONPATH`, the test's Redis and database in the environment)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from devtools.processes import ROOT

BLOCK = re.compile(r"```python\n# file: (\S+)\n(.*?)```", re.S)


def write_files(page: str, folder: Path) -> Path:
    """Write every `# file:` block of `page` (a path under the repository) into `folder`."""
    for name, body in BLOCK.findall((ROOT / page).read_text()):
        (folder / name).write_text(body)
    return folder


def reader_path(folder: Path) -> str:
    """`PYTHONPATH` of a reader's folder: the folder first, then what the test runs with (a
    worktree's checkout over the installed package)."""
    return os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)


def run_in(folder: Path, env: dict[str, str], *command: str) -> str:
    """Run `command` in `folder`; its stdout (a failure shows its stderr)."""
    out = subprocess.run(
        command,
        cwd=folder,
        env={**os.environ, **env, "PYTHONPATH": reader_path(folder)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout
