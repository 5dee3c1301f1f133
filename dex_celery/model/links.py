"""Where a person reads a session as one story: its page on the web app (S13.6).

The web app serves it at `session_path`; a trace or any other output that leaves the web app
names it as `session_url`, under the address the deployment says people reach the web app at
(`web_base_url`). A session id may hold any printable character but `/`, `#`, `{`, `}`
(`model/ids.py`): every other reserved or non-ASCII character is percent-encoded, so the path
names exactly that session.
"""

from __future__ import annotations

from urllib.parse import quote

#: The web app's route of a session's page, before the session id.
SESSIONS_PATH = "/sessions/"


def session_path(session_id: str) -> str:
    """`/sessions/<id, percent-encoded>`: what the web app routes to the session's page."""
    return SESSIONS_PATH + quote(session_id, safe="")


def session_url(base_url: str | None, session_id: str) -> str | None:
    """The session page's address under `base_url` (`https://dex.example.com`); None without
    one (the web app's address is then not known outside it)."""
    if not base_url:
        return None
    return base_url.rstrip("/") + session_path(session_id)
