"""Bounded history (S12.4; docs/operations.md, "Retention"), on SQLite and PostgreSQL.

Every kind of old call that may still matter stays (open, waiting for approval, the earlier call
of one waiting, an unreconciled unknown outcome, a repeat-guard holder inside its window or
still running) beside old calls that go; the archive holds exactly what was removed, each call
whole with its attempts and TOOL message; sessions go only when nothing of them is left; the
counts behind /metrics equal a grouped scan afterwards; a second prune finds nothing.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select

from devtools.history_seed import call_row, write_calls
from devtools.processes import ROOT
from dex_celery import Dex
from dex_celery.engine.upkeep.retention import prune
from dex_celery.model.policy import EffectClass, ToolPolicy, resolve_policy
from dex_celery.settings import Settings
from dex_celery.store.archive import Archive, read_archive, whole_length
from dex_celery.store.repository import Store
from dex_celery.store.schema import (
    messages,
    repeat_guards,
    session_owners,
    sessions,
    tool_calls,
    unknown_outcomes,
)
from dex_celery.store.views import OperatorViews
from tests.support.stores.store_rig import Clock
from tests.support.stores.store_rig import url as url

NOW = 1_000_000.0
CUTOFF = NOW - 10_000.0
OLD = CUTOFF - 5_000.0

#: Calls that must stay, and the reason the prune reports for each.
STAYS = {
    "open/t/pending": "open",
    "wait/t/approval": "open",
    "unk/t/never-surfaced": "unreconciled",
    "unk/t/surfaced-open": "unreconciled",
    "rep/t1/earlier": "approval_waiting",
    "guard/t/in-window": "repeat_guard",
    "guard/t/still-running": "repeat_guard",
    "mix/t/late": "recent",
}
GOES = {
    "gone/t/a",
    "gone/t/b",
    "mix/t/old",
    "unk/t/reported",
    "guard/t/past-window",
}


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    store = Store(url, clock=Clock(NOW))
    store.create_schema()
    yield store
    store.engine.dispose()


def guarded_policy(window: float) -> str:
    policy = ToolPolicy(
        effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False, repeat_window=window
    )
    return resolve_policy(policy, None, None, Settings()).to_json()


def make_history(store: Store) -> None:
    old = {"requested_at": OLD}
    rows = [
        call_row("gone/t/a", status="succeeded", **old),
        call_row("gone/t/b", status="failed", **old),
        call_row("mix/t/old", status="rejected", **old),
        call_row("mix/t/late", status="succeeded", requested_at=OLD, finished_at=CUTOFF + 1),
        call_row("mix/t/new", status="succeeded", requested_at=NOW - 5),
        call_row("open/t/pending", status="pending", finished_at=None, **old),
        call_row("wait/t/approval", status="awaiting_approval", finished_at=None, **old),
        call_row("unk/t/never-surfaced", status="outcome_unknown", **old),
        call_row("unk/t/surfaced-open", status="outcome_unknown", **old),
        call_row("unk/t/reported", status="outcome_unknown", **old),
        call_row("rep/t1/earlier", status="failed", **old),
        call_row(
            "rep/t2/later",
            status="awaiting_approval",
            finished_at=None,
            requested_at=NOW - 5,
            repeat_of="rep/t1/earlier",
            repeat_reason="an identical call rep/t1/earlier may still be running",
        ),
    ]
    # Repeat-guard holders, each of a session of its own slot; the guard judges the holder with
    # its rule: a success inside the window holds new calls back, one past it does not, and a
    # failed call without a late result does while its fenced attempt runs.
    rows += [
        call_row(
            "guard/t/in-window",
            status="succeeded",
            requested_at=OLD,
            finished_at=OLD + 1,
            policy=guarded_policy(NOW),  # a window longer than the history
            repeat_digest="d1",
        ),
        call_row(
            "guard/t/past-window",
            status="succeeded",
            policy=guarded_policy(60.0),
            repeat_digest="d2",
            **old,
        ),
        call_row(
            "guard/t/still-running",
            status="failed",
            policy=guarded_policy(0.0),
            repeat_digest="d3",
            **old,
        ),
    ]
    write_calls(store.engine, rows)
    with store.engine.begin() as conn:
        conn.execute(
            insert(messages).values(session_id="mix", role="user", text="later", created_at=NOW)
        )
        conn.execute(insert(session_owners).values(session_id="gone", owner="ann", created_at=OLD))
        for key, state in (("unk/t/surfaced-open", "open"), ("unk/t/reported", "reported")):
            conn.execute(
                insert(unknown_outcomes).values(
                    call_key=key,
                    session_id="unk",
                    tool_name="echo",
                    state=state,
                    surfaced_at=OLD + 2,
                    checks=1,
                    report="it did" if state == "reported" else None,
                )
            )
        for digest, key in (
            ("d1", "guard/t/in-window"),
            ("d2", "guard/t/past-window"),
            ("d3", "guard/t/still-running"),
        ):
            conn.execute(
                insert(repeat_guards).values(session_id="guard", digest=digest, holder=key)
            )


def table(store: Store, t: Any) -> list[dict[str, Any]]:
    with store.engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(t)).mappings()]


def counts_equal_scan(store: Store) -> None:
    views = OperatorViews(store)

    def key(c: Any) -> tuple[str, str, str]:
        return (c.tool, c.effect, c.status)

    assert sorted(views.count_by_outcome(), key=key) == sorted(
        views.count_by_outcome_scan(), key=key
    )
    assert views.count_unreported_unknowns() == views.count_unreported_unknowns_scan() == 2


def still_running(key: str) -> bool:
    return key == "guard/t/still-running"


def run(store: Store, archive: Path | None, *, dry_run: bool = False, batch: int = 3) -> Any:
    return prune(
        store,
        cutoff=CUTOFF,
        now=NOW,
        archive=archive,
        batch=batch,
        still_running=still_running,
        dry_run=dry_run,
    )


def test_prune_removes_only_what_can_never_matter_again(store: Store, tmp_path: Path) -> None:
    make_history(store)
    before_calls = {r["key"]: r for r in table(store, tool_calls)}
    before_messages = table(store, messages)
    archive = tmp_path / "archive" / "history.jsonl.gz"

    dry = run(store, archive, dry_run=True)
    assert not archive.exists(), "a dry run writes nothing"
    assert {r["key"] for r in table(store, tool_calls)} == set(before_calls)

    report = run(store, archive)
    assert (dry.calls, dry.sessions, dry.messages) == (report.calls, report.sessions, 5 + 1)
    assert report.calls == len(GOES)
    left = {r["key"] for r in table(store, tool_calls)}
    assert left == set(STAYS) | {"mix/t/new", "rep/t2/later"}
    expected_kept: dict[str, int] = {}
    for reason in STAYS.values():
        expected_kept[reason] = expected_kept.get(reason, 0) + 1
    assert report.kept == expected_kept

    # The archive holds exactly the removed calls, whole and as stored, and the one session
    # that went with all of its messages.
    records = list(read_archive(archive))
    calls = {r["key"]: r for r in records if r["kind"] == "call"}
    assert set(calls) == GOES
    for key, record in calls.items():
        assert record["call"] == before_calls[key]
        assert record["attempts"] == json.loads(before_calls[key]["attempt_log"])
        assert [m["call_key"] for m in record["messages"]] == [key]
    assert calls["unk/t/reported"]["unknown_outcome"]["report"] == "it did"
    removed_sessions = {r["key"]: r for r in records if r["kind"] == "session"}
    assert set(removed_sessions) == {"gone"}
    assert removed_sessions["gone"]["owner"]["owner"] == "ann"
    assert [m["text"] for m in removed_sessions["gone"]["messages"]] == ["hello"]
    assert report.sessions == 1
    assert report.messages == len(GOES) + 1  # five TOOL messages, the removed session's user one

    # Nothing removed is left anywhere; nothing kept lost a row.
    remaining = table(store, messages)
    removed_ids = {m["id"] for r in records for m in r["messages"]}
    assert sorted(
        (m for m in before_messages if m["id"] not in removed_ids), key=lambda m: m["id"]
    ) == sorted(remaining, key=lambda m: m["id"])
    assert {s["id"] for s in table(store, sessions)} == {
        "mix",
        "open",
        "wait",
        "unk",
        "rep",
        "guard",
    }
    mix = [
        (m["role"], m["call_key"])
        for m in sorted(remaining, key=lambda m: m["id"])
        if m["session_id"] == "mix"
    ]
    assert mix == [("user", None), ("tool", "mix/t/late"), ("tool", "mix/t/new"), ("user", None)]
    assert {u["call_key"] for u in table(store, unknown_outcomes)} == {"unk/t/surfaced-open"}
    assert {g["holder"] for g in table(store, repeat_guards)} == {
        "guard/t/in-window",
        "guard/t/still-running",
    }
    assert table(store, session_owners) == []
    counts_equal_scan(store)

    # A second run finds nothing more and leaves the archive as it was.
    size = archive.stat().st_size
    again = run(store, archive)
    assert (again.calls, again.sessions, again.messages) == (0, 0, 0)
    assert archive.stat().st_size == size


def test_counts_equal_a_grouped_scan_after_a_prune_of_many_batches(
    store: Store, tmp_path: Path
) -> None:
    """A prune of more batches than one, over calls of several statuses and sessions."""
    from devtools.history_seed import seed_history  # the bulk writer, only this test needs it

    seed_history(store.engine, count=250, requested_at=OLD, per_session=10)
    make_history(store)
    report = run(store, tmp_path / "a.jsonl.gz", batch=40)
    assert report.calls == 250 + len(GOES)
    assert report.sessions == 25 + 1
    counts_equal_scan(store)
    keys = [r["key"] for r in read_archive(tmp_path / "a.jsonl.gz") if r["kind"] == "call"]
    assert len(keys) == len(set(keys)) == report.calls


def test_archive_cut_by_a_crash_is_trimmed_to_its_whole_batches(tmp_path: Path) -> None:
    """A prune killed while writing a batch leaves a cut gzip member (its calls were not
    deleted): the next prune cuts it off before appending, so the archive reads whole."""
    path = tmp_path / "a.jsonl.gz"
    archive = Archive(path)
    archive.append([{"key": "a"}, {"key": "b"}])
    archive.close()
    whole = path.stat().st_size
    with path.open("ab") as f:
        f.write(b"\x1f\x8b\x08\x00partial member")
    assert whole_length(path) == whole
    archive = Archive(path)
    archive.append([{"key": "c"}])
    archive.close()
    assert [r["key"] for r in read_archive(path)] == ["a", "b", "c"]


def test_cli_bad_before_is_one_error_line(tmp_path: Path) -> None:
    """`--before banana`: one `error:` line, exit 1, before any connection is made."""
    from dex_celery.cli.main import main  # the CLI, only this test drives it

    result = CliRunner().invoke(
        main,
        ["-A", "tests.support.apps.cliapp:dex", "history", "prune", "--before", "banana"],
    )
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == [
        "error: --before 'banana' is neither a duration (30s, 15m, 2h, 1d) nor an ISO 8601 "
        "time (2026-11-30 or 2026-11-30T22:00, UTC unless a zone is given)"
    ]
    assert result.stdout == ""


def documented_commands() -> list[str]:
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page.split("## Retention", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("dex-celery -A APP ")]


def test_the_documented_commands_run(
    dex: Dex, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """docs/operations.md's prune commands, as written (the app and archive path swapped for
    the test's): the dry run counts and changes nothing; the prune removes and archives."""
    import tests.support.apps.cliapp as cliapp
    from dex_celery.cli.main import main  # the CLI, only these tests drive it

    monkeypatch.setattr(cliapp, "dex", dex)
    from devtools.history_seed import seed_history  # the bulk writer

    seed_history(dex.store.engine, count=20, requested_at=dex.ledger.now() - 40 * 86400)
    dry, real = documented_commands()
    archive = tmp_path / "history.jsonl.gz"
    outputs = []
    for line in (dry, real.replace("/var/backups/dex/history-2026-12.jsonl.gz", str(archive))):
        args = shlex.split(line.replace("APP", "tests.support.apps.cliapp:dex"))[1:]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        outputs.append(result.stdout)
    assert outputs[0].startswith("history prune: would remove 20 calls, 2 sessions, 22 messages")
    assert outputs[1].startswith("history prune: removed 20 calls, 2 sessions, 22 messages")
    assert len(list(read_archive(archive))) == 22


def test_the_retention_setting_is_a_duration() -> None:
    """`DEX_RETENTION` unset keeps history forever; a duration sets it; anything else is a
    `ConfigurationError` naming the variable, at start-up."""
    from dex_celery.errors import ConfigurationError  # only this test raises it

    assert Settings.from_env({}).retention_seconds is None
    assert Settings.from_env({"DEX_RETENTION": "30d"}).retention_seconds == 30 * 86400
    assert Settings.from_env({"DEX_RETENTION": "12h"}).retention_seconds == 12 * 3600
    for bad in ("banana", "0d", "30", "-1d"):
        with pytest.raises(ConfigurationError, match="DEX_RETENTION"):
            Settings.from_env({"DEX_RETENTION": bad})


def test_cli_bad_batch_is_one_error_line() -> None:
    from dex_celery.cli.main import main  # the CLI, only these tests drive it

    result = CliRunner().invoke(
        main,
        [
            "-A",
            "tests.support.apps.cliapp:dex",
            "history",
            "prune",
            "--before",
            "30d",
            "--batch",
            "0",
        ],
    )
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines() == ["error: --batch must be positive, got 0"]
