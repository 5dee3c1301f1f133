"""How many rows one listing may ask for (the calls page, `calls list`, approvals).

A limit goes into SQL as an integer parameter: SQLite refuses a Python int beyond 64 bits with
`OverflowError`, PostgreSQL's `LIMIT` parameter is 32-bit. Refusing it up front gives the typed
error every other bad input gets (S9.3) instead of a driver's exception.
"""

from __future__ import annotations

from dex_celery.errors import DexError, InvalidRequest

#: The most rows one listing returns: what a 32-bit SQL integer holds.
MAX_LIST_LIMIT = 2**31 - 1


def check_list_limit(limit: int, error: type[DexError] = InvalidRequest) -> int:
    """`limit` if it is from 1 to `MAX_LIST_LIMIT`, else `error` saying so."""
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise error(f"limit must be from 1 to {MAX_LIST_LIMIT}, got {limit}")
    return limit
