"""Secret argument values: stored sealed, opened only in the worker, scrubbed from every text.

At request time the values of the arguments a policy names in `secret_arguments` are taken out
of the arguments: SQL (calls and messages), snapshots, the CLI and the broker message carry the
arguments with those values replaced by `***`, and the values themselves travel and rest only
as one Fernet token (AES-128-CBC + HMAC-SHA256) in `tool_calls.sealed_arguments` and in the
message's `sealed` field. The Fernet key is derived from the `secret_key` setting; only a
process that has it (the requester, to seal; the worker, to open) can read the values.

Tool code may still put a secret into what it returns or raises (`int(api_token)`); a `Scrubber`
built from the opened values replaces each exact value in the error text, the result, the late
result and the worker's log lines before they leave the worker.

A secret argument may be any JSON value. It is sealed whole (the stored arguments show the whole
value as `***`), and the scrubber looks for each of its leaves (every string and number inside
its dicts and lists, at any depth), not only for the whole value's text: a tool that puts
`credentials["password"]` into its error must not leak it because the dict as a whole was not
in the text. One length rule for every leaf, top-level or nested: `MIN_SCRUB_LENGTH`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from cryptography.fernet import Fernet, InvalidToken

from dex_celery.errors import SealError, SecretKeyMissing
from dex_celery.tools.redact import REDACTED

#: Values shorter than this are not scrubbed from texts: replacing every "1" or "ok" in an error
#: message would destroy it and protect nothing.
MIN_SCRUB_LENGTH = 4


def fernet(secret_key: str | None) -> Fernet:
    """The Fernet of a `secret_key` setting: any string, stretched to a 32-byte key by SHA-256."""
    if not secret_key:
        raise SecretKeyMissing(
            "this call has secret arguments but no secret_key is set (DEX_SECRET_KEY); the "
            "values would otherwise be stored in clear. Set the same secret_key on requesters "
            "and workers."
        )
    digest = hashlib.sha256(secret_key.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def split_secrets(
    arguments: Mapping[str, Any], names: Iterable[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(arguments with the named values replaced by `***`, the named values)."""
    secret = {n: arguments[n] for n in names if n in arguments}
    shown = {k: (REDACTED if k in secret else v) for k, v in arguments.items()}
    return shown, secret


def seal(values: Mapping[str, Any], secret_key: str | None) -> str | None:
    """One token holding every secret value of a call; None when there is nothing to hide."""
    if not values:
        return None
    return fernet(secret_key).encrypt(json.dumps(dict(values)).encode()).decode()


def unseal(token: str | None, secret_key: str | None) -> dict[str, Any]:
    if not token:
        return {}
    try:
        raw = fernet(secret_key).decrypt(token.encode())
    except InvalidToken:
        raise SealError(
            "the secret arguments of this call were sealed with another secret_key"
        ) from None
    value = json.loads(raw)
    return dict(value) if isinstance(value, dict) else {}


def open_arguments(
    shown: Mapping[str, Any], token: str | None, secret_key: str | None
) -> dict[str, Any]:
    """The arguments the tool gets: the stored ones with the sealed values put back."""
    return {**shown, **unseal(token, secret_key)}


class Scrubber:
    """Replaces exact secret values, and every leaf of a secret dict or list, in texts and JSON
    values with `***`."""

    def __init__(self, secrets: Mapping[str, Any] | None = None) -> None:
        needles: set[str] = set()
        for value in (secrets or {}).values():
            for leaf in (value, *leaves(value)):
                for text in _forms(leaf):
                    if len(text) >= MIN_SCRUB_LENGTH:
                        needles.add(text)
        # Longest first, so a value containing another is replaced whole.
        self._needles = sorted(needles, key=len, reverse=True)
        self._exact = frozenset(needles)

    def __bool__(self) -> bool:
        return bool(self._needles)

    def text(self, text: str) -> str:
        for needle in self._needles:
            if needle in text:
                text = text.replace(needle, REDACTED)
        return text

    def value(self, value: Any) -> Any:
        """A copy of a JSON-like value with secrets removed from every string (keys included)."""
        if not self._needles:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            # A secret number returned as a number: `"pin": 7351902468` is a leaf too.
            return REDACTED if str(value) in self._exact else value
        if isinstance(value, Mapping):
            return {self.value(k): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value


def leaves(value: Any) -> list[Any]:
    """The strings and numbers inside a JSON-like value, at any depth (dict values, list and
    tuple items); the value itself when it is one. Dict keys are names, not secrets."""
    if isinstance(value, Mapping):
        return [leaf for v in value.values() for leaf in leaves(v)]
    if isinstance(value, list | tuple | set | frozenset):
        return [leaf for v in value for leaf in leaves(v)]
    if isinstance(value, bool) or value is None:
        return []
    return [value] if isinstance(value, str | int | float) else []


def _forms(value: Any) -> list[str]:
    """How a value may show up in a text: as itself, its repr, and its JSON encoding."""
    if isinstance(value, str):
        return [value, repr(value)[1:-1], json.dumps(value)[1:-1]]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int | float):
        return [str(value)]
    return [json.dumps(value, sort_keys=True), json.dumps(value), str(value)]
