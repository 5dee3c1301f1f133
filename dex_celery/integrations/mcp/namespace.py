"""Whose session a session id is, over `dex-celery mcp`: every authenticated principal has a
namespace of its own (docs/security.md, "A session is its caller's").

Ownership by first claim alone (`store/owners.py`) lets one caller take a session another will
use: naming it first, guessed or learnt, makes every later call of its real user fail. So a
caller that authenticated (a `web_users` person or a `web_tokens` token) never reaches a
session outside its namespace:

- its session ids are prefixed with its namespace tag, `<kind>-<name>-<hash>:` (`kind` is
  `user` or `token`, so a token and a person never share one even if a name moves from one to
  the other; `hash` is of kind and name, so two names that read alike stay apart). A session
  id already carrying the caller's own tag is kept as it is, so the key an answer gives back
  is the same call when sent again;
- a session id carrying another principal's tag is refused: nobody names a session there but
  its principal;
- the tag holds no `:` and ends at the first one, so no tag is a prefix of another's
  namespaced id.

The local caller (stdio, and loopback HTTP without credentials: the OS user running the
server, who holds the deployment's own settings and could write the database anyway) keeps
its session ids as given, except that it too may not name a session in a principal's
namespace. Sessions begun in-process stay nobody's over MCP (`store/owners.py`).
"""

from __future__ import annotations

import hashlib
import re

from dex_celery.access import Identity
from dex_celery.errors import InvalidId
from dex_celery.model.ids import MAX_ID_LENGTH, validate_id

#: Ends a namespace tag inside a session id.
NAMESPACE_END = ":"
#: How a session id in some principal's namespace begins.
_TAGGED = re.compile(r"(?:user|token)-[A-Za-z0-9_.-]*-[0-9a-f]{12}" + NAMESPACE_END)
#: How much of a name the tag shows (the hash tells names apart; this is for people reading).
_SHOWN = 32


def principal_kind(identity: Identity) -> str | None:
    """`token`, `user` (a person signed in or sent Basic), or None for the local caller."""
    if identity.via == "token":
        return "token"
    if identity.via in ("session", "basic"):
        return "user"
    return None


def namespace_of(identity: Identity) -> str | None:
    """The tag of `identity`'s sessions (`<kind>-<name>-<hash>`), None for the local caller."""
    kind = principal_kind(identity)
    if kind is None:
        return None
    shown = re.sub(r"[^A-Za-z0-9_.-]", "_", identity.name)[:_SHOWN]
    digest = hashlib.sha256(f"{kind}\0{identity.name}".encode()).hexdigest()[:12]
    return f"{kind}-{shown}-{digest}"


def in_a_namespace(session_id: str) -> bool:
    """Whether `session_id` lies in some principal's namespace."""
    return _TAGGED.match(session_id) is not None


def scoped_session(identity: Identity, session_id: str) -> str | None:
    """The session `identity` means by `session_id`: its own namespace's, or None if the id
    lies in another principal's namespace (the caller is told it is not its session).

    Raises `InvalidId` for an id that is not one, or that is too long once prefixed.
    """
    validate_id("session id", session_id)
    tag = namespace_of(identity)
    if tag is None:
        return None if in_a_namespace(session_id) else session_id
    prefix = tag + NAMESPACE_END
    if session_id.startswith(prefix):
        return session_id
    if in_a_namespace(session_id):
        return None
    scoped = prefix + session_id
    if len(scoped) > MAX_ID_LENGTH:
        raise InvalidId(
            f"session id is {len(session_id)} characters long; in your namespace ({prefix!r}) "
            f"it may be at most {MAX_ID_LENGTH - len(prefix)}"
        )
    return scoped
