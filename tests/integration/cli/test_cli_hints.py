"""Every command a `dex-celery` command prints as a hint runs when pasted.

The hints name the app as the person named it with `-A` (however they spelled it), so the
pasted line finds the same deployment: the pagination hint of `calls list` (with the filters
given), `status`'s hints for a database without the schema and for a deployment that never
swept, and the `db upgrade` hint of an error line. Each is cut out of the real output and run,
as printed, in a subprocess.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from devtools.processes import ROOT, wait_for
from devtools.toolapp import make_app
from dex_celery import Dex, Settings

SCRIPT = Path(sys.executable).parent / "dex-celery"
APP = "devtools.toolapp"
_QUOTED = re.compile(r"`((?:dex-celery|celery) -A [^`]+)`")


def _environ(env: dict[str, str]) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEX_")}
    environ["PYTHONPATH"] = str(ROOT)
    environ.update(env)
    return environ


def run_line(
    line: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`line` as a shell would run it (`dex-celery` is this environment's script)."""
    words = shlex.split(line)
    assert words[0] == "dex-celery", line
    return subprocess.run(
        [str(SCRIPT), *words[1:]],
        env=_environ(env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_next_page_hint_of_calls_list_runs_as_printed(dex: Dex, env: dict[str, str]) -> None:
    client = dex.client()
    keys = [client.request_call("s1", "t1", f"c{i}", "echo", {"x": i}).key for i in range(3)]
    client.request_call("s2", "t1", "other", "echo", {"x": 9})  # another session: filtered out
    first = run_line(f"dex-celery -A {APP} calls list --session s1 --limit 2", env)
    assert first.returncode == 0, first.stderr
    (hint,) = [ln for ln in first.stdout.splitlines() if ln.startswith("older calls: ")]
    command = hint.removeprefix("older calls: ")
    assert f"-A {APP}" in command and "--session s1" in command and "--limit 2" in command
    second = run_line(command, env)
    assert second.returncode == 0, second.stderr
    assert keys[0] in second.stdout and keys[2] not in second.stdout
    assert "other" not in second.stdout and "older calls" not in second.stdout


def test_the_status_hints_run_as_printed(env: dict[str, str], tmp_path: Path) -> None:
    environ = {**env, "DEX_DATABASE_URL": f"sqlite:///{tmp_path / 'fresh.db'}"}
    make_app(Settings.from_env(environ))[1].store.engine.connect().close()  # exists, no schema

    before = run_line(f"dex-celery -A {APP} status", environ)
    assert before.returncode == 1, before.stdout
    (upgrade,) = {c for c in _QUOTED.findall(before.stdout) if " db upgrade" in c}
    assert upgrade == f"dex-celery -A {APP} db upgrade"
    assert run_line(upgrade, environ).returncode == 0

    never_swept = run_line(f"dex-celery -A {APP} status", environ)
    hints = _QUOTED.findall(never_swept.stdout)
    assert f"celery -A {APP} beat" in hints, never_swept.stdout
    (sweep,) = [c for c in hints if c.startswith("dex-celery") and "sweep" in c]
    assert sweep == f"dex-celery -A {APP} sweep --loop"
    looping = subprocess.Popen(
        [str(SCRIPT), *shlex.split(sweep)[1:]],
        env=_environ(environ),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def swept() -> bool:
            out = run_line(f"dex-celery -A {APP} status", environ).stdout
            return "no sweep has ever run" not in out and "last_sweep" in out

        wait_for(swept, timeout=30, what="the pasted sweep loop to sweep")
    finally:
        looping.terminate()
        looping.wait(timeout=30)


def test_an_error_lines_hint_names_the_app(env: dict[str, str], tmp_path: Path) -> None:
    environ = {**env, "DEX_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}"}
    make_app(Settings.from_env(environ))[1].store.engine.connect().close()
    failed = run_line(f"dex-celery --app={APP} calls list", environ)
    assert failed.returncode == 1
    (hint,) = _QUOTED.findall(failed.stderr)
    assert hint == f"dex-celery -A {APP} db upgrade"
    assert run_line(hint, environ).returncode == 0
    assert run_line(f"dex-celery -A {APP} calls list", environ).returncode == 0


def test_the_full_hint_of_calls_show_runs_as_printed(dex: Dex, env: dict[str, str]) -> None:
    key = dex.client().request_call("s1", "t1", "long", "echo", {"x": "y" * 5000}).key
    shown = run_line(f"dex-celery -A {APP} calls show {key}", env)
    assert shown.returncode == 0, shown.stderr
    (whole,) = _QUOTED.findall(shown.stdout)
    assert whole == f"dex-celery -A {APP} calls show {key} --full"
    pasted = run_line(whole, env)
    assert pasted.returncode == 0, pasted.stderr
    assert "y" * 5000 in pasted.stdout and "long values are cut" not in pasted.stdout
