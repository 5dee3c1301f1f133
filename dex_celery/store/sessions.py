"""Persistence of sessions and their message history."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import (
    Connection,
    insert,
    select,
    update,
)

from dex_celery.errors import UnknownSession
from dex_celery.model.conversation import CopiedMessage
from dex_celery.model.policy import EffectClass
from dex_celery.model.records import (
    Message,
    MessageRole,
    SessionRecord,
    ToolCallRecord,
)
from dex_celery.store.base import StoreBase
from dex_celery.store.dialect import insert_ignore
from dex_celery.store.rows import (
    call_record,
    message_record,
    session_record,
)
from dex_celery.store.schema import messages, sessions, tool_calls

if TYPE_CHECKING:
    from dex_celery.store.hot_request import RequestStatements


class SessionsAndMessages(StoreBase):
    """The session aggregate of `Store`: sessions, their default effect class, messages."""

    # --- sessions ------------------------------------------------------------------------------

    def open_session(
        self, session_id: str, default_effect: EffectClass | None = None
    ) -> SessionRecord:
        with self.engine.begin() as conn:
            insert_ignore(
                conn,
                sessions,
                id=session_id,
                default_effect=default_effect.value if default_effect else None,
                created_at=self.clock(),
            )
            row = conn.execute(select(sessions).where(sessions.c.id == session_id)).mappings().one()
        return session_record(row)

    def get_session(self, session_id: str) -> SessionRecord:
        with self.engine.connect() as conn:
            row = (
                conn.execute(select(sessions).where(sessions.c.id == session_id)).mappings().first()
            )
        if row is None:
            raise UnknownSession(f"no session {session_id!r}")
        return session_record(row)

    def snapshot(self, session_id: str) -> tuple[list[ToolCallRecord], list[Message]]:
        with self.engine.connect() as conn:
            if (
                conn.execute(select(sessions.c.id).where(sessions.c.id == session_id)).first()
                is None
            ):
                raise UnknownSession(f"no session {session_id!r}")
            calls = [
                call_record(r)
                for r in conn.execute(
                    select(tool_calls)
                    .where(tool_calls.c.session_id == session_id)
                    .order_by(tool_calls.c.requested_at, tool_calls.c.key)
                ).mappings()
            ]
            history = [
                message_record(r)
                for r in conn.execute(
                    select(messages)
                    .where(messages.c.session_id == session_id)
                    .order_by(messages.c.id)
                ).mappings()
            ]
        return calls, history

    def append_message(self, session_id: str, role: MessageRole, text: str) -> Message:
        now = self.clock()
        with self.engine.begin() as conn:
            if (
                conn.execute(select(sessions.c.id).where(sessions.c.id == session_id)).first()
                is None
            ):
                raise UnknownSession(f"no session {session_id!r}")
            result = conn.execute(
                insert(messages).values(
                    session_id=session_id, role=role.value, text=text, created_at=now
                )
            )
            new_id = result.inserted_primary_key[0] if result.inserted_primary_key else 0
        return Message(role=role, text=text, id=int(new_id), created_at=now)

    # --- one conversation with an agent framework (S12.1) ----------------------------------------

    def copy_messages(
        self,
        session_id: str,
        copied: Sequence[CopiedMessage],
        rescrub: Callable[[str], str] | None = None,
    ) -> int:
        """Keep a framework's user and assistant messages in the session (created if new), each
        once however often its history is seen; `rescrub` applies a call's secrets to the copies
        kept before (a secret may be in a message that led to an earlier call). Returns how many
        were new."""
        now = self.clock()
        added = 0
        with self.engine.begin() as conn:
            insert_ignore(conn, sessions, id=session_id, default_effect=None, created_at=now)
            known = set(
                conn.execute(
                    select(messages.c.mirror_key).where(
                        messages.c.session_id == session_id, messages.c.mirror_key.is_not(None)
                    )
                ).scalars()
            )
            if rescrub is not None:
                for row in conn.execute(
                    select(messages.c.id, messages.c.text).where(
                        messages.c.session_id == session_id, messages.c.mirror_key.is_not(None)
                    )
                ).all():
                    scrubbed = rescrub(row.text or "")
                    if scrubbed != (row.text or ""):
                        conn.execute(
                            update(messages).where(messages.c.id == row.id).values(text=scrubbed)
                        )
            for message in copied:
                if message.key in known:
                    continue
                # Two calls of one turn may copy the same history at once: the unique key decides.
                added += insert_ignore(
                    conn,
                    messages,
                    session_id=session_id,
                    role=message.role.value,
                    text=message.text,
                    mirror_key=message.key,
                    created_at=now,
                )
        return added

    def sent_user_messages(self, session_id: str) -> list[Message]:
        """The session's user messages written through dex (`send_user_message`, reconciliation
        reports), oldest first: what a framework's history is handed; none for no session."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(messages)
                .where(
                    messages.c.session_id == session_id,
                    messages.c.role == MessageRole.USER.value,
                    messages.c.mirror_key.is_(None),
                )
                .order_by(messages.c.id)
            ).mappings()
            return [message_record(r) for r in rows]

    def take_user_messages(self, session_id: str, run: str) -> list[Message]:
        """The session's user messages written through dex that `run` took, oldest first, for a
        framework whose runs do not carry one history (CrewAI: each kickoff is a new task
        conversation). The messages no run took yet are taken by `run` first, in the same
        transaction, so each reaches exactly one run however many ask at once; the taker's id
        is kept as the message's `turn_id`, and asking again as that run (a resumed kickoff)
        gives them again."""
        mine = (
            messages.c.session_id == session_id,
            messages.c.role == MessageRole.USER.value,
            messages.c.mirror_key.is_(None),
        )
        with self.engine.begin() as conn:
            conn.execute(
                update(messages).where(*mine, messages.c.turn_id.is_(None)).values(turn_id=run)
            )
            rows = conn.execute(
                select(messages).where(*mine, messages.c.turn_id == run).order_by(messages.c.id)
            ).mappings()
            return [message_record(r) for r in rows]


def session_default(
    conn: Connection, session_id: str, now: float, hot: RequestStatements | None = None
) -> EffectClass | None:
    """The session's default effect class, creating the session if it is new (in the
    transaction of a request that names it). `hot`: the request's driver SQL for the read of a
    session that exists (`store/hot_request.py`), the common case."""
    if hot is not None:
        default = hot.session_default.first(conn, {"b_id": session_id})
    else:
        default = conn.execute(
            select(sessions.c.default_effect).where(sessions.c.id == session_id)
        ).first()
    if default is None:
        # Insert-or-ignore: two first requests of a new session may race here (S2.3).
        if insert_ignore(conn, sessions, id=session_id, default_effect=None, created_at=now):
            return None
        default = conn.execute(
            select(sessions.c.default_effect).where(sessions.c.id == session_id)
        ).first()
        if default is None:
            return None
    return EffectClass.parse(default[0]) if default[0] else None
