"""The README's "Testing your own tools under faults" example, run as written, as a user would.

Its files are written into a fresh project outside the repository (its own app module with a
non-idempotent write tool, a conftest enabling the plugin, pytest.ini naming the app, the test
file) and its `pytest` command is run there in a separate pytest process: once with this
checkout's environment, once in a fresh virtualenv that has only the built wheel (and pytest)
installed. Each of its tests starts a real prefork worker and beat, SIGKILLs the worker at a
named point of an attempt (or rolls Redis back, or cuts the worker's link), and checks the
record against the tool's own effect count; the example passes only if every one does. Only the
schedule-to-start deadline is set (8 s, not the kit's 15 s; `TIMING`): two of its tests wait for it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy

from devtools.processes import ROOT
from tests.support.processes.built_wheel import installed  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.crash, pytest.mark.timeout(1500)]

BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)
HEADING = "\n## Testing your own tools under faults"
#: The example's tests: five kill points, a pool process killed alone, the rollback, the cut link.
EXPECTED = 8
#: The one timing set for the example (the kit lets a variable already set win): the kill before
#: the claim and the rollback both end at the call's schedule-to-start deadline, the kit's 15 s.
#: 8 s still leaves an idle, ready worker ample time to take each call on a loaded machine.
TIMING = {"DEX_SCHEDULE_TO_START": "8"}


def example() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    start = text.index(HEADING)
    end = text.index("\n## ", start + 1)
    return BLOCK.findall(text[start:end])


def write_project(folder: Path) -> list[list[str]]:
    """The example's files in `folder`; returns its shell commands."""
    commands: list[list[str]] = []
    for language, body in example():
        if language == "sh":
            commands += [shlex.split(line) for line in body.splitlines() if line.strip()]
            continue
        first = body.splitlines()[0]
        assert first.startswith("# "), first
        path = folder / first[2:].strip()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    assert (folder / "conftest.py").exists() and (folder / "pytest.ini").exists()
    return commands


def _env(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEX_", "PYTHON", "VIRTUAL"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_example(
    project: Path,
    bin_dir: Path,
    *,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    expected: int = EXPECTED,
) -> str:
    (command,) = write_project(project)
    assert command[0] == "pytest", command
    done = subprocess.run(
        [str(bin_dir / "python"), "-m", *command, "-p", "no:cacheprovider", "-rA", *extra],
        cwd=project, env={**_env(bin_dir), **TIMING, **(env or {})}, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert f"{expected} passed" in done.stdout, done.stdout[-3000:]
    return done.stdout


def test_the_example_has_each_fault() -> None:
    text = "".join(body for _, body in example())
    for fault in ("kill_at", "roll_back_redis", "cut_redis_link", "effects.record"):
        assert fault in text, fault
    assert 'pytest_plugins = ["dex_celery.testing"]' in text


def test_the_example_passes_in_a_project_outside_the_repository(tmp_path: Path) -> None:
    project = tmp_path / "payments-project"
    project.mkdir()
    assert not project.resolve().is_relative_to(ROOT)
    run_example(project, Path(sys.executable).parent)


def test_the_example_passes_with_the_threads_pool(tmp_path: Path) -> None:
    """`dex_pool` chooses the worker's pool: the same kills land in a threads worker."""
    project = tmp_path / "payments-project"
    project.mkdir()
    chosen = ("-o", "dex_pool=threads", "-k", "in_tool or after_tool")
    out = run_example(project, Path(sys.executable).parent, extra=chosen, expected=2)
    assert "in_tool" in out and "after_tool" in out


@pytest.mark.postgres
def test_the_example_passes_on_postgresql(tmp_path: Path) -> None:
    """`DEX_TESTING_DATABASE_URL`: the kit works in a schema of its own there, dropped after."""
    url = os.environ["DEX_TEST_POSTGRES_URL"]
    project = tmp_path / "payments-project"
    project.mkdir()
    chosen = ("-k", "before_record or in_tool")
    run_example(
        project,
        Path(sys.executable).parent,
        extra=chosen,
        env={"DEX_TESTING_DATABASE_URL": url},
        expected=2,
    )
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as conn:
        left = conn.execute(
            sqlalchemy.text("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'dex_kit_%'")
        ).all()
    engine.dispose()
    assert left == []


def test_the_example_passes_with_the_installed_wheel(
    installed: Path,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    pip = subprocess.run(
        [str(installed / "bin" / "pip"), "install", "-q", "pytest>=8.0"],
        cwd=tmp_path, env=_env(installed / "bin"), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr[-3000:]
    project = tmp_path / "payments-project"
    project.mkdir()
    run_example(project, installed / "bin")
    found = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "import dex_celery; print(dex_celery.__file__)"],
        cwd=project, env=_env(installed / "bin"), capture_output=True, text=True,
    )  # fmt: skip
    assert str(installed) in found.stdout, found  # the wheel's copy, not this checkout
    # Enabled explicitly only: the wheel registers no pytest11 entry point that would load the
    # kit (and repoint DEX_* settings) in every pytest run of every project.
    (dist_info,) = (installed / "lib").glob("python3*/site-packages/dex_celery-*.dist-info")
    points = dist_info / "entry_points.txt"
    assert "pytest11" not in (points.read_text() if points.exists() else "")
