"""The SQL schema (SQLAlchemy Core). Alembic migrations are generated from this metadata.

Times are stored as Unix seconds (floats): deadlines are compared in SQL the same way on SQLite
and PostgreSQL, and they match the ledger's clock.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "pk": "pk_%(table_name)s",
    }
)

_id = BigInteger().with_variant(Integer(), "sqlite")

sessions = Table(
    "dex_sessions",
    metadata,
    Column("id", String(200), primary_key=True),
    Column("default_effect", String(32), nullable=True),
    Column("created_at", Float, nullable=False),
)

messages = Table(
    "dex_messages",
    metadata,
    Column("id", _id, primary_key=True, autoincrement=True),
    Column("session_id", String(200), nullable=False),
    Column("role", String(16), nullable=False),
    Column("text", Text, nullable=True),
    Column("tool_output", Text, nullable=True),
    Column("turn_id", String(200), nullable=True),
    Column("tool_call_id", String(200), nullable=True),
    Column("tool_name", String(200), nullable=True),
    Column("tool_arguments", Text, nullable=True),
    # The call a TOOL message reports; unique, so an outcome is appended once however many
    # writers race to record it.
    Column("call_key", String(620), nullable=True, unique=True),
    Column("created_at", Float, nullable=False),
    # A message copied from an agent framework's own history (docs/frameworks.md, "One
    # conversation"): its identity there, so a history seen again is not copied twice. NULL for
    # messages written through dex (TOOL outcomes, `send_user_message`), which are the ones a
    # framework is handed back.
    Column("mirror_key", String(64), nullable=True),
    Index("ix_dex_messages_session", "session_id", "id"),
    Index("uq_dex_messages_mirror", "session_id", "mirror_key", unique=True),
)

tool_calls = Table(
    "dex_tool_calls",
    metadata,
    Column("key", String(620), primary_key=True),
    Column("session_id", String(200), nullable=False),
    Column("turn_id", String(200), nullable=False),
    Column("tool_call_id", String(200), nullable=False),
    Column("tool_name", String(200), nullable=False),
    Column("arguments", Text, nullable=False),
    # The values of secret arguments, sealed (dex_celery/tools/sealing.py); `arguments` has `***`.
    Column("sealed_arguments", Text, nullable=True),
    Column("effect", String(32), nullable=False),
    Column("requires_approval", Integer, nullable=False),
    Column("policy", Text, nullable=False),
    Column("status", String(32), nullable=False),
    Column("error", Text, nullable=True),
    Column("result", Text, nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("attempt_log", Text, nullable=True),
    Column("late_result", Text, nullable=True),
    Column("ledger_epoch", String(64), nullable=True),
    # The claim of a `non_idempotent_write` / `unclassified` attempt, committed here before any
    # tool code runs: the system of record has the final word on "may this write run?", however
    # far Redis goes back in time (docs/ledger.md, "The write fence").
    Column("claim_fence", String(64), nullable=True),
    Column("claimed_attempt", Integer, nullable=True),
    Column("claimed_at", Float, nullable=True),
    Column("claimed_by", String(200), nullable=True),
    Column("requested_at", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
    Column("approval_deadline", Float, nullable=True),
    Column("decision", String(16), nullable=True),
    Column("decided_by", String(200), nullable=True),
    Column("decided_at", Float, nullable=True),
    Column("decision_note", Text, nullable=True),
    # The repeat guard (S5.4, `store/repeat_guards.py`): the call's digest of tool and canonical
    # arguments (set for guarded calls), and, for a call the guard held back, the earlier call
    # it repeats and why it waits.
    Column("repeat_digest", String(64), nullable=True),
    Column("repeat_of", String(620), nullable=True),
    Column("repeat_reason", Text, nullable=True),
    # The request's trace context (the propagator's headers as JSON, `engine/tracing.py`): a
    # retry or record made later by the sweeper joins the request's trace. Written by the
    # request's INSERT itself; NULL when the requester did not trace.
    Column("trace_context", Text, nullable=True),
    # Write budgets (S13.1, `model/budgets.py`): the charges the call drew on as fixed at its
    # request (JSON), and why it waits for a person (or was rejected) when one had too little.
    Column("budgets", Text, nullable=True),
    Column("budget_reason", Text, nullable=True),
    # Approvals bound to what was approved (S13.3, docs/guardrails.md): set only for calls that
    # wait for a person. The digests of the validated arguments and of the tool's definition
    # (`tools/definition_digest.py`), the binding of both an approval was given for (consumed
    # once by the worker's claim, which stamps `approval_used_at`), an approver's edit of the
    # arguments (JSON: by, at, before, after; secrets `***`), and why a call waits again.
    Column("definition_digest", String(64), nullable=True),
    Column("arguments_digest", String(64), nullable=True),
    Column("approved_digest", String(64), nullable=True),
    Column("approval_used_at", Float, nullable=True),
    Column("approval_edit", Text, nullable=True),
    Column("rewait_reason", Text, nullable=True),
    # The text of the tool's preview function for a call waiting for approval, or "preview
    # unavailable: ..." (docs/guardrails.md, "Previews"); written by the worker that ran it.
    Column("preview", Text, nullable=True),
    Index("ix_dex_tool_calls_session", "session_id", "requested_at"),
    # The sweeper's scans of calls in flight and of approvals past their deadline read partial
    # indexes that hold only rows in those statuses: their size, and so the sweep's cost,
    # follows the calls not yet ended, never the size of history.
    Index(
        "ix_dex_tool_calls_in_flight",
        "requested_at",
        "key",
        sqlite_where=text("status = 'pending'"),
        postgresql_where=text("status = 'pending'"),
    ),
    Index(
        "ix_dex_tool_calls_awaiting",
        "approval_deadline",
        sqlite_where=text("status = 'awaiting_approval'"),
        postgresql_where=text("status = 'awaiting_approval'"),
    ),
    # The calls held back by the repeat guard, found by the earlier call they repeat when its
    # late result arrives or it is reconciled; only those rows are in it.
    Index(
        "ix_dex_tool_calls_repeat_of",
        "repeat_of",
        sqlite_where=text("repeat_of IS NOT NULL"),
        postgresql_where=text("repeat_of IS NOT NULL"),
    ),
)

# Ended calls counted as they end, per tool, effect class, terminal status and writer shard: what
# the metrics read instead of a grouped scan of every call, so a scrape costs the same at any
# size of history (`store/counts.py`). Each write that ends calls adds to its rows in the same
# transaction (one upsert per group of a batch); `shard` spreads concurrent writers (by process)
# over rows, so they do not queue on one row's lock; a read sums the shards. Open calls
# (`pending`, `awaiting_approval`) are not kept here: they are counted from their partial indexes.
call_counts = Table(
    "dex_call_counts",
    metadata,
    Column("tool_name", String(200), primary_key=True),
    Column("effect", String(32), primary_key=True),
    Column("status", String(32), primary_key=True),
    Column("shard", Integer, primary_key=True, autoincrement=False),
    Column("calls", BigInteger, nullable=False),
    Column("attempts", BigInteger, nullable=False),
    Column("retries", BigInteger, nullable=False),
)

# The repeat guard's slots (S5.4): per session and digest of tool + canonical arguments, the call
# that last passed the guard. The primary key is the guard's one indexed lookup, so its cost does
# not grow with history, and the insert or compare-and-set of `holder` is what lets only one of
# two identical requests racing in two processes pass.
repeat_guards = Table(
    "dex_repeat_guards",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("digest", String(64), primary_key=True),
    Column("holder", String(620), nullable=False),
)

# One row per `outcome_unknown` call the reconcile beat job has surfaced (S8.4): it is what makes
# "surfaced once" and "reported once" hold across runs and across two runners at once.
# `state` is `open` until the real outcome was sent to the session, then `reported`.
unknown_outcomes = Table(
    "dex_unknown_outcomes",
    metadata,
    Column("call_key", String(620), primary_key=True),
    Column("session_id", String(200), nullable=False),
    Column("tool_name", String(200), nullable=False),
    Column("state", String(16), nullable=False),
    Column("surfaced_at", Float, nullable=False),
    Column("checks", Integer, nullable=False, default=0),
    Column("last_checked_at", Float, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("report", Text, nullable=True),
    Column("reported_at", Float, nullable=True),
    # What the check said became of the call, where it could tell (`engine/upkeep/reconcile.py`):
    # `went_through` or `did_not_run`; it settles the call's write budgets (S13.1).
    Column("verdict", String(16), nullable=True),
    # The runs read only open rows of tools that have a check.
    Index("ix_dex_unknown_outcomes_open", "state", "tool_name"),
)

# Each call's charge to each write budget scope (S13.1), written with the call: after Redis went
# back in time or lost a scope, the scope is counted again from these rows and their calls'
# statuses (`store/budgets.py`), conservatively. The primary key is that count's one lookup.
budget_charges = Table(
    "dex_budget_charges",
    metadata,
    Column("budget", String(64), primary_key=True),
    Column("scope", String(220), primary_key=True),
    Column("call_key", String(620), primary_key=True),
    Column("amount", BigInteger, nullable=False),
    Column("requested_at", Float, nullable=False),
)

# The ledger this database belongs to (one row). A process whose Redis holds another ledger
# refuses to act on these calls (docs/ledger.md, "One database, one ledger").
ledger_bindings = Table(
    "dex_ledger_binding",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("ledger_id", String(64), nullable=False),
    Column("location", String(600), nullable=False),
    Column("bound_at", Float, nullable=False),
    # What kind of Redis held it (`bindings.LedgerOrigin`): a private one of `dex-celery dev`
    # or `demo` may be replaced by the next such stack; a configured one only by an operator.
    Column("origin", String(16), nullable=False, server_default="configured"),
    Column("origin_host", String(255), nullable=True),
)

# Who began each session through a network door (`dex-celery mcp`): the identity's name. A call
# key is not a capability (S11.3): a caller may request or follow calls only of sessions it owns
# (`store/owners.py`). Sessions begun in-process (the Python API) have no row here.
session_owners = Table(
    "dex_session_owners",
    metadata,
    Column("session_id", String(200), primary_key=True),
    Column("owner", String(200), nullable=False),
    Column("created_at", Float, nullable=False),
)

# The MCP servers registered with `dex.add_mcp_server` and their tool lists as last fetched
# (`store/mcp_catalog.py`): requesters, the CLI and the web app read tools from here and never
# start a server process. `tools` is the JSON list of definitions (name, description, input
# schema, annotations, digest); NULL until the list was first fetched. `last_error` is the last
# failure to fetch it (cleared by the next success).
mcp_servers = Table(
    "dex_mcp_servers",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("location", String(600), nullable=False),
    Column("tools", Text, nullable=True),
    Column("fetched_at", Float, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("last_error_at", Float, nullable=True),
)

# The definition of each MCP tool a person (or the first fetch) accepted: its digest. A tool
# whose current digest differs waits for approval on every call until someone accepts the new
# definition (`dex-celery mcp-servers accept`).
mcp_tool_pins = Table(
    "dex_mcp_tool_pins",
    metadata,
    Column("server", String(200), primary_key=True),
    Column("tool", String(200), primary_key=True),
    Column("digest", String(64), nullable=False),
    Column("accepted_at", Float, nullable=False),
    Column("accepted_by", String(200), nullable=False),
)

# The audit log (docs/audit.md, S13.4): every decision as an entry of its writer's hash chain.
# A writer is one thread of one process (`audit/chain.py`); `seq` numbers its entries from 1 and
# each entry's `hash` covers the one before it (`prev`), so an edit, a deletion, an insertion or
# a reordering breaks the chain. The last entry of each transaction carries an Ed25519
# `signature` of its hash, made with the key `key_id` names. `id` is storage order only: nothing
# trusts it. Entries hold no secret values (the display rule, docs/secrets.md).
audit_log = Table(
    "dex_audit_log",
    metadata,
    Column("id", _id, primary_key=True, autoincrement=True),
    Column("writer", String(40), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("at", Float, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("call_key", String(620), nullable=True),
    Column("session_id", String(200), nullable=True),
    Column("body", Text, nullable=False),
    Column("prev", String(64), nullable=False),
    Column("hash", String(64), nullable=False),
    Column("signature", String(100), nullable=True),
    Column("key_id", String(16), nullable=True),
    Index("uq_dex_audit_log_chain", "writer", "seq", unique=True),
    Index("ix_dex_audit_log_call", "call_key"),
    Index("ix_dex_audit_log_at", "at"),
)

# Each writer's chain head, signed, upserted in the transaction that appends (one row per
# writer, written only by it: no lock is shared between writers). A chain whose last entry is
# not its head was cut or extended behind the writer's back.
audit_heads = Table(
    "dex_audit_heads",
    metadata,
    Column("writer", String(40), primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("hash", String(64), nullable=False),
    Column("at", Float, nullable=False),
    Column("signature", String(100), nullable=True),
    Column("key_id", String(16), nullable=True),
)

# Where `history prune` cut each chain: the last removed entry's seq and hash, signed by the
# pruning process; the chain left in SQL continues from it, and the archive ends with it.
audit_checkpoints = Table(
    "dex_audit_checkpoints",
    metadata,
    Column("writer", String(40), primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("hash", String(64), nullable=False),
    Column("cut_at", Float, nullable=False),
    Column("signature", String(100), nullable=True),
    Column("key_id", String(16), nullable=True),
)

# The write freeze (S13.2, `store/freezes.py`): one row per freeze an operator began, kept after
# its thaw as the durable record of who stopped writes, when and why. Rows with `thawed_at` NULL
# are the freezes in force; the ledger holds a copy of them for the claim (`ledger/freeze.py`)
# that is re-asserted from here whenever Redis may have lost it. `tool` is a tool's name or `*`.
write_freezes = Table(
    "dex_write_freezes",
    metadata,
    Column("id", _id, primary_key=True, autoincrement=True),
    Column("tool", String(200), nullable=False),
    Column("mode", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("frozen_by", String(200), nullable=False),
    Column("frozen_at", Float, nullable=False),
    Column("thawed_by", String(200), nullable=True),
    Column("thawed_at", Float, nullable=True),
    Index(
        "ix_dex_write_freezes_active",
        "tool",
        sqlite_where=text("thawed_at IS NULL"),
        postgresql_where=text("thawed_at IS NULL"),
    ),
)

# The calls a freeze held for approval: which freeze, when, and whether an attempt of the call
# had reached a worker before (a retried idempotent write), so that its reopening counts its
# attempts as having reached one (S4.2). A thaw releases the rows of calls still waiting, in
# request order; the row stays as the record of the hold.
freeze_holds = Table(
    "dex_freeze_holds",
    metadata,
    Column("call_key", String(620), primary_key=True),
    Column("freeze_id", BigInteger, nullable=False),
    Column("held_at", Float, nullable=False),
    Column("may_have_run", Integer, nullable=False, default=0),
    Column("released_at", Float, nullable=True),
    Index("ix_dex_freeze_holds_freeze", "freeze_id"),
)
