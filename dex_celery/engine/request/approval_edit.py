"""An approver's edit of a waiting call's arguments (S13.3, docs/guardrails.md).

The edit is the whole arguments object the call should run with. It passes the same checks as
a request (S9.3: a JSON object within the size limit, then the tool's own signature or schema,
`call_identity.identify`), so a bad edit raises `InvalidEdit` and nothing is stored. A secret
argument given as `***` keeps its sealed value; any other value is sealed anew (docs/secrets.md).
The record of the edit shows the arguments before and after by the one display rule.
"""

from __future__ import annotations

from dex_celery.engine.request.dispatch import GivenArguments, parse_arguments
from dex_celery.errors import DexError, InvalidEdit, InvalidRequest
from dex_celery.model.approval_binding import ApprovalEdit
from dex_celery.model.records import ToolCallRecord
from dex_celery.settings import Settings
from dex_celery.store.approval_binding import ArgumentsEdit
from dex_celery.store.values import arguments_json
from dex_celery.tools.call_identity import identify
from dex_celery.tools.redact import REDACTED, record_arguments, shown_arguments
from dex_celery.tools.sealing import seal, split_secrets, unseal
from dex_celery.tools.tool import Tool


def edited_arguments(
    record: ToolCallRecord,
    tool: Tool,
    edit: GivenArguments,
    *,
    by: str,
    now: float,
    settings: Settings,
) -> ArgumentsEdit | None:
    """The edit, validated and sealed, ready to store with the approval; None when it leaves
    the call as it is (the same arguments as the tool receives them). `InvalidEdit` otherwise
    refused."""
    try:
        given, _ = parse_arguments(edit, limit=settings.max_argument_bytes)
    except InvalidRequest as e:
        raise InvalidEdit(f"the edited arguments of {record.key} are refused: {e}") from e
    names = record.policy.secret_arguments
    kept = {n for n in names if given.get(n) == REDACTED}
    try:
        if kept:
            sealed = unseal(record.sealed_arguments, settings.secret_key)
            missing = sorted(kept - set(sealed))
            if missing:
                raise InvalidEdit(
                    f"the edited arguments of {record.key} keep secret {missing[0]!r} as "
                    f"{REDACTED}, but the call has no value for it; give one"
                )
            given.update({n: sealed[n] for n in kept})
        identity = identify(tool, given, settings.secret_key)
        shown, secrets = split_secrets(given, names)
        token = seal(secrets, settings.secret_key)
    except InvalidEdit:
        raise
    except DexError as e:
        raise InvalidEdit(f"the edited arguments of {record.key} are refused: {e}") from e
    if identity.fingerprint == record.arguments_digest:
        return None
    stored = arguments_json(shown)
    change = ApprovalEdit(
        by=by,
        at=now,
        before=record_arguments(record),
        after=shown_arguments(stored, names),
    )
    return ArgumentsEdit(stored, token, identity.fingerprint, change.to_json())
