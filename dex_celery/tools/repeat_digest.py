"""What makes two calls identical for the repeat guard (S5.4): one digest of the tool and its
canonical arguments.

Secret values never enter the digest in clear: they are folded in as a keyed digest (HMAC with
`secret_key`, the key that seals them, docs/secrets.md), so two calls with the same card number
match, two with different ones do not, and the stored digest reveals neither.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from dex_celery.tools.sealing import fernet


def secrets_digest(secrets: Mapping[str, Any], secret_key: str | None) -> str:
    """Keyed digest of the secret values; '' when there are none. Without a key, secrets are
    refused before this is reached (`fernet` raises the same typed error as sealing)."""
    if not secrets:
        return ""
    fernet(secret_key)  # the same refusal as sealing when no key is configured
    assert secret_key is not None
    text = json.dumps(dict(secrets), sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(secret_key.encode(), b"dex-repeat\0" + text, hashlib.sha256).hexdigest()


def repeat_digest(tool_name: str, shown_arguments: str, secrets_mac: str) -> str:
    """SHA-256 of tool name, canonical arguments as stored (`***` for secrets) and the keyed
    digest of the secret values: equal exactly when the calls would do the same thing."""
    h = hashlib.sha256()
    for part in (tool_name, shown_arguments, secrets_mac):
        data = part.encode()
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()
