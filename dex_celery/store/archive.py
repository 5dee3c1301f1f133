"""The archive of pruned history: gzip-compressed JSON lines, one record per call or session.

A prune appends each batch as one gzip member (a gzip file may hold many; `zcat` and Python's
`gzip` read them as one stream) and flushes and fsyncs it before the batch's rows are deleted.
A process killed while it writes leaves at most one cut member at the end: the calls in it were
not deleted yet (their delete comes after the fsync), so `Archive.open` cuts the file back to
its last whole member and nothing is lost or half-kept. A call may be both in the archive and
still in SQL (killed between the fsync and the delete's commit; a row that changed while it was
archived): a later prune archives it again, and a reader keeps the last record of each key.
"""

from __future__ import annotations

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

    def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            created = not self.path.exists()
            handle = self.path.open("ab")
            if not created:
                # A cut member left by a killed prune: its calls are still in SQL.
                handle.truncate(whole_length(self.path))
            self._file = handle
            if created:
                _fsync_directory(self.path.parent)
        except OSError as e:
            raise ArchiveError(f"cannot write the archive {self.path}: {e}") from e

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
            raise ArchiveError(f"cannot write the archive {self.path}: {e}") from e

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
