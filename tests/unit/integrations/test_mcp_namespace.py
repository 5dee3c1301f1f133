"""MCP sessions namespaced by the authenticated principal (docs/security.md): no caller can
name a session another caller's calls go to, whatever ids it sends; pure parts, no server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dex_celery.access import Identity, local_identity
from dex_celery.errors import InvalidId
from dex_celery.integrations.mcp.namespace import in_a_namespace, namespace_of, scoped_session
from dex_celery.model.ids import MAX_ID_LENGTH
from tests.support.inputs.fuzz import fuzz_settings

#: Principals whose names read alike: kinds apart, case, characters the tag does not show.
names = st.sampled_from(["alice", "Alice", "alice.x", "alice x", "alice:x", "ali/ce", "a" * 90])
principals = st.builds(
    lambda name, via: Identity(name, via=via), names, st.sampled_from(["token", "basic", "session"])
)
session_ids = st.one_of(
    st.text(min_size=1, max_size=60),
    st.sampled_from(["desk", "desk.alice", "user-alice-000000000000:desk", "a:b"]),
    principals.map(lambda p: f"{namespace_of(p)}:desk"),
)


def _scoped(identity: Identity, session_id: str) -> str | None:
    try:
        return scoped_session(identity, session_id)
    except InvalidId:
        return None


@fuzz_settings()
@given(principals, principals, session_ids, session_ids)
def test_two_principals_never_reach_one_session(
    one: Identity, other: Identity, first: str, second: str
) -> None:
    mine, theirs = _scoped(one, first), _scoped(other, second)
    same_principal = namespace_of(one) == namespace_of(other)
    if mine is not None and theirs is not None and not same_principal:
        assert mine != theirs
    if mine is not None:
        assert in_a_namespace(mine)
        assert scoped_session(one, mine) == mine  # the key given back is the same call


def test_a_person_and_a_token_of_one_name_are_two_principals() -> None:
    person, token = Identity("ci", via="basic"), Identity("ci", via="token")
    assert namespace_of(person) == namespace_of(Identity("ci", via="session"))
    assert namespace_of(person) != namespace_of(token)
    assert scoped_session(token, scoped_session(person, "desk") or "") is None


def test_the_local_caller_keeps_its_ids_but_not_a_principals() -> None:
    """Over stdio (and loopback without credentials) `--session desk` is `desk`; a session in
    an authenticated principal's namespace is not the local caller's to begin."""
    local = local_identity()
    assert namespace_of(local) is None
    assert scoped_session(local, "desk") == "desk"
    alices = scoped_session(Identity("alice", via="token"), "desk")
    assert alices is not None and scoped_session(local, alices) is None


def test_an_id_too_long_once_prefixed_is_a_typed_error() -> None:
    with pytest.raises(InvalidId, match="namespace"):
        scoped_session(Identity("alice", via="token"), "x" * MAX_ID_LENGTH)
