"""Alembic's INFO lines kept out of a process that only reads the schema's revision.

Alembic logs at INFO when it is first imported (each plugin it sets up) and whenever a migration
context is made ("Context impl SQLiteImpl.", "Will assume non-transactional DDL."). A Celery
worker logs at INFO and checks the revision at every start, so each start printed nine lines
that told an operator nothing. Reads of the revision run with the `alembic` logger at WARNING;
a level the host application set for it itself is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

_ALEMBIC = logging.getLogger("alembic")


@contextmanager
def quiet_alembic() -> Iterator[None]:
    """Alembic at WARNING for the block, unless its logger's level was set by someone else."""
    if _ALEMBIC.level != logging.NOTSET:
        yield
        return
    _ALEMBIC.setLevel(logging.WARNING)
    try:
        yield
    finally:
        _ALEMBIC.setLevel(logging.NOTSET)
