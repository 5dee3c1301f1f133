"""The installed `dex-celery` script run as a person runs it, and a Redis URL nothing answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from devtools import forkserver
from devtools.processes import ROOT, free_port

SCRIPT = Path(sys.executable).parent / "dex-celery"


APP = "devtools.toolapp"


def run(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEX_")}
    environ["PYTHONPATH"] = str(ROOT)
    environ.update(env)
    if forkserver.usable(environ, cwd or ROOT, ROOT):
        return forkserver.run_function(
            "dex_celery.cli:main", str(SCRIPT), args, env=environ, cwd=cwd or ROOT, timeout=60
        )
    return subprocess.run(
        [str(SCRIPT), *args],
        env=environ,
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def dead_redis() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"
