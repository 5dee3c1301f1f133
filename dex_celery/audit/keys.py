"""The audit log's Ed25519 keys: the deployment's signing key and the public keys that verify.

A key is written as text: `ed25519-private:` or `ed25519-public:` then the 32 raw key bytes in
base64, so a key pasted into the wrong setting is refused, never misread. Settings name the
signing key by value (`audit_key`, `DEX_AUDIT_KEY`) or by file (`audit_key_file`); verifying
needs only public keys (`audit_public_keys`, or the signing key's own), so an auditor holds no
secret. A key's id is the first 16 hex digits of the SHA-256 of its public bytes: each signed
entry names the key that signed it, which is what lets a key be rotated (docs/audit.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from dex_celery.errors import AuditKeyError

PRIVATE_PREFIX = "ed25519-private:"
PUBLIC_PREFIX = "ed25519-public:"


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _raw(text: str, prefix: str, what: str) -> bytes:
    text = text.strip()
    if not text.startswith(prefix):
        raise AuditKeyError(f"{what} must start with {prefix!r} (made by `audit keygen`)")
    try:
        raw = base64.b64decode(text[len(prefix) :], validate=True)
    except (binascii.Error, ValueError):
        raise AuditKeyError(f"{what} is not base64 after {prefix!r}") from None
    if len(raw) != 32:
        raise AuditKeyError(f"{what} must hold 32 bytes, got {len(raw)}")
    return raw


@dataclass(frozen=True, slots=True)
class Signer:
    """The deployment's signing key (held by every process that appends)."""

    private: Ed25519PrivateKey
    key_id: str

    @classmethod
    def parse(cls, text: str) -> Signer:
        private = Ed25519PrivateKey.from_private_bytes(_raw(text, PRIVATE_PREFIX, "audit key"))
        return cls(private, key_id(private.public_key()))

    @classmethod
    def generate(cls) -> Signer:
        private = Ed25519PrivateKey.generate()
        return cls(private, key_id(private.public_key()))

    def sign(self, digest_hex: str) -> str:
        return base64.b64encode(self.private.sign(bytes.fromhex(digest_hex))).decode()

    def private_text(self) -> str:
        raw = self.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return PRIVATE_PREFIX + base64.b64encode(raw).decode()

    def public_text(self) -> str:
        return public_text(self.private.public_key())

    def verifier(self) -> Verifier:
        public = self.private.public_key()
        return Verifier({self.key_id: public})


def public_text(public: Ed25519PublicKey) -> str:
    return (
        PUBLIC_PREFIX
        + base64.b64encode(public.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    )


@dataclass(frozen=True, slots=True)
class Verifier:
    """Public keys by id: what `audit verify` checks signatures with."""

    keys: dict[str, Ed25519PublicKey]

    @classmethod
    def parse(cls, texts: str) -> Verifier:
        """Comma-separated public keys (or paths of files holding one), old keys included."""
        keys: dict[str, Ed25519PublicKey] = {}
        for part in (p.strip() for p in texts.split(",")):
            if not part:
                continue
            text = part if part.startswith(PUBLIC_PREFIX) else _read(Path(part), "public key")
            public = Ed25519PublicKey.from_public_bytes(_raw(text, PUBLIC_PREFIX, "public key"))
            keys[key_id(public)] = public
        if not keys:
            raise AuditKeyError("no public key given")
        return cls(keys)

    def merged(self, other: Verifier | None) -> Verifier:
        return self if other is None else Verifier({**self.keys, **other.keys})

    def check(self, digest_hex: str, signature: str | None, signed_by: str | None) -> str | None:
        """None when `signature` is `signed_by`'s signature of the digest; else what is wrong."""
        if not signature or not signed_by:
            return "not signed"
        public = self.keys.get(signed_by)
        if public is None:
            return f"signed by key {signed_by}, which is not among the public keys given"
        try:
            public.verify(base64.b64decode(signature), bytes.fromhex(digest_hex))
        except (InvalidSignature, binascii.Error, ValueError):
            return "signature does not match"
        return None


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise AuditKeyError(f"cannot read the {what} file {path}: {e.strerror}") from None


def load_signer(key: str | None, key_file: str | None) -> Signer | None:
    """The signing key the settings name (`audit_key` wins over `audit_key_file`); None if
    neither is set (entries are then chained but unsigned, and `audit verify` says so)."""
    if key:
        return Signer.parse(key)
    if key_file:
        return Signer.parse(_read(Path(key_file), "audit key"))
    return None


def load_verifier(public_keys: str | None, signer: Signer | None) -> Verifier | None:
    """The public keys the settings name, with the signing key's own."""
    given = Verifier.parse(public_keys) if public_keys else None
    if signer is None:
        return given
    return signer.verifier().merged(given)


def write_private_key(path: Path, signer: Signer) -> None:
    """A new key file readable by its owner only; an existing file is never overwritten."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise AuditKeyError(
            f"{path} exists: a key is never overwritten (rotate to a new file)"
        ) from None
    except OSError as e:
        raise AuditKeyError(f"cannot create {path}: {e.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(signer.private_text() + "\n")
