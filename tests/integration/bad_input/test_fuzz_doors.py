"""Hypothesis fuzz of every door's bad input (S9.3), against real redis-server, SQLite and
PostgreSQL, a real prefork worker and real `dex-celery` processes: deep nesting, lone
surrogates, NUL, integers beyond 64 bits, NaN and infinities, odd Python types, unicode and
separators in session/turn/call ids, very long strings (`tests/support/fuzz.py`).

Whatever comes in, each door answers in its own typed way: the Python API (`DexClient`,
`AsyncDexClient`) raises a `DexError`; the CLI prints one `error:` line and exits 1; the MCP
server answers a tool error (or, for a request its JSON-RPC layer cannot parse, a JSON-RPC
error); the web app a 4xx page. A refused input leaves every SQL row, ledger hash, index and
the events stream as they were, and afterwards the worker still serves a normal call.

The budget is the `fuzz` Hypothesis profile (tests/conftest.py): a fixed number of examples
per door and no deadline, so the whole file stays bounded in CI.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from devtools.processes import Worker
from devtools.toolapp import LOG_ENV
from dex_celery import CallStatus, Dex
from dex_celery.client.dex_client import AsyncDexClient
from dex_celery.errors import DexError
from tests.support.bad_input import state
from tests.support.databases import ON_BOTH_DATABASES
from tests.support.fuzz import fuzz_settings, hostile_text, ids, odd_values, requests, valid_ids

pytestmark = pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")

#: Tool names as a caller might send them: real ones, hostile text, not text at all.
tool_names = st.one_of(
    st.sampled_from(["echo", "guarded_write"]), hostile_text, st.none(), st.integers()
)


def _served_after(dex: Dex, start_worker: Callable[..., Worker]) -> None:
    """The worker keeps serving: a normal call after the fuzz succeeds."""
    start_worker()
    client = dex.client()
    normal = client.request_call("after-fuzz", "t1", "c1", "echo", {"x": 1})
    (done,) = client.wait([normal.key], timeout=90)
    assert done.status is CallStatus.SUCCEEDED, done


@ON_BOTH_DATABASES
def test_fuzzed_requests_and_decisions_through_the_python_api(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    client = dex.client()
    r = redis.Redis.from_url(env["DEX_REDIS_URL"], decode_responses=True)
    log_dir = Path(env[LOG_ENV])
    seen: Counter[str] = Counter()

    @fuzz_settings()
    @given(parts=requests(("echo", "guarded_write")), use_async=st.booleans())
    def request(parts: dict[str, Any], use_async: bool) -> None:
        args = (parts["session"], parts["turn"], parts["call"], parts["tool"], parts["arguments"])
        before = state(dex, r, log_dir)
        try:
            if use_async:
                record = asyncio.run(AsyncDexClient(dex).request_call(*args))
            else:
                record = client.request_call(*args)
        except DexError:
            assert state(dex, r, log_dir) == before  # nothing stored half-way
            seen["refused"] += 1
            return
        seen["recorded"] += 1
        assert client.get_call(record.key).arguments == record.arguments

    @fuzz_settings()
    @given(
        key=st.one_of(st.none(), st.none(), ids),
        approver=st.one_of(valid_ids, valid_ids, ids, hostile_text),
        note=st.one_of(st.none(), st.text(max_size=30), hostile_text, odd_values),
        action=st.sampled_from(["approve", "reject"]),
    )
    def decide(key: Any, approver: Any, note: Any, action: str) -> None:
        # A call of its own waits for each decision (None: decide that one).
        if key is None:
            key = client.request_call("s1", "t1", uuid.uuid4().hex, "guarded_write", {}).key
        before = state(dex, r, log_dir)
        try:
            getattr(client, action)(key, approver, note)
        except DexError:
            assert state(dex, r, log_dir) == before
            seen["decision refused"] += 1
            return
        seen["decided"] += 1

    request()
    decide()
    assert min(seen[k] for k in ("refused", "recorded", "decision refused", "decided")) > 0, seen
    _served_after(dex, start_worker)
