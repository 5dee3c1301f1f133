"""The built wheel installed into a fresh virtualenv outside the repository, as a user gets it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from devtools.processes import ROOT


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEX_", "PYTHON", "VIRTUAL"))}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv (outside the repository) with the wheel and its dependencies."""
    base = tmp_path_factory.mktemp("wheel")
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base), str(ROOT)], base
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = base.glob("dex_celery-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"dex_celery"}
    venv = base / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], base)
    assert made.returncode == 0, made.stderr
    # Dependencies come from pip's cache (and the machine's find-links), so this is quick.
    pip = _run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], base)
    assert pip.returncode == 0, pip.stderr[-3000:]
    return venv
