"""`dex-celery audit`: the signed, hash-chained audit log (docs/audit.md, S13.4).

`keygen` makes a signing key; `verify` checks the database's chains and the live records
against them (or, with `--file`, an export or a prune's archive with the public key alone,
without the app or a database); `export` writes a signed export to stdout. A finding exits 1
with one `error:` line per class of finding (S13.4.3).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from dex_celery.audit.check import Findings
from dex_celery.audit.export import export, verify_file
from dex_celery.audit.keys import (
    Signer,
    Verifier,
    load_signer,
    load_verifier,
    write_private_key,
)
from dex_celery.audit.verify import verify_database
from dex_celery.cli.calls import emit_json
from dex_celery.cli.context import EXIT_REFUSED, DexContext, pass_context
from dex_celery.errors import AuditKeyError, InvalidRequest
from dex_celery.model.times import parse_since


@click.group("audit")
def audit() -> None:
    """The audit log: every decision, chained and signed (see docs/audit.md)."""


@audit.command("keygen")
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Write the new signing key to this file (made readable by its owner only; an "
    "existing file is refused). Point audit_key_file (DEX_AUDIT_KEY_FILE) at it.",
)
def keygen(out: Path) -> None:
    """Make a new Ed25519 signing key; print its public key (for audit_public_keys)."""
    signer = Signer.generate()
    write_private_key(out, signer)
    click.echo(f"wrote the signing key {signer.key_id} to {out}", err=True)
    click.echo(signer.public_text())


@audit.command("verify")
@click.option("--since", default=None, help="Check the entries since: 30d, 12h or an ISO time.")
@click.option(
    "--file",
    "file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Check an export or a prune's audit archive instead of the database (no app needed).",
)
@click.option(
    "--public-key",
    "public_key",
    default=None,
    help="Public key(s) to check signatures with (comma-separated keys or files); default: "
    "the app's audit_public_keys and its signing key's own.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@pass_context
def verify(
    ctx: DexContext, since: str | None, file: Path | None, public_key: str | None, as_json: bool
) -> None:
    """Check the chains (edits, deletions, insertions, reordering, gaps, signatures) and that
    every live call agrees with the chain's last word on it. Exit 1 on any finding."""
    given = Verifier.parse(public_key) if public_key else None
    if file is not None:
        if since is not None:
            raise InvalidRequest("--since applies to the database, not to --file")
        if given is None:
            raise AuditKeyError("--file needs --public-key: an export is checked offline")
        _report(verify_file(file, given), f"{file}", as_json)
        return
    cutoff = parse_since(since, option="--since") if since is not None else None
    dex = ctx.dex
    settings = dex.settings
    verifier = given or load_verifier(settings.audit_public_keys, dex.store.audit.signer)
    findings = verify_database(dex.store, verifier, cutoff)
    if verifier is None:
        click.echo("note: no audit key configured: chains checked, signatures not", err=True)
    _report(findings, "the database", as_json)


@audit.command("export")
@click.option("--session", "session_id", default=None, help="Export one session's entries.")
@click.option("--since", default=None, help="Export the entries since: 30d, 12h or an ISO time.")
@pass_context
def export_command(ctx: DexContext, session_id: str | None, since: str | None) -> None:
    """Write a signed export (JSON lines) to stdout, for `audit verify --file`."""
    if session_id is not None and since is not None:
        raise InvalidRequest("give --session or --since, not both")
    cutoff = parse_since(since, option="--since") if since is not None else None
    dex = ctx.dex
    signer = dex.store.audit.signer or load_signer(
        dex.settings.audit_key, dex.settings.audit_key_file
    )
    if signer is None:
        raise AuditKeyError(
            "an export is signed: set audit_key_file (DEX_AUDIT_KEY_FILE) or audit_key"
        )
    started = time.monotonic()
    count = export(dex.store, signer, sys.stdout, session_id=session_id, since=cutoff)
    click.echo(f"exported {count} entries in {time.monotonic() - started:.1f}s", err=True)


def _report(findings: Findings, what: str, as_json: bool) -> None:
    if as_json:
        emit_json(findings.as_dict())
    elif findings.ok:
        click.echo(
            f"audit verify: {what}: {findings.entries} entries in {findings.chains} chains, "
            "no finding"
        )
    for line in findings.lines():
        click.echo(f"error: {line}", err=True)
    if not findings.ok:
        click.get_current_context().exit(EXIT_REFUSED)
