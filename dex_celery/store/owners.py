"""Which identity began a session through a network door (`dex_session_owners`).

`dex-celery mcp` lets a caller request or follow calls only of sessions its identity owns, so
knowing (or guessing) another session's call key and arguments gives nothing (S11.3). The
first caller to name a new session owns it; a session that already exists without an owner
(begun in-process, through the Python API or an agent loop) belongs to no network caller.
"""

from __future__ import annotations

from sqlalchemy import select

from dex_celery.backend_errors import backend_errors
from dex_celery.store.dialect import insert_ignore
from dex_celery.store.repository import Store
from dex_celery.store.schema import session_owners, sessions


class SessionOwners:
    """The owners table of one store."""

    def __init__(self, store: Store, *, redis_url: str = "") -> None:
        self.store = store
        self.redis_url = redis_url

    def owner(self, session_id: str) -> str | None:
        with backend_errors(self.redis_url, self.store.url), self.store.engine.connect() as conn:
            row = conn.execute(
                select(session_owners.c.owner).where(session_owners.c.session_id == session_id)
            ).first()
        return None if row is None else str(row.owner)

    def claim(self, session_id: str, identity: str) -> bool:
        """True if `identity` owns `session_id`, making it the owner of a session not begun yet.

        Raises `DatabaseUnavailable` (a `DexError`) if the database does not answer.
        """
        with backend_errors(self.redis_url, self.store.url), self.store.engine.begin() as conn:
            row = conn.execute(
                select(session_owners.c.owner).where(session_owners.c.session_id == session_id)
            ).first()
            if row is not None:
                return str(row.owner) == identity
            begun = conn.execute(select(sessions.c.id).where(sessions.c.id == session_id)).first()
            if begun is not None:
                return False  # begun in-process: no network caller's
            insert_ignore(
                conn,
                session_owners,
                session_id=session_id,
                owner=identity,
                created_at=self.store.clock(),
            )
            row = conn.execute(
                select(session_owners.c.owner).where(session_owners.c.session_id == session_id)
            ).first()
        return row is not None and str(row.owner) == identity
