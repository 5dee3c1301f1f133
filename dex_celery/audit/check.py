"""Checking chains: the part of `audit verify` that needs no database (S13.4.3).

Given a writer's entries in `seq` order, where its chain was cut (a prune's checkpoint) and its
signed head, `check_chains` finds every entry whose content no longer matches its hash (edited),
whose `prev` does not match the entry before it (inserted, removed or moved), a gap in the
numbering, a chain whose end is not its signed head (a cut tail, or entries added after it), a
chain with no head (added behind the writers' back) and a head whose chain is gone. Findings are
grouped by class; each names the first entry it found.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dex_celery.audit.entries import GENESIS, Chained, checkpoint_digest
from dex_celery.audit.keys import Verifier


class FindingClass(StrEnum):
    EDITED = "entry edited"
    DELETED = "entry deleted"
    INSERTED = "entry inserted"
    REORDERED = "entries reordered"
    GAP = "gap"
    SIGNATURE = "bad signature"
    UNSIGNED = "not signed"
    RECORD = "record disagrees with the chain"


@dataclass(slots=True)
class Findings:
    """What a verification found, by class: the first finding's text and how many there are."""

    first: dict[FindingClass, str] = field(default_factory=dict)
    counts: dict[FindingClass, int] = field(default_factory=dict)
    entries: int = 0
    chains: int = 0

    def add(self, kind: FindingClass, text: str) -> None:
        self.first.setdefault(kind, text)
        self.counts[kind] = self.counts.get(kind, 0) + 1

    @property
    def ok(self) -> bool:
        return not self.first

    def lines(self) -> list[str]:
        """One line per class, in a fixed order."""
        out = []
        for kind in FindingClass:
            if kind in self.first:
                more = self.counts[kind] - 1
                tail = f" (and {more} more)" if more else ""
                out.append(f"audit log: {kind.value}: {self.first[kind]}{tail}")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "entries": self.entries,
            "chains": self.chains,
            "findings": {
                k.value: {"first": v, "count": self.counts[k]} for k, v in self.first.items()
            },
        }


@dataclass(frozen=True, slots=True)
class Anchor:
    """A signed point of a chain: its head, or a prune's checkpoint (where it was cut)."""

    writer: str
    seq: int
    hash: str
    at: float
    signature: str | None
    key_id: str | None

    @classmethod
    def of(cls, row: Mapping[Any, Any], at_column: str = "at") -> Anchor:
        return cls(
            str(row["writer"]),
            int(row["seq"]),
            str(row["hash"]),
            float(row[at_column]),
            row["signature"],
            row["key_id"],
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "writer": self.writer,
            "seq": self.seq,
            "hash": self.hash,
            "at": self.at,
            "signature": self.signature,
            "key_id": self.key_id,
        }


def check_signature(
    findings: Findings,
    verifier: Verifier | None,
    digest: str,
    signature: str | None,
    key: str | None,
    what: str,
) -> None:
    if verifier is None:
        return
    wrong = verifier.check(digest, signature, key)
    if wrong == "not signed":
        findings.add(FindingClass.UNSIGNED, f"{what} is not signed")
    elif wrong is not None:
        findings.add(FindingClass.SIGNATURE, f"{what}: {wrong}")


def check_checkpoint(findings: Findings, verifier: Verifier | None, cut: Anchor) -> None:
    digest = checkpoint_digest(cut.writer, cut.seq, cut.hash, cut.at)
    check_signature(
        findings, verifier, digest, cut.signature, cut.key_id, f"checkpoint {cut.writer}#{cut.seq}"
    )


def check_chain(
    findings: Findings,
    verifier: Verifier | None,
    writer: str,
    entries: Iterable[Chained],
    *,
    start: Anchor | None,
    head: Anchor | None,
    whole: bool,
    require_head: bool = True,
) -> Chained | None:
    """Check one writer's entries (in `seq` order); the last entry, None if none.

    `start`: the checkpoint the chain continues from. `require_head`: a chain without a head
    was added (false for a prune's archive, which ends at a checkpoint instead). `whole`: the entries are meant to run
    from the chain's beginning (or `start`) without gaps; otherwise (an export of a session, a
    `--since` window) the first entry's link backwards is not checked, nor gaps.
    """
    expected_seq = (start.seq + 1) if start is not None else 1
    expected_prev = start.hash if start is not None else GENESIS
    first = True
    last: Chained | None = None
    for entry in entries:
        findings.entries += 1
        intact = entry.expected_hash() == entry.hash
        if not intact:
            moved = _moved_from(entry)
            if moved is not None:
                findings.add(
                    FindingClass.REORDERED, f"{entry.label()} is entry #{moved} of its chain, moved"
                )
            else:
                findings.add(
                    FindingClass.EDITED, f"{entry.label()}: its content does not match its hash"
                )
        elif first and not whole:
            pass  # a window of the chain: its first link points outside it
        elif entry.seq > expected_seq:
            kind = FindingClass.GAP if first else FindingClass.DELETED
            findings.add(
                kind, f"{writer}#{expected_seq}..#{entry.seq - 1} missing before {entry.label()}"
            )
        elif entry.prev != expected_prev:
            findings.add(
                FindingClass.INSERTED, f"{entry.label()} does not follow the entry before it"
            )
        if entry.signature is not None or entry.key_id is not None:
            check_signature(
                findings, verifier, entry.hash, entry.signature, entry.key_id, entry.label()
            )
        expected_seq, expected_prev, first, last = entry.seq + 1, entry.hash, False, entry
    if head is None:
        if last is not None and whole and require_head:
            findings.add(
                FindingClass.INSERTED,
                f"chain {writer} has no head: {last.label()} and the entries before it were added",
            )
        return last
    check_signature(
        findings, verifier, head.hash, head.signature, head.key_id, f"the head of chain {writer}"
    )
    end_seq = last.seq if last is not None else (start.seq if start is not None else 0)
    end_hash = last.hash if last is not None else (start.hash if start is not None else GENESIS)
    if end_seq < head.seq:
        findings.add(
            FindingClass.DELETED,
            f"{writer}#{end_seq + 1}..#{head.seq} cut from the chain's end (its signed head is #{head.seq})",
        )
    elif end_seq > head.seq:
        assert last is not None
        findings.add(
            FindingClass.INSERTED, f"{last.label()} is past the chain's signed head #{head.seq}"
        )
    elif end_hash != head.hash:
        label = last.label() if last is not None else f"{writer}#{end_seq}"
        findings.add(FindingClass.EDITED, f"{label} is not the chain's signed head")
    return last


#: How far `_moved_from` looks for an entry's real place.
_MOVE_WINDOW = 64


def _moved_from(entry: Chained) -> int | None:
    """The place an entry whose hash fails would hash right at (it was moved), if near."""
    for seq in range(max(1, entry.seq - _MOVE_WINDOW), entry.seq + _MOVE_WINDOW):
        if seq != entry.seq:
            moved = Chained(
                entry.writer,
                seq,
                entry.at,
                entry.kind,
                entry.call_key,
                entry.session_id,
                entry.body,
                entry.prev,
                entry.hash,
            )
            if moved.expected_hash() == entry.hash:
                return seq
    return None
