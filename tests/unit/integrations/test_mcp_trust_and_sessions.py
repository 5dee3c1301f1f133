"""Trust in an MCP server's hints, the destructive-hint approval rule (S1.3, S1.4), and the
session pool's fork reset: pure parts, no server process."""

from __future__ import annotations

import os

import mcp_types
import pytest

from dex_celery import EffectClass, Settings, ToolPolicy, forks
from dex_celery.errors import ConfigurationError
from dex_celery.integrations.mcp import sessions as mcp_sessions
from dex_celery.integrations.mcp.client import (
    UNTRUSTED_HINTS_KEY,
    McpServer,
    McpTrust,
    _dex_tool,
    hints_with_defaults,
)
from dex_celery.model.policy import EffectSource, approval_by_default, resolve_policy

SERVER = McpServer("fs", command=("true",))
SETTINGS = Settings()


def _listed(**hints: bool) -> mcp_types.Tool:
    return mcp_types.Tool(
        name="write_file",
        input_schema={"type": "object"},
        annotations=mcp_types.ToolAnnotations.model_validate(hints) if hints else None,
    )


def test_destructive_idempotent_write_asks_for_approval_but_is_still_retried() -> None:
    """`write_file`, `git_reset`: destructive and idempotent. Retrying is safe (the class says
    so); running with nobody asked is not (S1.3)."""
    tool = _dex_tool(SERVER, _listed(idempotentHint=True), "", None, trusted=True)
    snapshot = resolve_policy(tool.policy, tool.annotations, None, SETTINGS)
    assert snapshot.effect is EffectClass.IDEMPOTENT_WRITE
    assert snapshot.requires_approval  # destructiveHint defaults to true in MCP
    assert snapshot.max_attempts == SETTINGS.max_attempts > 1
    # Not destructive: no approval by default.
    quiet = _dex_tool(
        SERVER, _listed(idempotentHint=True, destructiveHint=False), "", None, trusted=True
    )
    assert not resolve_policy(quiet.policy, quiet.annotations, None, SETTINGS).requires_approval
    # A policy that says no approval wins (S1.4).
    allowed = ToolPolicy(requires_approval=False)
    assert not resolve_policy(allowed, tool.annotations, None, SETTINGS).requires_approval
    # A read's destructive hint means nothing (MCP: only meaningful when not read-only).
    assert not approval_by_default(EffectClass.READ, {"destructiveHint": True})


def test_an_untrusted_servers_hints_decide_nothing() -> None:
    """The default trust: a read-only hint does not make a retried read; the tool is
    `unclassified` (one attempt, approval) unless a policy says otherwise."""
    tool = _dex_tool(SERVER, _listed(readOnlyHint=True), "", None, trusted=False)
    snapshot = resolve_policy(tool.policy, tool.annotations, None, SETTINGS)
    assert (snapshot.effect, snapshot.effect_source) == (
        EffectClass.UNCLASSIFIED,
        EffectSource.NONE,
    )
    assert snapshot.max_attempts == 1 and snapshot.requires_approval
    assert tool.annotations[UNTRUSTED_HINTS_KEY] == hints_with_defaults(
        mcp_types.ToolAnnotations(read_only_hint=True)
    )
    declared = ToolPolicy(effect=EffectClass.READ)
    assert resolve_policy(declared, tool.annotations, None, SETTINGS).effect is EffectClass.READ
    trusted = _dex_tool(SERVER, _listed(readOnlyHint=True), "", None, trusted=True)
    assert resolve_policy(trusted.policy, trusted.annotations, None, SETTINGS).effect is (
        EffectClass.READ
    )


def test_trust_values_are_checked() -> None:
    assert McpTrust.parse("annotations") is McpTrust.ANNOTATIONS
    with pytest.raises(ConfigurationError, match="unknown MCP trust"):
        McpTrust.parse("yes")


def test_a_forked_child_gets_an_empty_pool_and_keeps_the_parents() -> None:
    """The parent's sessions (its server processes) never cross a fork: the child starts with a
    new pool, and the inherited one is kept referenced, not closed."""
    parent = mcp_sessions.pool()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        ok = mcp_sessions.pool() is not parent and parent in forks._inherited
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert mcp_sessions.pool() is parent
