"""`audit verify` against the database (S13.4.3): the chains, then the live records.

Everything is read in one read transaction (a snapshot on PostgreSQL's REPEATABLE READ and on
SQLite), so a call being recorded while verify runs is seen with its entries or not at all.
The chains are checked writer by writer (`audit/check.py`); while they are read, each call's
last word is gathered (`CallWord`), and every live call is then compared with it: an UPDATE of
a record (its status, result, error or decision) shows as a disagreement, a DELETE as a call
the chain speaks of that is gone without a prune's entry saying so, an INSERT as a call with no
entry at all. Calls requested before the log began (or before the last prune's cut) and never
spoken of since are outside what the chain can vouch for.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from itertools import groupby
from typing import Any

from sqlalchemy import Connection, func, select

from dex_celery.audit.call_entries import CallWord
from dex_celery.audit.check import (
    Anchor,
    FindingClass,
    Findings,
    check_chain,
    check_checkpoint,
)
from dex_celery.audit.entries import AuditKind, Chained
from dex_celery.audit.keys import Verifier
from dex_celery.store.dialect import IN_CHUNK
from dex_celery.store.repository import Store
from dex_celery.store.schema import audit_checkpoints, audit_heads, audit_log, tool_calls

#: Entries read per round trip.
_PAGE = 5000

_RECORD_COLUMNS = (
    tool_calls.c.key,
    tool_calls.c.status,
    tool_calls.c.result,
    tool_calls.c.error,
    tool_calls.c.decision,
    tool_calls.c.decided_by,
    tool_calls.c.requested_at,
)


def snapshot(conn: Connection) -> Connection:
    if conn.dialect.name == "postgresql":
        return conn.execution_options(isolation_level="REPEATABLE READ")
    return conn


def anchors(conn: Connection) -> tuple[dict[str, Anchor], dict[str, Anchor]]:
    """The signed heads and the prune checkpoints, by writer."""
    heads = {r["writer"]: Anchor.of(r) for r in conn.execute(select(audit_heads)).mappings()}
    cuts = {
        r["writer"]: Anchor.of(r, "cut_at")
        for r in conn.execute(select(audit_checkpoints)).mappings()
    }
    return heads, cuts


def first_id_since(conn: Connection, since: float | None) -> int | None:
    """Where a `--since` window starts in storage order: each writer's entries from there on
    are a suffix of its chain (a writer appends in `seq` order)."""
    if since is None:
        return None
    found = conn.execute(select(func.min(audit_log.c.id)).where(audit_log.c.at >= since)).scalar()
    return int(found) if found is not None else -1


def entries(conn: Connection, from_id: int | None) -> Iterator[Chained]:
    """Every entry (from `from_id` on), by writer then seq, a page at a time."""
    after: tuple[str, int] | None = None
    while True:
        query = select(audit_log).order_by(audit_log.c.writer, audit_log.c.seq).limit(_PAGE)
        if from_id is not None:
            query = query.where(audit_log.c.id >= from_id)
        if after is not None:
            query = query.where(
                (audit_log.c.writer > after[0])
                | ((audit_log.c.writer == after[0]) & (audit_log.c.seq > after[1]))
            )
        page = [Chained.of(r) for r in conn.execute(query).mappings()]
        yield from page
        if len(page) < _PAGE:
            return
        after = (page[-1].writer, page[-1].seq)


def verify_database(
    store: Store, verifier: Verifier | None, since: float | None = None
) -> Findings:
    findings = Findings()
    with snapshot(store.engine.connect()) as conn, conn.begin():
        heads, cuts = anchors(conn)
        for cut in cuts.values():
            check_checkpoint(findings, verifier, cut)
        from_id = first_id_since(conn, since)
        whole = since is None
        words: dict[str, CallWord] = {}
        pruned: set[str] = set()
        seen: set[str] = set()
        earliest: list[float] = []
        for writer, chain in groupby(entries(conn, from_id), key=lambda e: e.writer):
            seen.add(writer)
            findings.chains += 1
            check_chain(
                findings,
                verifier,
                writer,
                _gathering(chain, words, pruned, earliest),
                start=cuts.get(writer) if whole else None,
                head=heads.get(writer),
                whole=whole,
            )
        if whole:
            for writer, head in heads.items():
                if writer in seen:
                    continue
                gone = cuts.get(writer)
                if gone is None or gone.seq != head.seq or gone.hash != head.hash:
                    start = gone.seq + 1 if gone is not None else 1
                    findings.add(
                        FindingClass.DELETED,
                        f"every entry of chain {writer} (#{start}..#{head.seq}) is gone",
                    )
        # Calls requested from here on are ones the chain must speak of: since the log began
        # (its first entry), or after the last prune's cut (whose entries went to its archive).
        covered = min(earliest, default=None)
        if cuts:
            covered = math.nextafter(max(c.at for c in cuts.values()), math.inf)
        if since is not None:
            covered = since if covered is None else max(covered, since)
        _check_records(conn, findings, words, pruned, covered, since)
    return findings


def _gathering(
    chain: Iterator[Chained],
    words: dict[str, CallWord],
    pruned: set[str],
    earliest: list[float],
) -> Iterator[Chained]:
    """The chain's entries, each read for its call's last word on the way past."""
    for entry in chain:
        if not earliest or entry.at < earliest[0]:
            earliest[:] = [entry.at]
        _gather(entry, words, pruned)
        yield entry


def _gather(entry: Chained, words: dict[str, CallWord], pruned: set[str]) -> None:
    if entry.kind == AuditKind.HISTORY_PRUNED:
        pruned.update(_body(entry).get("calls") or ())
    elif entry.call_key is not None:
        word = words.get(entry.call_key)
        if word is None:
            word = words[entry.call_key] = CallWord()
        word.take(entry.kind, _body(entry), entry.label(), entry.at)


def _body(entry: Chained) -> dict[str, Any]:
    try:
        body = json.loads(entry.body)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _check_records(
    conn: Connection,
    findings: Findings,
    words: dict[str, CallWord],
    pruned: set[str],
    covered: float | None,
    since: float | None,
) -> None:
    """Every live call against the chain's last word on it (see the module docstring)."""
    query = select(*_RECORD_COLUMNS)
    if since is not None:
        query = query.where(tool_calls.c.requested_at >= since)
    live: set[str] = set()
    for row in conn.execute(query).mappings():
        _compare(findings, row, words, covered, live)
    if since is not None:  # the calls the window speaks of that were requested before it
        older = sorted(set(words) - live)
        for start in range(0, len(older), IN_CHUNK):
            chunk = older[start : start + IN_CHUNK]
            rows = conn.execute(select(*_RECORD_COLUMNS).where(tool_calls.c.key.in_(chunk)))
            for row in rows.mappings():
                _compare(findings, row, words, None, live)
    for key in sorted(set(words) - live - pruned):
        findings.add(
            FindingClass.RECORD,
            f"call {key} is gone from the records, and no prune removed it "
            f"(the chain's last word on it: {words[key].last})",
        )


def _compare(
    findings: Findings,
    row: Any,
    words: dict[str, CallWord],
    covered: float | None,
    live: set[str],
) -> None:
    key = row["key"]
    live.add(key)
    word = words.get(key)
    if word is None:
        if covered is not None and row["requested_at"] >= covered:
            findings.add(
                FindingClass.RECORD, f"call {key} has no entry in the chain (added behind it)"
            )
        return
    for wrong in word.disagreements(row):
        findings.add(FindingClass.RECORD, f"call {key}: {wrong} (last word: {word.last})")
