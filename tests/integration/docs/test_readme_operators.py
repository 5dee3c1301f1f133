"""The README's operator commands: every one names its app, and each runs as written.

A user copies `dex-celery web --host ...` from the README and gets `error: no app given` (issue
24): there is no default app (README, "The `dex-celery` command"). So every `dex-celery`
command the README shows, in a shell block, a table or a sentence, carries `-A`/`--app`, except
the few that take no app (`db`, `demo`, `--version`); so does every one in docs/*.md. Then the README's operator commands are
run against a real local stack of the README's own recipe (`shop`): a private redis-server, a
fresh PostgreSQL database, a prefork worker, the recipe's call; `web` is started in the
background and must answer a signed-in request for that call.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from devtools.processes import ROOT, RedisServer, free_port, wait_for
from tests.support.docs.readme import reader_env, recipe
from tests.support.stores.pg_database import fresh_database

BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
#: Subcommands (or options) that need no app.
NO_APP = {"db", "demo", "--version", "--help"}
#: A command line: optional `NAME=value` assignments, then the program.
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*dex-celery(?:\s|$)")
#: The sections whose shell blocks are the operators' commands, run by this test.
OPERATOR_SECTIONS = ("\n## Operators",)


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def readme_commands(text: str) -> list[str]:
    """Every `dex-celery ...` command line in shell blocks, tables and sentences."""
    found: list[str] = []
    for language, body in BLOCK.findall(text):
        if language not in ("sh", "bash", "console"):
            continue
        for line in body.splitlines():
            line = line.split("  #")[0].strip().removeprefix("$ ")
            if COMMAND.match(line):
                found.append(line)
    prose = BLOCK.sub("", text)
    found += [span for span in INLINE.findall(prose) if COMMAND.match(span)]
    return found


def names_its_app(command: str) -> bool:
    words = shlex.split(command.replace("\\|", "|"))
    words = words[words.index("dex-celery") + 1 :]
    if not words:  # the program's name alone
        return True
    if words[0] in NO_APP:
        return True
    if words[:2] == ["audit", "verify"] and "--file" in words:
        return True  # an export checked offline, with the public key alone (docs/audit.md)
    return any(w in ("-A", "--app") or w.startswith("--app=") for w in words)


def test_the_check_catches_a_command_without_its_app() -> None:
    text = "Run `DEX_WEB_USERS=alice:x dex-celery web --host 127.0.0.1 --port 8767`.\n"
    (command,) = readme_commands(text)
    assert not names_its_app(command)
    assert names_its_app("dex-celery -A shop web --port 8000")
    assert names_its_app("dex-celery audit verify --file x.jsonl --public-key KEY")
    assert not names_its_app("dex-celery audit verify --since 1d")
    assert names_its_app("dex-celery db upgrade")


def test_every_readme_command_names_its_app() -> None:
    commands = readme_commands(_readme())
    assert len(commands) > 10, commands
    missing = [c for c in commands if not names_its_app(c)]
    assert not missing, f"README commands without -A/--app: {missing}"


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_every_docs_command_names_its_app(page: Path) -> None:
    """The same for the pages under docs/: a reader copies from them too."""
    missing = [c for c in readme_commands(page.read_text()) if not names_its_app(c)]
    assert not missing, f"{page.name}: commands without -A/--app: {missing}"


def operator_blocks() -> list[str]:
    text = _readme()
    lines: list[str] = []
    for heading in OPERATOR_SECTIONS:
        start = text.index(heading)
        end = text.index("\n## ", start + 1)
        for language, body in BLOCK.findall(text[start:end]):
            if language == "sh":
                lines += [ln.split("  #")[0].strip() for ln in body.splitlines()]
    return [ln for ln in lines if ln]


def _exported(line: str, env: dict[str, str]) -> dict[str, str]:
    """What a README `export` line sets, as a shell evaluates it (`$(openssl ...)` included)."""
    out = subprocess.run(
        ["bash", "-c", f"{line}\nenv -0"], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, (line, out.stderr)
    pairs = (item.partition("=") for item in out.stdout.split("\0") if item)
    return {name: value for name, _, value in pairs if env.get(name) != value}


@pytest.mark.postgres
def test_the_readme_operator_commands_run(redis_server: RedisServer, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for language, body in recipe():
        if language == "python":
            path = project / body.splitlines()[0][2:].strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
    env = reader_env(
        DEX_REDIS_URL=redis_server.url,
        DEX_SECRET_KEY="readme-operators-test-secret",
    )
    background: list[subprocess.Popen[bytes]] = []

    def run(words: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            words, cwd=project, env=env, capture_output=True, text=True, timeout=timeout
        )

    def spawn(words: list[str], name: str) -> subprocess.Popen[bytes]:
        with (tmp_path / f"{name}.log").open("wb") as log:
            started = subprocess.Popen(
                words, cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        background.append(started)
        return started

    with fresh_database("dex_readme_ops") as database:
        env["DEX_DATABASE_URL"] = database
        try:
            assert run(["dex-celery", "db", "upgrade"]).returncode == 0
            spawn(["celery", "-A", "shop", "worker", "-P", "prefork", "-c", "1"], "worker")
            asked = run([sys.executable, "request.py"])
            assert asked.returncode == 0 and asked.stdout.startswith("succeeded "), asked
            key = "session-1/turn-1/call-1"
            commands = operator_blocks()
            assert any(" web " in f" {c} " for c in commands), commands
            ran: list[str] = []
            for command in commands:
                words = shlex.split(command)
                if words[0] == "pip":
                    continue
                if words[0] == "export":
                    env.update(_exported(command, env))
                    continue
                assert words[0] == "dex-celery", command
                if "web" in words:
                    # The test's own free port, on loopback; the rest exactly as written.
                    port = free_port()
                    words[words.index("--port") + 1] = str(port)
                    words[words.index("--host") + 1] = "127.0.0.1"
                    web = spawn(words, "web")
                    _check_web(web, port, env, key, tmp_path / "web.log")
                    ran.append("web")
                    continue
                done = run(words)
                assert done.returncode == 0, (command, done.stdout, done.stderr)
                assert "Traceback" not in done.stderr, (command, done.stderr)
                if "calls" in words:  # `calls list` and `calls show` find the recipe's call
                    assert key in done.stdout, (command, done.stdout)
                ran.append(command)
            assert {"web"} <= set(ran) and any("status" in c for c in ran), ran
            assert any("calls list" in c for c in ran) and any("approvals list" in c for c in ran)
        finally:
            for process in background:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def _check_web(
    web: subprocess.Popen[bytes], port: int, env: dict[str, str], key: str, log: Path
) -> None:
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if web.poll() is not None:
            raise AssertionError(f"the web app exited:\n{log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(answers, timeout=60, what="the README's web command to answer")
    name, _, password = env["DEX_WEB_USERS"].split(",")[0].partition(":")
    with httpx.Client(base_url=base, timeout=10) as client:
        signed_in = client.post("/login", data={"name": name, "password": password, "next": "/"})
        assert signed_in.status_code in (200, 303), signed_in.text[:500]
        page = client.get("/calls")
        assert page.status_code == 200 and key in page.text, page.text[:500]
