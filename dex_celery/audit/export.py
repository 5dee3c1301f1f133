"""Signed exports of the audit log, and their offline check (S13.4.4).

An export is JSON lines: a header (what it holds), the entries (each with its hash, and the
signature of the last entry of its transaction), the chains' signed heads and the prune
checkpoints it starts or ends at, then a seal: the SHA-256 of every byte before it, signed with
the deployment's key. `verify_file` needs only the public key: it checks the seal (a byte changed
anywhere fails it), every entry's hash, every signature, and, where the export holds whole
chains (a `--since` window, a prune's archive), their links, numbering and ends. A prune's
archive is such a file (`audit/prune.py`), so it verifies on its own.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sqlalchemy import select

from dex_celery.audit.check import Anchor, FindingClass, Findings, check_chain, check_checkpoint
from dex_celery.audit.entries import Chained, canonical
from dex_celery.audit.keys import Signer, Verifier
from dex_celery.audit.verify import anchors, entries, first_id_since, snapshot
from dex_celery.errors import AuditFileError
from dex_celery.store.repository import Store
from dex_celery.store.schema import audit_log

FORMAT = "dex-audit/1"


class SealedWriter:
    """Writes an export's lines and, at the end, its signed seal."""

    def __init__(self, out: IO[str], signer: Signer | None) -> None:
        self.out = out
        self.signer = signer
        self._digest = hashlib.sha256()
        self.lines = 0

    def line(self, value: dict[str, Any]) -> None:
        text = canonical(value) + "\n"
        self._digest.update(text.encode())
        self.out.write(text)
        self.lines += 1

    def seal(self) -> None:
        digest = self._digest.hexdigest()
        signer = self.signer
        self.out.write(
            canonical(
                {
                    "type": "seal",
                    "lines": self.lines,
                    "digest": digest,
                    "signature": signer.sign(digest) if signer is not None else None,
                    "key_id": signer.key_id if signer is not None else None,
                }
            )
            + "\n"
        )


def export(
    store: Store,
    signer: Signer | None,
    out: IO[str],
    *,
    session_id: str | None = None,
    since: float | None = None,
) -> int:
    """Write the entries of one session (or every entry since `since`, or all) to `out`; the
    number of entries. One read transaction: the heads match the entries written."""
    scope: dict[str, Any] = {"session": session_id, "since": since}
    sealed = SealedWriter(out, signer)
    # This machine's clock: an export reads SQL only, and Redis may be down.
    header = {"type": "header", "format": FORMAT, "scope": scope, "exported_at": time.time()}
    sealed.line(header)
    count = 0
    with snapshot(store.engine.connect()) as conn, conn.begin():
        heads, cuts = anchors(conn)
        if session_id is not None:
            query = (
                select(audit_log)
                .where(audit_log.c.session_id == session_id)
                .order_by(audit_log.c.writer, audit_log.c.seq)
            )
            rows: Iterable[Chained] = (Chained.of(r) for r in conn.execute(query).mappings())
        else:
            from_id = first_id_since(conn, since)
            rows = entries(conn, from_id)
        writers: set[str] = set()
        for entry in rows:
            writers.add(entry.writer)
            sealed.line({"type": "entry", **entry.as_dict()})
            count += 1
        if session_id is None:
            for writer in sorted(heads):
                if since is None or writer in writers:
                    sealed.line({"type": "head", **heads[writer].as_dict()})
            if since is None:
                for writer in sorted(cuts):
                    sealed.line({"type": "start", **cuts[writer].as_dict()})
    sealed.seal()
    return count


@dataclass(slots=True)
class _Parsed:
    header: dict[str, Any]
    entries: dict[str, list[Chained]] = field(default_factory=dict)
    heads: dict[str, Anchor] = field(default_factory=dict)
    starts: dict[str, Anchor] = field(default_factory=dict)
    ends: dict[str, Anchor] = field(default_factory=dict)


def verify_file(path: Path, verifier: Verifier | None) -> Findings:
    """Check an export or a prune's archive with the public keys alone (no database)."""
    findings = Findings()
    parsed = _parse(path, findings, verifier)
    scope = parsed.header.get("scope") or {}
    whole = scope.get("session") is None and scope.get("since") is None
    for writer in sorted(parsed.entries):
        chain = sorted(parsed.entries[writer], key=lambda e: e.seq)
        findings.chains += 1
        last = check_chain(
            findings,
            verifier,
            writer,
            chain,
            start=parsed.starts.get(writer) if whole else None,
            head=parsed.heads.get(writer),
            whole=whole,
            require_head=writer not in parsed.ends,
        )
        end = parsed.ends.get(writer)
        if end is not None and (last is None or (last.seq, last.hash) != (end.seq, end.hash)):
            at = last.label() if last is not None else "nothing"
            findings.add(
                FindingClass.DELETED, f"chain {writer} ends at {at}, not at its cut #{end.seq}"
            )
    for anchor in [*parsed.starts.values(), *parsed.ends.values()]:
        check_checkpoint(findings, verifier, anchor)
    return findings


def _lines(path: Path) -> Iterator[bytes]:
    try:
        with path.open("rb") as f:
            yield from f
    except OSError as e:
        raise AuditFileError(f"cannot read {path}: {e.strerror}") from None


def _parse(path: Path, findings: Findings, verifier: Verifier | None) -> _Parsed:
    digest = hashlib.sha256()
    parsed: _Parsed | None = None
    sealed = False
    count = 0
    for number, raw in enumerate(_lines(path), start=1):
        if sealed:
            findings.add(FindingClass.INSERTED, f"line {number} comes after the seal")
            break
        try:
            value = json.loads(raw)
        except ValueError:
            findings.add(FindingClass.EDITED, f"line {number} is not JSON")
            digest.update(raw)
            count += 1
            continue
        kind = value.get("type") if isinstance(value, dict) else None
        if kind == "seal":
            sealed = True
            _check_seal(findings, verifier, value, digest.hexdigest(), count)
            continue
        digest.update(raw)
        count += 1
        if parsed is None:
            if kind != "header" or value.get("format") != FORMAT:
                raise AuditFileError(
                    f"{path} is not an audit export (its first line is no {FORMAT} header)"
                )
            parsed = _Parsed(value)
            continue
        try:
            _take(parsed, kind, value)
        except (KeyError, TypeError, ValueError):
            findings.add(FindingClass.EDITED, f"line {number} is not a whole {kind or 'line'}")
    if parsed is None:
        raise AuditFileError(f"{path} is empty: no audit export")
    if not sealed:
        findings.add(FindingClass.DELETED, "the export's seal is missing (its end was cut)")
    return parsed


def _take(parsed: _Parsed, kind: Any, value: dict[str, Any]) -> None:
    if kind == "entry":
        entry = Chained.of(value)
        parsed.entries.setdefault(entry.writer, []).append(entry)
    elif kind == "head":
        parsed.heads[value["writer"]] = Anchor.of(value)
    elif kind == "start":
        parsed.starts[value["writer"]] = Anchor.of(value)
    elif kind == "end":
        parsed.ends[value["writer"]] = Anchor.of(value)
    else:
        raise ValueError(kind)


def _check_seal(
    findings: Findings, verifier: Verifier | None, seal: dict[str, Any], digest: str, count: int
) -> None:
    if seal.get("digest") != digest or seal.get("lines") != count:
        findings.add(FindingClass.EDITED, "the export was changed after it was sealed")
        return
    if verifier is None:
        return
    wrong = verifier.check(digest, seal.get("signature"), seal.get("key_id"))
    if wrong == "not signed":
        findings.add(FindingClass.UNSIGNED, "the export's seal is not signed")
    elif wrong is not None:
        findings.add(FindingClass.SIGNATURE, f"the export's seal: {wrong}")
