"""A request that raises tells the truth about its calls (docs/semantics.md, S11.2).

The request commits its calls in SQL before it opens them in the Redis ledger. When the ledger
then refuses (out of memory) or is gone (killed), the calls are recorded and the sweeper will
start them, so the error must say exactly that, and asking again with the same ids must follow
the same call: the write runs once. Real redis-servers (one with a small `maxmemory` and
`noeviction`, one SIGKILLed), a real prefork worker, and the tool's own side-effect log as the
witness of how often each write ran.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from devtools.processes import RedisServer, Worker
from dex_celery import (
    BackendUnavailable,
    CallRecordedNotStarted,
    CallRequest,
    CallStatus,
    Dex,
    DexError,
    LedgerError,
    RequestInFlight,
)
from dex_celery.backend_errors import driver_cause
from dex_celery.engine.request.opening import Opener
from dex_celery.engine.steps import Steps
from dex_celery.ledger.ledger import Ledger
from tests.support.faults.crash import count_calls, lines, wait_finished
from tests.support.faults.request_truth import (
    dex_on,
    fill_until_out_of_memory,
    small_redis,
    sweeping,
)

pytestmark = pytest.mark.crash

WRITE = "slow_non_idempotent_write"


def assert_truthful(error: DexError, keys: tuple[str, ...]) -> None:
    """The error of a request whose calls are recorded: its type, its keys and its words."""
    assert isinstance(error, CallRecordedNotStarted), f"{type(error).__name__}: {error}"
    assert isinstance(error, RequestInFlight)
    assert not isinstance(error, BackendUnavailable), "must not read as 'nothing changed'"
    assert error.keys == keys
    assert [r.key for r in error.records] == list(keys)
    text = str(error)
    assert "recorded" in text
    assert "same session, turn and tool-call ids" in text
    assert "never runs it twice" in text
    assert "nothing" not in text.lower()
    for key in keys:
        assert key in text


def assert_ran_once_each(dex: Dex, keys: list[str]) -> None:
    for key in keys:
        done = wait_finished(dex, key, timeout=90)
        assert done.status is CallStatus.SUCCEEDED, (key, done.status, done.error)
        assert [a for a, _pid, _k in lines(key, "start")] == [1], (key, lines(key, "start"))
    assert count_calls(dex) == len(keys)


def test_ledger_out_of_memory_the_request_says_recorded_and_the_same_ids_run_once(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    with small_redis(tmp_path) as server:
        own, own_env = dex_on(env, server)
        client = own.client()
        fillers = fill_until_out_of_memory(server)
        key = "s1/t1/c1"

        with pytest.raises(DexError) as raised:
            client.request_call("s1", "t1", "c1", WRITE, {"seconds": 0})
        assert_truthful(raised.value, (key,))
        assert isinstance(driver_cause(raised.value), DexError | redis.RedisError)
        record = own.store.get_call(key)
        assert record is not None and record.status is CallStatus.PENDING

        redis.Redis.from_url(server.url).delete(*fillers)
        start_worker(extra_env=own_env)
        with sweeping(own):
            again = client.request_call("s1", "t1", "c1", WRITE, {"seconds": 0})
            assert again.key == key
            assert_ran_once_each(own, [key])


def test_ledger_out_of_memory_in_a_batch_every_call_is_named_and_runs_once(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    with small_redis(tmp_path) as server:
        own, own_env = dex_on(env, server)
        client = own.client()
        # One call recorded and started before memory runs out, then a batch of three that
        # repeats it (same ids: the same call, nothing to start) and adds two new ones.
        first = client.request_call("s1", "t1", "c0", WRITE, {"seconds": 0})
        fillers = fill_until_out_of_memory(server)
        batch = [CallRequest("s1", "t1", f"c{i}", WRITE, {"seconds": 0}) for i in range(3)]

        with pytest.raises(DexError) as raised:
            client.request_calls(batch)
        keys = tuple(f"s1/t1/c{i}" for i in range(3))
        assert_truthful(raised.value, keys)
        assert isinstance(driver_cause(raised.value), LedgerError | DexError | redis.RedisError)
        assert "s1/t1/c1, s1/t1/c2 are recorded, but could not be started" in str(raised.value)
        assert "tool call s1/t1/c0 recorded before" in str(raised.value)

        redis.Redis.from_url(server.url).delete(*fillers)
        start_worker(extra_env=own_env)
        with sweeping(own):
            again = client.request_calls(batch)
            assert [r.key for r in again] == list(keys)
            assert again[0].key == first.key
            assert_ran_once_each(own, list(keys))


def test_redis_killed_right_after_a_request_the_next_one_says_recorded_and_runs_once(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    server = RedisServer(tmp_path / "killed-redis").start()
    try:
        own, own_env = dex_on(env, server)
        client = own.client()
        client.request_call("s1", "t1", "c1", WRITE, {"seconds": 0})
        server.kill()  # SIGKILL, no snapshot: it comes back empty

        with pytest.raises(DexError) as raised:
            client.request_call("s1", "t1", "c2", WRITE, {"seconds": 0})
        assert_truthful(raised.value, ("s1/t1/c2",))
        record = own.store.get_call("s1/t1/c2")
        assert record is not None and record.status is CallStatus.PENDING

        server.start()
        start_worker(extra_env=own_env)
        with sweeping(own):
            again = client.request_call("s1", "t1", "c2", WRITE, {"seconds": 0})
            assert again.key == "s1/t1/c2"
            assert_ran_once_each(own, ["s1/t1/c1", "s1/t1/c2"])
    finally:
        server.kill()


@pytest.mark.parametrize("path", ["open-publishes", "publish-after-open"])
def test_redis_killed_between_the_publishes_of_a_batch_names_every_call_and_each_runs_once(
    dex: Dex,
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
) -> None:
    """Redis dies after the first call of a batch is opened and published, before the others
    are. `open-publishes`: the broker is the ledger's Redis, each open script publishes its own
    message and Redis dies after the first script of the batch's pipeline ran
    (docs/ledger.md, "Opening a call"). `publish-after-open`: a broker elsewhere (as far as the
    dispatcher can tell), every call opened, Redis killed after the first publish."""
    server = RedisServer(tmp_path / "killed-redis").start()
    try:
        own, own_env = dex_on(env, server)
        client = own.client()
        published: list[str] = []
        if path == "open-publishes":
            real_run_many = Ledger._run_many

            def first_script_then_kill(
                self: Ledger, name: str, calls: list[tuple[Any, Any]]
            ) -> list[dict[str, str]]:
                if name != "open" or len(calls) < 2:
                    return real_run_many(self, name, calls)
                assert len(calls[0][0]) > 5, "the open carries its message"
                replies = real_run_many(self, name, calls[:1])
                published.append(str(calls[0][1][0]))
                server.kill()  # between the scripts of the batch's pipeline
                return replies + real_run_many(self, name, calls[1:])

            def no_publish(self: Steps, message: Any, **kwargs: Any) -> None:
                raise AssertionError(f"{message.key} published after its open")

            hooks = {
                (Ledger, "_run_many"): first_script_then_kill,
                (Steps, "publish"): no_publish,
            }
        else:
            real_publish = Steps.publish

            def publish_then_kill(self: Steps, message: Any, **kwargs: Any) -> None:
                real_publish(self, message, **kwargs)
                published.append(message.key)
                if len(published) == 1:
                    server.kill()  # the first call is opened and published, the others opened

            def elsewhere(self: Opener, messages: Any, producer: Any) -> None:
                return None

            hooks = {
                (Steps, "publish"): publish_then_kill,
                (Opener, "_captured"): elsewhere,
            }

        batch = [CallRequest("s2", "t1", f"c{i}", WRITE, {"seconds": 0}) for i in range(3)]
        with monkeypatch.context() as patched, pytest.raises(DexError) as raised:
            for (owner, name), hook in hooks.items():
                patched.setattr(owner, name, hook)
            client.request_calls(batch)
        keys = tuple(f"s2/t1/c{i}" for i in range(3))
        assert_truthful(raised.value, keys)
        assert published == ["s2/t1/c0"]

        server.start()
        start_worker(extra_env=own_env)
        with sweeping(own):
            assert [r.key for r in client.request_calls(batch)] == list(keys)
            assert_ran_once_each(own, list(keys))
    finally:
        server.kill()


def test_an_approval_while_redis_is_out_of_memory_returns_the_approved_call_which_runs_once(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    """The approval is committed before the call is announced and opened in Redis: a refusal
    there must not read as a failed approval (the approver would approve again, or believe the
    call will not run). The sweeper starts the approved call once Redis has room."""
    with small_redis(tmp_path) as server:
        own, own_env = dex_on(env, server)
        client = own.client()
        key = client.request_call("s1", "t1", "c1", "guarded_write", {"value": "ok"}).key
        fillers = fill_until_out_of_memory(server)

        approved = client.approve(key, "ops@example.com")
        assert approved.status is CallStatus.PENDING
        assert approved.approval is not None

        redis.Redis.from_url(server.url).delete(*fillers)
        start_worker(extra_env=own_env)
        with sweeping(own):
            assert_ran_once_each(own, [key])
