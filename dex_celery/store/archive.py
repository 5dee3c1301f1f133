"""The archive of pruned history: gzip-compressed JSON lines, one record per call or session.

A prune appends each batch as one gzip member (a gzip file may hold many; `zcat` and Python's
`gzip` read them as one stream) and flushes and fsyncs it before the batch's rows are deleted.
A process killed while it writes leaves at most one cut member at the end: the calls in it were
not deleted yet (their delete comes after the fsync), so `Archive.open` cuts the file back to
its last whole member and nothing is lost or half-kept. A call may be both in the archive and
still in SQL (killed between the fsync and the delete's commit; a row that changed while it was
archived): a later prune archives it again, and a reader keeps the last record of each key.

An existing file is appended to only when it is such an archive (`is_archive`): a prune given
the path of anything else (a README, another program's gzip file) refuses before it deletes or
writes anything, so an operator's typo never costs a file (S9.4; docs/operations.md,
"Retention").
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from dex_celery.errors import ArchiveError

#: `wbits` of a zlib stream with a gzip header and trailer.
_GZIP = 16 + zlib.MAX_WBITS


def whole_length(path: Path) -> int:
    """The length of the file's leading whole gzip members (the rest is a cut last member)."""
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        reader = zlib.decompressobj(_GZIP)
        try:
            reader.decompress(data[offset:])
        except zlib.error:
            break
        if not reader.eof:
            break
        offset = len(data) - len(reader.unused_data)
    return offset


#: How every gzip member starts (RFC 1952: ID1, ID2, CM=deflate).
GZIP_MAGIC = b"\x1f\x8b\x08"
#: Bytes of an existing file read to recognise an archive (its first record is far shorter).
_SNIFF_BYTES = 64 * 1024


def is_archive(path: Path) -> bool:
    """Whether `path` holds a history archive (or nothing yet): empty, or gzip whose first
    record is a JSON object with a `key`, as every record a prune writes is. A first member cut
    by a killed prune counts when what it decompresses to so far starts like a record."""
    with path.open("rb") as f:
        head = f.read(_SNIFF_BYTES)
    if not head:
        return True
    if not head.startswith(GZIP_MAGIC):
        return False
    reader = zlib.decompressobj(_GZIP)
    try:
        text = reader.decompress(head, _SNIFF_BYTES)
    except zlib.error:
        return False
    first, newline, _rest = text.partition(b"\n")
    if not newline:  # a cut first member (or one record longer than the sniff): its start
        return text.startswith(b'{"') or (not text and not reader.eof)
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and isinstance(record.get("key"), str)


def check_archive_target(path: Path) -> None:
    """Refuse `path` as an archive to append to unless it is one, or nothing is there yet
    (a directory, a README, another program's gzip file): before anything is deleted."""
    try:
        if not path.exists():
            return
        if not path.is_file():
            raise ArchiveError(f"the archive {path} is not a file; name a file to write to")
        if not is_archive(path):
            raise ArchiveError(
                f"{path} exists and is not a dex-celery history archive (gzip JSON lines); "
                "nothing was pruned: name a new file, or an archive an earlier prune wrote "
                "(it is appended to)"
            )
    except OSError as e:
        raise ArchiveError(f"cannot read the archive {path}: {e}") from None


def read_archive(path: Path) -> Iterator[dict[str, Any]]:
    """Every record of the archive's whole members, in the order written."""
    data = path.read_bytes()[: whole_length(path)]
    for line in gzip.decompress(data).splitlines() if data else []:
        yield json.loads(line)


class Archive:
    """An archive file opened for appending batches; the directory is made if missing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO | None = None
        #: Whether this writer made the file (a failed first write then removes it).
        self._created = False

    def check(self) -> None:
        """`check_archive_target`: called by a prune before its first delete."""
        check_archive_target(self.path)

    def open(self) -> None:
        self.check()  # never truncate (below) what is not an archive
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            created = not self.path.exists()
            self._file = self.path.open("ab")
            self._created = created
            if not created:
                # A cut member left by a killed prune: its calls are still in SQL.
                self._file.truncate(whole_length(self.path))
            else:
                _fsync_directory(self.path.parent)
        except OSError as e:
            self._forget_if_empty()
            raise ArchiveError(f"cannot write the archive {self.path}: {e}") from None

    def append(self, records: list[dict[str, Any]]) -> None:
        """Write the records as one gzip member and make them durable before returning."""
        if not records:
            return
        if self._file is None:
            self.open()
        assert self._file is not None
        text = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records)
        try:
            self._file.write(gzip.compress(text.encode(), mtime=0))
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as e:
            self._forget_if_empty()
            raise ArchiveError(f"cannot write the archive {self.path}: {e}") from None
        self._created = False  # it holds a batch now: kept whatever happens next

    def _forget_if_empty(self) -> None:
        """A file this writer made whose first batch failed holds nothing whole: removed, so a
        failed prune leaves no empty or cut archive of its own behind."""
        if not self._created:
            return
        self.close()
        with contextlib.suppress(OSError):
            self.path.unlink()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _fsync_directory(directory: Path) -> None:
    """A new file's name is durable only once its directory is synced."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
