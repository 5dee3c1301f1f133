"""What makes two calls identical for the repeat guard (S5.4): one digest of the tool and its
canonical arguments as the tool receives them (`call_identity.py`, S12.2).

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


def secrets_digest(
    secrets: Mapping[str, Any], secret_key: str | None, *, given: bool = True
) -> str:
    """Keyed digest of the secret values; '' when there are none.

    `given`: whether the request carried any of them. Secrets it carried need the key (without
    one they were refused before this is reached: `fernet` raises the same typed error as
    sealing). Values that are only the tool's own defaults (S12.2 fills them in) are no secret
    of the caller's; without a key they are digested unkeyed, so such a call is not refused.
    """
    if not secrets:
        return ""
    text = json.dumps(dict(secrets), sort_keys=True, separators=(",", ":")).encode()
    if not secret_key and not given:
        return hashlib.sha256(b"dex-repeat-defaults\0" + text).hexdigest()
    fernet(secret_key)  # the same refusal as sealing when no key is configured
    assert secret_key is not None
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
