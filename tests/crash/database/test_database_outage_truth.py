"""Honest text after a database outage (docs/ledger.md, "The write fence"; S4.2, S10.2).

A write runs only once its claim is committed in SQL. When that commit cannot happen (the
database refuses connections) the tool never starts; when the connection breaks during the
commit, the worker cannot know whether the claim was made and does not start the tool either.
Once the database answers again the record is judged from SQL: no claim there, `failed` "the
tool did not run"; a claim there, `outcome_unknown` saying the claim's commit could not be
confirmed, never "lost after the tool started".

A real PostgreSQL behind a TCP proxy the test cuts (`tests/support/faults/db_proxy.py`), a real Celery
prefork worker holding each delivered task before its claim until the outage is in place, and the
tool's own side-effect log as the witness that no tool code ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import suppress

import pytest

from devtools.processes import Worker, wait_for
from devtools.toolapp import (
    BLOCK_BEFORE_CLAIM_ENV,
    executions,
    log_dir,
    make_app,
    prerun_marker,
)
from dex_celery import (
    DID_NOT_RUN,
    BackendUnavailable,
    CallStatus,
    Dex,
    DexError,
    RecordingUnconfirmed,
    RequestInFlight,
    Settings,
)
from dex_celery.model.ids import CallKey
from dex_celery.store.repository import Store
from tests.support.faults.crash import tool_messages
from tests.support.faults.db_proxy import CuttableProxy
from tests.support.faults.request_truth import sweeping
from tests.support.stores.pg_database import fresh_database

pytestmark = pytest.mark.crash

WRITE = "slow_non_idempotent_write"


@pytest.fixture
def pg_behind_proxy() -> Iterator[tuple[str, CuttableProxy]]:
    """A fresh PostgreSQL database with the schema, and a proxy in front of it: (the direct
    URL, for the test's own look at the truth; the proxy)."""
    with fresh_database("dex_outage") as url:
        Store(url).create_schema()
        proxy = CuttableProxy(target_port=5432).start()
        try:
            yield url, proxy
        finally:
            proxy.stop()


def deployment(
    env: dict[str, str], url: str, proxy: CuttableProxy
) -> tuple[Dex, dict[str, str], Store]:
    """The deployment on the proxy, and a store on the database itself (the truth)."""
    database = url.rsplit("/", 1)[1]
    own_env = {**env, "DEX_DATABASE_URL": proxy.url(database)}
    _app, dex = make_app(Settings.from_env(own_env))
    dex.epoch()  # binds the ledger to the database while it answers
    return dex, own_env, Store(url)


def held_before_claim(keys: list[str]) -> None:
    """Wait until the worker holds each call's attempt 1 before its claim."""
    for key in keys:
        marker = prerun_marker(CallKey.parse(key).task_id(1))
        wait_for(marker.exists, timeout=60, what=f"the worker to hold {key} before its claim")


def release_claims() -> None:
    (log_dir() / "release-prerun").write_text("go")


def wait_ended(truth: Store, key: str, *, timeout: float = 90) -> None:
    def ended() -> bool:
        record = truth.get_call(key)
        return record is not None and record.finished

    wait_for(ended, timeout=timeout, what=f"a terminal record of {key}")


@pytest.mark.usefixtures("dex")
def test_writes_whose_claim_could_not_connect_end_failed_did_not_run_once_the_database_answers(
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    pg_behind_proxy: tuple[str, CuttableProxy],
) -> None:
    url, proxy = pg_behind_proxy
    own, own_env, truth = deployment(env, url, proxy)
    start_worker(concurrency=3, extra_env={**own_env, BLOCK_BEFORE_CLAIM_ENV: "1"})
    keys = [
        own.client().request_call("s1", "t1", f"w{i}", WRITE, {"seconds": 0}).key for i in range(3)
    ]
    held_before_claim(keys)

    proxy.cut()  # every connection dropped, new ones refused
    release_claims()
    # The workers try their claims against the refused database and give up; nothing can be
    # recorded while the database is away. (On the old code the attempts stay `running` in the
    # ledger until their leases lapse: this wait runs out, and the outcome shows the untrue text.)
    with suppress(AssertionError):
        wait_for(
            lambda: all(
                (e := own.ledger.read(k)) is not None and e.status != "active" for k in keys
            ),
            timeout=10,
            what="the workers to give their attempts up",
        )
    for key in keys:
        record = truth.get_call(key)
        assert record is not None and record.status is CallStatus.PENDING, "recorded during the cut"

    proxy.restore()
    with sweeping(own):
        for key in keys:
            wait_ended(truth, key)

    for key in keys:
        record = truth.get_call(key)
        assert record is not None
        assert executions(key) == [], f"the tool ran for {key}"
        assert record.claimed_by is None
        assert record.status is CallStatus.FAILED, (key, record.status, record.error)
        error = record.error or ""
        assert error.startswith(DID_NOT_RUN), error
        assert "after the tool started" not in error
        assert "claim" in error
        assert tool_messages(own, key) == [f"Error: {error}"]


@pytest.mark.parametrize("commit_reaches_the_server", [True, False], ids=["applied", "dropped"])
@pytest.mark.usefixtures("dex")
def test_a_claim_whose_commit_is_unconfirmed_is_judged_from_sql_and_never_said_to_have_started(
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    pg_behind_proxy: tuple[str, CuttableProxy],
    commit_reaches_the_server: bool,
) -> None:
    url, proxy = pg_behind_proxy
    own, own_env, truth = deployment(env, url, proxy)
    start_worker(concurrency=1, extra_env={**own_env, BLOCK_BEFORE_CLAIM_ENV: "1"})
    key = own.client().request_call("s1", "t1", "w1", WRITE, {"seconds": 0}).key
    held_before_claim([key])

    # The next COMMIT (the worker's claim) reaches the server or is lost; either way its
    # answer never comes back and the connection is closed.
    proxy.cut_at_commit(forward=commit_reaches_the_server)
    release_claims()
    wait_for(lambda: proxy.trapped == 1, timeout=30, what="the claim's COMMIT to be cut")

    with sweeping(own):
        wait_ended(truth, key)

    record = truth.get_call(key)
    assert record is not None
    assert executions(key) == [], "the tool ran"
    error = record.error or ""
    assert "after the tool started" not in error
    if commit_reaches_the_server:
        # The claim is in SQL: by the write-fence rule the record cannot say "did not run".
        assert record.claimed_by is not None
        assert record.status is CallStatus.OUTCOME_UNKNOWN, (record.status, error)
        assert "broke while the worker committed its claim" in error, error
        assert "holds a claim of this write" in error, error
    else:
        assert record.claimed_by is None
        assert record.status is CallStatus.FAILED, (record.status, error)
        assert error.startswith(DID_NOT_RUN), error


@pytest.mark.usefixtures("dex")
def test_a_write_whose_worker_died_in_its_claims_commit_ends_did_not_run_not_lost_after_start(
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    pg_behind_proxy: tuple[str, CuttableProxy],
) -> None:
    """The worker hangs in the COMMIT of its claim and is SIGKILLed there: the database rolls
    the claim back, the lease lapses, and the record is judged from SQL (no claim: did not run).
    The conditional update that records it waits for the dead transaction's row lock, so it
    cannot overtake a claim that might still commit."""
    url, proxy = pg_behind_proxy
    own, own_env, truth = deployment(env, url, proxy)
    worker = start_worker(concurrency=1, extra_env={**own_env, BLOCK_BEFORE_CLAIM_ENV: "1"})
    key = own.client().request_call("s1", "t1", "w1", WRITE, {"seconds": 0}).key
    held_before_claim([key])

    proxy.hold_at_commit()
    release_claims()
    wait_for(lambda: proxy.trapped == 1, timeout=30, what="the claim's COMMIT to be held")
    worker.kill_all()

    with sweeping(own):
        wait_ended(truth, key)

    record = truth.get_call(key)
    assert record is not None
    assert executions(key) == [], "the tool ran"
    assert record.claimed_by is None
    error = record.error or ""
    assert record.status is CallStatus.FAILED, (record.status, error)
    assert error.startswith(DID_NOT_RUN), error
    assert "after the tool started" not in error


@pytest.mark.parametrize("commit_reaches_the_server", [True, False], ids=["applied", "dropped"])
@pytest.mark.usefixtures("dex")
def test_a_request_whose_insert_commit_is_unconfirmed_says_so_and_the_same_ids_run_it_once(
    env: dict[str, str],
    start_worker: Callable[..., Worker],
    pg_behind_proxy: tuple[str, CuttableProxy],
    commit_reaches_the_server: bool,
) -> None:
    """The connection breaks during the COMMIT of the request's insert: the caller cannot know
    whether the call is recorded, and the error says so (`RecordingUnconfirmed`), never that
    nothing changed. Asking again with the same ids returns the call if it was recorded, or
    records it now; either way the write runs once."""
    url, proxy = pg_behind_proxy
    own, own_env, truth = deployment(env, url, proxy)
    client = own.client()
    key = "s1/t1/w1"

    proxy.cut_at_commit(forward=commit_reaches_the_server)
    with pytest.raises(DexError) as raised:
        client.request_call("s1", "t1", "w1", WRITE, {"seconds": 0})
    error = raised.value
    assert isinstance(error, RecordingUnconfirmed), f"{type(error).__name__}: {error}"
    assert isinstance(error, RequestInFlight) and not isinstance(error, BackendUnavailable)
    assert error.keys == (key,)
    text = str(error)
    assert "may or may not be recorded" in text
    assert "same session, turn and tool-call ids" in text
    assert "nothing" not in text.lower()
    recorded = truth.get_call(key)
    assert (recorded is not None) is commit_reaches_the_server

    start_worker(extra_env=own_env)
    with sweeping(own):
        again = client.request_call("s1", "t1", "w1", WRITE, {"seconds": 0})
        assert again.key == key
        wait_ended(truth, key)
    record = truth.get_call(key)
    assert record is not None and record.status is CallStatus.SUCCEEDED, record
    assert [line.split(" ")[0] for line in executions(key)] == ["start", "end"]
