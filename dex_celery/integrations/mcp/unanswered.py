"""Which call a `tools/call` without ids is, shared by every `dex-celery mcp` process.

A plain MCP client sends no ids. While such a call's outcome has not been given (it waits for
approval, or is still in flight), asking again for the same tool with the same arguments, as the
same caller in the same session, is that call again (`mcp/server`'s docstring). "The same
arguments" is the call as the tool will receive it (S12.2): the key is built from the tool's
fingerprint of them (`tools/call_identity.py`), so `10.0` for `10` finds the same call. Kept in one
process's memory, that held over HTTP (one server process) but not over stdio, where a client
may start a new server process per request: each process made a new call, and an operator saw
the same charge twice. So the mapping lives in the ledger's Redis, under
`<prefix>:mcp:unanswered:<digest>`, shared by every server process, claimed with `SET NX` (two
processes asked at once agree on one call) and kept for the approval timeout at most.
"""

from __future__ import annotations

import hashlib
from typing import Any

from dex_celery.backend_errors import backend_errors

#: Deletes the mapping only if it still names the call given (another request may have
#: replaced it with a newer call meanwhile).
_FORGET = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class UnansweredCalls:
    """The unanswered call of each (caller, session, tool, arguments as received)."""

    def __init__(self, redis: Any, *, prefix: str, ttl: float, redis_url: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self.ttl = max(1, int(ttl))
        self.redis_url = redis_url
        self._forget = redis.register_script(_FORGET)

    def key(self, caller: str, session_id: str, tool: str, same_call_text: str) -> str:
        asked = "\0".join((caller, session_id, tool, same_call_text))
        digest = hashlib.sha256(asked.encode()).hexdigest()
        return f"{self.prefix}:mcp:unanswered:{digest}"

    def claim(self, key: str, fresh: str) -> str:
        """The call this request is: the unanswered one, else `fresh` (now recorded as it)."""
        with backend_errors(self.redis_url, ""):
            if self.redis.set(key, fresh, nx=True, ex=self.ttl):
                return fresh
            found = self.redis.get(key)
        if found is None:  # answered and forgotten between the two commands: a new call
            return self.claim(key, fresh)
        return found.decode() if isinstance(found, bytes) else str(found)

    def forget(self, key: str, call_key: str) -> None:
        """The call's outcome was given: the next such request is a new call."""
        with backend_errors(self.redis_url, ""):
            self._forget(keys=[key], args=[call_key])

    # --- calls followed as MCP tasks (`mcp/tasks`) -----------------------------------------

    def _task_key(self, call_key: str) -> str:
        digest = hashlib.sha256(call_key.encode()).hexdigest()
        return f"{self.prefix}:mcp:unanswered-task:{digest}"

    def remember_task(self, call_key: str, asked: str) -> None:
        """The call `call_key` is followed as a task: `tasks/get` gives its outcome, so it must
        be able to forget the request `asked` then."""
        with backend_errors(self.redis_url, ""):
            self.redis.set(self._task_key(call_key), asked, ex=self.ttl)

    def forget_task(self, call_key: str) -> None:
        """The task's outcome was given: the next request without ids asking the same again is
        a new call."""
        with backend_errors(self.redis_url, ""):
            asked = self.redis.get(self._task_key(call_key))
            if asked is None:
                return
            key = asked.decode() if isinstance(asked, bytes) else str(asked)
            self._forget(keys=[key], args=[call_key])
            self.redis.delete(self._task_key(call_key))
