"""The one rule for the text of a message in a session's history (S9.3)."""

from __future__ import annotations

from dex_celery.errors import InvalidText


def check_text(text: object, *, limit: int) -> str:
    """A non-empty string of at most `limit` bytes (UTF-8), or `InvalidText`.

    Args:
        text: what a caller wants to append as a message.
        limit: `Settings.max_text_bytes`.

    Returns:
        `text`, checked.

    Raises:
        InvalidText: not a string, empty, or over the limit.
    """
    if not isinstance(text, str):
        raise InvalidText(f"message text must be a string, got {type(text).__name__}")
    if not text.strip():
        raise InvalidText("message text must not be empty")
    size = len(text.encode())
    if size > limit:
        raise InvalidText(f"message text is {size} bytes; the limit is {limit}")
    return text
