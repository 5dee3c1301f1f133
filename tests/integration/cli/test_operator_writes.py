"""What the operator commands may write, and which services they need (S9.4;
docs/operations.md, "What each command writes, and needs").

`history prune --archive FILE` appends only to a new file or an archive an earlier prune wrote:
any other file (a README, another program's gzip file) is refused with one
`error:` line before anything is deleted, and stays byte for byte. No command but `db upgrade`
(and `dev`'s embedded default) creates a database: given a SQLite URL whose file is not there,
each one says so and leaves no file behind. SQL-only work (a dry-run prune, `db`, `calls`,
`mcp-servers list`) runs with Redis down. The real `dex-celery` script is run as a person runs
it, against a real SQLite file and a Redis port nothing answers.
"""

from __future__ import annotations

import gzip
import re
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from devtools.history_seed import seed_history
from devtools.processes import ROOT
from dex_celery.audit.keys import Signer
from dex_celery.store.archive import read_archive
from dex_celery.store.repository import Store
from dex_celery.store.schema import tool_calls
from tests.support.processes.cli_run import APP, dead_redis, one_error_line, run

OLD = time.time() - 40 * 86400


def migrated(tmp_path: Path, *, calls: int = 20) -> dict[str, str]:
    """The environment of a deployment whose database is migrated and holds `calls` old calls."""
    url = f"sqlite:///{tmp_path / 'dex.db'}"
    env = {"DEX_DATABASE_URL": url, "DEX_REDIS_URL": dead_redis()}
    result = run("-A", APP, "db", "upgrade", env=env)
    assert result.returncode == 0, result.stderr
    store = Store(url)
    seed_history(store.engine, count=calls, requested_at=OLD)
    store.engine.dispose()
    return env


def count_calls(env: dict[str, str]) -> int:
    store = Store(env["DEX_DATABASE_URL"])
    try:
        with store.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(tool_calls)).scalar_one())
    finally:
        store.engine.dispose()


def prune(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    result = run("-A", APP, "history", "prune", "--before", "30d", *args, env=env)
    return result.returncode, result.stdout, result.stderr


def test_prune_refuses_an_existing_file_that_is_no_archive(
    tmp_path: Path, redis_server: object
) -> None:
    """A copy of README.md given as the archive: refused, unchanged, nothing pruned."""
    from devtools.processes import RedisServer  # the session's redis-server, for the real prune

    assert isinstance(redis_server, RedisServer)
    env = {**migrated(tmp_path), "DEX_REDIS_URL": redis_server.url}
    readme = tmp_path / "README.md"
    readme.write_bytes((ROOT / "README.md").read_bytes())
    foreign_gzip = tmp_path / "logs.gz"
    foreign_gzip.write_bytes(gzip.compress(b"2026-12-01 worker started\nline two\n"))
    for path in (readme, foreign_gzip):
        before = path.read_bytes()
        result = run(
            "-A", APP, "history", "prune", "--before", "30d", "--archive", str(path), env=env
        )
        line = one_error_line(result)
        assert str(path) in line and "nothing was pruned" in line, line
        assert path.read_bytes() == before, f"{path} was changed"
        assert count_calls(env) == 20, "a refused prune deleted calls"

    # An archive an earlier prune wrote is appended to; both runs' calls are in it.
    archive = tmp_path / "history.jsonl.gz"
    code, out, err = prune(env, "--archive", str(archive))
    assert code == 0, err
    assert out.startswith("history prune: removed 20 calls"), out
    store = Store(env["DEX_DATABASE_URL"])
    seed_history(store.engine, count=5, requested_at=OLD, prefix="later")
    store.engine.dispose()
    code, out, err = prune(env, "--archive", str(archive))
    assert code == 0, err
    assert out.startswith("history prune: removed 5 calls"), out
    keys = [r["key"] for r in read_archive(archive) if r["kind"] == "call"]
    assert len(keys) == len(set(keys)) == 25

    # A prune that removes nothing makes no file.
    nothing = tmp_path / "nothing.jsonl.gz"
    code, out, err = prune(env, "--archive", str(nothing))
    assert code == 0 and out.startswith("history prune: removed 0 calls"), (out, err)
    assert not nothing.exists()


def test_dry_run_reads_sql_only(tmp_path: Path) -> None:
    """Redis down: the dry run counts; the real prune, which asks the ledger, refuses in one
    line and deletes nothing."""
    env = migrated(tmp_path)
    code, out, err = prune(env, "--dry-run")
    assert code == 0, err
    assert out.startswith("history prune: would remove 20 calls, 2 sessions"), out
    result = run("-A", APP, "history", "prune", "--before", "30d", env=env)
    assert "cannot use Redis" in one_error_line(result)
    assert count_calls(env) == 20
    assert not (tmp_path / "dex-celery-archive").exists(), "an archive without a batch"


@pytest.mark.parametrize(
    "args",
    [
        ["db", "current"],
        ["calls", "list"],
        ["calls", "show", "s/t/c"],
        ["sessions", "show", "s"],
        ["mcp-servers", "list"],
        ["history", "prune", "--before", "30d", "--dry-run"],
        ["audit", "verify"],
        ["audit", "export", "--since", "1d"],
    ],
    ids=" ".join,
)
def test_sql_only_commands_run_with_redis_down(tmp_path: Path, args: list[str]) -> None:
    # A signing key: `audit export` signs (docs/audit.md); nothing else reads it.
    env = {**migrated(tmp_path, calls=0), "DEX_AUDIT_KEY": Signer.generate().private_text()}
    result = run("-A", APP, *args, env=env)
    assert "cannot use Redis" not in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert result.returncode in (0, 1), result.stderr
    if result.returncode == 1:  # a call or session that is not there: said in one line
        assert re.search("no tool call|no session", one_error_line(result))


#: The command groups (their second word names the command).
GROUPS = {
    "calls",
    "sessions",
    "approvals",
    "history",
    "webhooks",
    "mcp-servers",
    "db",
    "writes",
    "budgets",
    "audit",
    "probe",
}
#: Every command that loads the app, as a person might run it against a mistyped URL.
EVERY_COMMAND = [
    ["calls", "list"],
    ["calls", "show", "s/t/c"],
    ["sessions", "show", "s"],
    ["approvals", "list"],
    ["approvals", "approve", "s/t/c", "--by", "ann"],
    ["approvals", "reject", "s/t/c", "--by", "ann"],
    ["sweep"],
    ["reconcile"],
    ["history", "prune", "--before", "30d"],
    ["history", "prune", "--before", "30d", "--dry-run"],
    ["audit", "verify"],
    ["audit", "export", "--since", "1d"],
    ["webhooks", "status"],
    ["mcp-servers", "list"],
    ["mcp-servers", "refresh"],
    ["mcp-servers", "accept", "srv", "--by", "ann"],
    ["db", "current"],
    ["db", "downgrade", "base"],
    ["db", "rebind-ledger"],
    ["web", "--port", "1"],
    ["mcp"],
    ["writes", "freeze", "--reason", "incident", "--by", "ann"],
    ["writes", "thaw", "--by", "ann"],
    ["writes", "status"],
    ["budgets", "show"],
    ["probe", "ready"],
    ["probe", "live", "--beat"],
]


#: The commands that may create the database, or report a missing one as part of their output.
MAY_CREATE_OR_REPORT = {"db upgrade", "dev", "demo", "status"}
#: The commands that never open the database: `audit keygen` writes a key file only
#: (`tests/integration/cli/test_audit_cli.py`).
NO_DATABASE = {"audit keygen"}


def test_every_command_is_covered() -> None:
    """A new subcommand joins `EVERY_COMMAND` (or says why it may create a database)."""
    import click  # the command tree itself, only this test walks it

    from dex_celery.cli.main import main

    def leaves(command: click.Command, path: tuple[str, ...] = ()) -> list[str]:
        if isinstance(command, click.Group):
            return [
                leaf
                for name, sub in command.commands.items()
                for leaf in leaves(sub, (*path, name))
            ]
        return [" ".join(path)]

    covered = {" ".join(args[:2]) if args[0] in GROUPS else args[0] for args in EVERY_COMMAND}
    assert set(leaves(main)) == covered | MAY_CREATE_OR_REPORT | NO_DATABASE


@pytest.mark.parametrize("args", EVERY_COMMAND, ids=" ".join)
def test_no_command_creates_a_database_that_is_not_there(tmp_path: Path, args: list[str]) -> None:
    """A mistyped SQLite URL: one `error:` line naming the missing file, and no file made."""
    missing = tmp_path / "typo" / "dex.db"
    missing.parent.mkdir()
    env = {"DEX_DATABASE_URL": f"sqlite:///{missing}", "DEX_REDIS_URL": dead_redis()}
    line = one_error_line(run("-A", APP, *args, env=env))
    assert "there is no database" in line and str(missing) in line, line
    assert list(missing.parent.iterdir()) == [], "a file was left behind"


def test_status_reports_a_missing_database_and_makes_none(tmp_path: Path) -> None:
    missing = tmp_path / "dex.db"
    env = {"DEX_DATABASE_URL": f"sqlite:///{missing}", "DEX_REDIS_URL": dead_redis()}
    result = run("-A", APP, "status", env=env)
    assert result.returncode == 1
    assert "there is no database" in result.stdout, result.stdout
    assert not missing.exists()


def test_db_upgrade_is_the_command_that_creates_it(tmp_path: Path) -> None:
    missing = tmp_path / "dex.db"
    env = {"DEX_DATABASE_URL": f"sqlite:///{missing}", "DEX_REDIS_URL": dead_redis()}
    result = run("-A", APP, "db", "upgrade", env=env)
    assert result.returncode == 0, result.stderr
    assert missing.exists()


def test_an_archive_cut_in_its_first_batch_is_still_recognised(tmp_path: Path) -> None:
    """A prune killed while writing its first batch leaves only a cut gzip member: it is the
    prune's own (its calls were not deleted yet), so the next prune appends after cutting it."""
    from dex_celery.store.archive import Archive, is_archive  # the writer itself

    whole = gzip.compress(b'{"key":"a/t/c","kind":"call"}\n' * 50, mtime=0)
    for cut in (whole[:10], whole[: len(whole) // 2]):
        path = tmp_path / f"cut-{len(cut)}.jsonl.gz"
        path.write_bytes(cut)
        assert is_archive(path)
        archive = Archive(path)
        archive.append([{"key": "b/t/c", "kind": "call"}])
        archive.close()
        assert [r["key"] for r in read_archive(path)] == ["b/t/c"]
    text = tmp_path / "notes.txt"
    text.write_text('{"key": "looks like a record but is not gzip"}\n')
    assert not is_archive(text)


def test_a_first_batch_that_cannot_be_written_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk refuses the first batch (full, read-only): `ArchiveError`, and the file this
    writer made is gone, so no empty or cut archive is left for a person to wonder about."""
    import os  # only this test makes fsync fail

    from dex_celery.errors import ArchiveError
    from dex_celery.store import archive as archive_module

    def refuse(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    path = tmp_path / "a.jsonl.gz"
    writer = archive_module.Archive(path)
    monkeypatch.setattr(archive_module.os, "fsync", refuse)
    with pytest.raises(ArchiveError, match="No space left"):
        writer.append([{"key": "a/t/c", "kind": "call"}])
    monkeypatch.setattr(archive_module.os, "fsync", os.fsync)
    writer.close()
    assert not path.exists()
