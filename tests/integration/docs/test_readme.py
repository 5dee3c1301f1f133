"""The README's "Writing a tool" recipe, executed as written.

Its Python blocks are written to the files their first line names, its shell commands are run in
order from that folder (`celery ...` ones in the background, as a second and third terminal),
with only the Redis and database URLs replaced by the test's own. The recipe works if the call
it requests ends `succeeded`, and `dex-celery status` then shows the worker and a recent sweep
(the beat schedule the recipe sets up). So the recipe cannot rot.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from devtools.processes import ROOT, RedisServer, wait_for
from tests.support.docs.readme import reader_env, recipe
from tests.support.stores.pg_database import fresh_database

pytestmark = pytest.mark.postgres

#: The only values the test replaces: where Redis and the database are.
OWN = ("DEX_REDIS_URL", "DEX_DATABASE_URL")


def test_the_readme_recipe_runs(redis_server: RedisServer, tmp_path: Path) -> None:
    blocks = recipe()
    project = tmp_path / "project"
    project.mkdir()
    for language, body in blocks:
        if language == "python":
            first = body.splitlines()[0]
            assert first.startswith("# ") and first.endswith(".py"), first
            path = project / first[2:].strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
    assert (project / "shop" / "celery.py").exists() and (project / "request.py").exists()

    bin_dir = Path(sys.executable).parent
    env = reader_env()
    background: list[subprocess.Popen[bytes]] = []
    outputs: list[str] = []
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    with fresh_database("dex_readme") as database:
        own = {"DEX_REDIS_URL": redis_server.url, "DEX_DATABASE_URL": database}
        try:
            for language, body in blocks:
                if language != "sh":
                    continue
                for line in body.splitlines():
                    command = line.split("  #")[0].strip()
                    if not command:
                        continue
                    words = shlex.split(command)
                    if words[:2] == ["pip", "install"]:
                        named = re.findall(r"\[([^\]]+)\]", command)
                        assert named and set(named[0].split(",")) <= extras, command
                        continue
                    if words[0] == "export":
                        name, _, value = words[1].partition("=")
                        env[name] = own.get(name, value)
                        continue
                    if words[0] == "python":
                        words[0] = sys.executable
                    if words[0] == "celery":
                        log = (tmp_path / f"{words[3]}.log").open("wb")
                        started = subprocess.Popen(
                            words, cwd=project, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                        )  # fmt: skip
                        background.append(started)
                        continue
                    done = subprocess.run(
                        words, cwd=project, env=env, capture_output=True, text=True, timeout=120
                    )
                    assert done.returncode == 0, (command, done.stdout, done.stderr)
                    outputs.append(done.stdout)
            assert set(OWN) <= set(env), "the recipe exports the Redis and database URLs"
            assert outputs[-1].startswith("succeeded "), outputs[-1]
            assert '"noted": true' in outputs[-1]

            def healthy() -> bool:
                status = subprocess.run(
                    [str(bin_dir / "dex-celery"), "-A", "shop", "status", "--json"],
                    cwd=project, env=env, capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                sections = json.loads(status.stdout)["sections"]
                return bool(
                    sections["workers"]["nodes"]
                    and sections["last_sweep"]["state"] == "ok"
                    and sections["database"]["schema"] == env["DEX_DATABASE_SCHEMA"]
                )

            wait_for(healthy, timeout=60, what="status: a worker and a recent sweep", interval=1)
        finally:
            for process in background:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
