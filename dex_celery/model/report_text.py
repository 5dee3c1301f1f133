"""The text of an outcome report (S8.1) and the one test of whether a call was reported (S8.2).

Used by the reconcile job, the seed's `report_unknown_outcomes` and `dex-celery calls show`, so
all three agree on which user message reports which call: by the exact key, never a substring.
"""

from __future__ import annotations

import re


def format_report(answer: str, key: str) -> str:
    """The user message sent for a call: the check's note, then `(tool call <key>)`."""
    return f"{answer} (tool call {key})"


def already_reported(key: str, user_text: str) -> bool:
    """Does a user message already name this call? (S8.2)

    The seed tests `key in text`; this also requires the key to stand alone, so the report of
    `s/t/call-10` does not count as one for `s/t/call-1`.
    """
    return re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", user_text) is not None
