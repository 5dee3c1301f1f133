"""The conversation both ways between an agent framework's history and the dex session (S12.1).

Every adapter hands this module the framework's history as `SeenMessage`s; the rules (what is
copied, what is handed back, exactly once) are `model/conversation.py`'s. Each adapter decides
only where in its framework this happens (docs/frameworks.md, "One conversation"):

- `record` when the model makes a call, before it is requested, so the approvals page, the
  webhook, `calls show` and `get_agent_snapshot` show what led to the call;
- `undelivered` when the framework is about to ask the model again (a run, a resume): the
  session's user messages written through dex that the history does not hold yet, which the
  adapter puts into the history in its framework's own way; `taken` instead where a session's
  runs do not share one history (CrewAI), so a message reaches only the run that took it.

A copy that fails (the database is down) is logged and does not stop the call: the call's own
request then reports the outage as its typed error. Handing back reads the database and raises
dex-celery's typed errors, since a report the model never reads is the fault this module exists
to prevent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from dex_celery.backend_errors import backend_errors
from dex_celery.engine import RuntimeSource
from dex_celery.errors import DexError
from dex_celery.model.conversation import SeenMessage, to_copy, undelivered
from dex_celery.model.records import Message
from dex_celery.tools.sealing import Scrubber
from dex_celery.tools.tool import Tool

log = logging.getLogger(__name__)


def call_secrets(tool: Tool, arguments: Mapping[str, Any] | str) -> dict[str, Any]:
    """The values of the call's secret arguments (what its copied messages are scrubbed of)."""
    if not isinstance(arguments, Mapping):
        return {}
    return {n: arguments[n] for n in tool.policy.secret_arguments if n in arguments}


class Conversation:
    """The session side of one conversation, for one deployment."""

    def __init__(self, source: RuntimeSource) -> None:
        self.source = source

    def _errors(self) -> Any:
        settings = self.source.runtime.settings
        return backend_errors(settings.redis_url, settings.database_url)

    # --- into dex ---------------------------------------------------------------------------------

    def record(
        self,
        session_id: str,
        history: Sequence[SeenMessage],
        secrets: Mapping[str, Any] | None = None,
    ) -> int:
        """Copy the history's user and assistant messages into the session; how many were new."""
        scrubber = Scrubber(secrets)
        store = self.source.runtime.store
        try:
            with self._errors():
                sent = [m.text or "" for m in store.sent_user_messages(session_id)]
                copied = to_copy(
                    history, sent, self.source.runtime.settings.secret_key, scrubber.text
                )
                return store.copy_messages(session_id, copied, scrubber.text if scrubber else None)
        except DexError as e:
            log.warning("the conversation of session %s was not copied into dex: %s", session_id, e)
            return 0

    async def arecord(
        self,
        session_id: str,
        history: Sequence[SeenMessage],
        secrets: Mapping[str, Any] | None = None,
    ) -> int:
        return await asyncio.to_thread(self.record, session_id, history, secrets)

    # --- back to the model -----------------------------------------------------------------------

    def undelivered(self, session_id: str, user_texts: Sequence[str]) -> list[Message]:
        """The session's user messages written through dex that a history whose user messages
        are `user_texts` does not hold yet, oldest first."""
        with self._errors():
            sent = self.source.runtime.store.sent_user_messages(session_id)
        return undelivered(sent, user_texts)

    async def aundelivered(self, session_id: str, user_texts: Sequence[str]) -> list[Message]:
        return await asyncio.to_thread(self.undelivered, session_id, user_texts)

    def taken(self, session_id: str, run: str, user_texts: Sequence[str]) -> list[Message]:
        """`undelivered` for a framework whose runs do not carry one history: the messages the
        session's next run takes (`run`, the first to ask after they were sent; a resumed run
        asks under the same id) that its history does not hold yet. A later run is never
        handed a message an earlier run took."""
        with self._errors():
            took = self.source.runtime.store.take_user_messages(session_id, run)
        return undelivered(took, user_texts)
