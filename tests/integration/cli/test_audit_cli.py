"""`dex-celery audit keygen | verify | export` and `history prune` with the audit log (S13.4.3-
S13.4.5, docs/audit.md): output and exit codes against a real redis-server and both SQLite and
the running PostgreSQL; the offline check of an export runs the installed script with no app,
no database and no Redis, as an auditor would.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import delete, select, update

from dex_celery import CallStatus, Dex
from dex_celery.audit.keys import Signer
from dex_celery.cli.main import EXIT_OK, EXIT_REFUSED, main
from dex_celery.model.ids import CallKey
from dex_celery.store.repository import Store
from dex_celery.store.schema import audit_log, tool_calls
from dex_celery.store.values import Outcome, OutcomeRow
from tests.support.apps import cliapp
from tests.support.processes.cli_run import run as run_script
from tests.support.stores.databases import ON_BOTH_DATABASES
from tests.support.stores.store_rig import Clock, new_call

pytestmark = [
    pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning"),
    ON_BOTH_DATABASES,
]

SIGNER = Signer.generate()


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "DEX_AUDIT_KEY": SIGNER.private_text()}


@pytest.fixture
def cli(dex: Dex, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`dex-celery --app tests.support.apps.cliapp:dex ARGS...` in-process."""
    monkeypatch.setattr(cliapp, "dex", dex)
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(main, ["--app", "tests.support.apps.cliapp:dex", *args])

    return run


def calls_an_hour_ago(dex: Dex, n: int = 3) -> list[str]:
    """Ended calls written through a store whose clock is an hour behind (a prune's subject)."""
    store = Store(dex.settings.database_url, clock=Clock(time.time() - 3600), signer=SIGNER)
    keys = [f"old/t/c{i}" for i in range(n)]
    store.insert_calls([new_call(k) for k in keys], epoch="e")
    store.record_outcomes(
        [
            OutcomeRow(
                CallKey.parse(k), "echo", '{"q":1}', Outcome(CallStatus.SUCCEEDED, "", '"ok"', 1)
            )
            for k in keys
        ]
    )
    store.engine.dispose()
    return keys


def recent_calls(dex: Dex) -> None:
    dex.store.insert_calls([new_call("new/t/a"), new_call("new/t/b")], epoch="e")
    dex.store.record_outcomes(
        [
            OutcomeRow(
                CallKey.parse("new/t/a"), "echo", "{}", Outcome(CallStatus.FAILED, "no", None, 1)
            )
        ]
    )


def error_lines(result: Result) -> list[str]:
    assert result.exit_code == EXIT_REFUSED, (result.exit_code, result.output)
    lines = result.stderr.splitlines()
    assert lines and all(line.startswith("error: ") for line in lines), result.stderr
    assert "Traceback" not in result.output
    return lines


def test_keygen_writes_a_private_file_and_never_overwrites(tmp_path: Path, cli: Any) -> None:
    out = tmp_path / "audit.key"
    made = cli("audit", "keygen", "--out", str(out))
    assert made.exit_code == EXIT_OK, made.output
    assert made.stdout.startswith("ed25519-public:")
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert Signer.parse(out.read_text()).public_text() == made.stdout.strip()
    again = cli("audit", "keygen", "--out", str(out))
    (line,) = error_lines(again)
    assert "never overwritten" in line


def test_verify_passes_then_names_each_kind_of_tampering(dex: Dex, cli: Any) -> None:
    """S13.4.3: exit 0 on an untouched log; exit 1 and one `error:` line per class of finding."""
    recent_calls(dex)
    ok = cli("audit", "verify")
    assert ok.exit_code == EXIT_OK and "no finding" in ok.stdout, ok.output
    with dex.store.engine.begin() as conn:
        conn.execute(
            update(tool_calls).where(tool_calls.c.key == "new/t/a").values(status="succeeded")
        )
        first = conn.execute(
            select(audit_log.c.writer, audit_log.c.seq).where(audit_log.c.call_key == "new/t/b")
        ).first()
        conn.execute(
            delete(audit_log)
            .where(audit_log.c.writer == first.writer)
            .where(audit_log.c.seq == first.seq)
        )
    lines = error_lines(cli("audit", "verify"))
    assert len(lines) == 2, lines
    assert any("entry deleted" in line and f"{first.writer}#{first.seq}" in line for line in lines)
    # The updated record, and the call whose only entry went: one line, two findings.
    assert any("record disagrees" in line and "(and 1 more)" in line for line in lines), lines
    as_json = cli("audit", "verify", "--json")
    assert as_json.exit_code == EXIT_REFUSED
    findings = json.loads(as_json.stdout)["findings"]
    assert findings["record disagrees with the chain"]["count"] == 2, findings


def test_an_export_verifies_offline_with_the_public_key_alone(
    dex: Dex, cli: Any, tmp_path: Path
) -> None:
    """S13.4.4: no app, no database, no Redis: the script and the public key."""
    recent_calls(dex)
    exported = cli("audit", "export", "--session", "new")
    assert exported.exit_code == EXIT_OK, exported.output
    path = tmp_path / "new.jsonl"
    path.write_text(exported.stdout)
    public = tmp_path / "audit.pub"
    public.write_text(SIGNER.public_text())
    offline = run_script(
        "audit", "verify", "--file", str(path), "--public-key", str(public), env={}
    )
    assert offline.returncode == 0 and "no finding" in offline.stdout, offline
    data = path.read_bytes()
    at = data.index(b"new/t/b")
    path.write_bytes(data[:at] + b"new/t/c" + data[at + 7 :])
    changed = run_script(
        "audit", "verify", "--file", str(path), "--public-key", SIGNER.public_text(), env={}
    )
    assert changed.returncode == 1 and "changed after it was sealed" in changed.stderr, changed


def test_prune_then_verify_passes_and_the_archive_verifies_alone(
    dex: Dex, cli: Any, tmp_path: Path
) -> None:
    """S13.4.5: the history pruned, the log cut at a signed checkpoint."""
    old = calls_an_hour_ago(dex)
    recent_calls(dex)
    archive = tmp_path / "history.jsonl.gz"
    pruned = cli("history", "prune", "--before", "30m", "--archive", str(archive), "--json")
    assert pruned.exit_code == EXIT_OK, pruned.output
    report = json.loads(pruned.stdout)
    assert report["calls"] == len(old) and report["audit_entries"] > 0, report
    verified = cli("audit", "verify")
    assert verified.exit_code == EXIT_OK, verified.output
    audit_archive = Path(report["audit_archive"])
    assert audit_archive.parent == tmp_path
    alone = run_script(
        "audit",
        "verify",
        "--file",
        str(audit_archive),
        "--public-key",
        SIGNER.public_text(),
        env={},
    )
    assert alone.returncode == 0, alone
    with dex.store.engine.connect() as conn:
        left = {r[0] for r in conn.execute(select(audit_log.c.call_key)) if r[0]}
    assert not left & set(old), "the pruned calls' entries went to the archive"


def test_verify_file_needs_a_public_key_and_refuses_what_is_no_export(
    tmp_path: Path, cli: Any
) -> None:
    (line,) = error_lines(cli("audit", "verify", "--file", str(tmp_path / "x.jsonl")))
    assert "--public-key" in line
    bogus = tmp_path / "bogus.jsonl"
    bogus.write_text('{"hello": 1}\n')
    (line,) = error_lines(
        cli("audit", "verify", "--file", str(bogus), "--public-key", SIGNER.public_text())
    )
    assert "not an audit export" in line
