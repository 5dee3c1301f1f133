"""A freeze's hold against its thaw, on SQLite and on PostgreSQL (docs/guardrails.md, "Write
freeze"; S13.2).

A thaw reports the held calls it let run ("released N held call(s)"). That report is true only
if no call is held by a freeze the thaw has already ended: such a hold is never seen by the
thaw's release, so something else has to free it and the thaw's report leaves it out. The hold
and the thaw are therefore one-or-the-other in SQL: a hold commits only while its freeze is in
force, and a thaw that ends the freeze after it sees the hold.
"""

from __future__ import annotations

import threading

from sqlalchemy import func, select

from dex_celery.model.freeze import FreezeMode, WriteFreeze
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import EffectClass
from dex_celery.store.freezes import Hold, WriteFreezes
from dex_celery.store.repository import Store
from dex_celery.store.schema import audit_log, freeze_holds
from dex_celery.store.values import NewCall
from tests.support.stores.store_rig import new_call
from tests.support.stores.store_rig import store as store
from tests.support.stores.store_rig import url as url


def write(key: str) -> NewCall:
    """A write that needs no person: only the freeze holds it."""
    return new_call(key, effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False)


def holds(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(freeze_holds)).scalar_one())


def entries(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(audit_log)).scalar_one())


def status(store: Store, key: str) -> CallStatus:
    record = store.get_call(key)
    assert record is not None, key
    return record.status


def hold(freezes: WriteFreezes, key: str, freeze: WriteFreeze, now: float) -> Hold:
    return freezes.hold(key, freeze, deadline=now + 600, may_have_run=False, now=now)


def test_a_thawed_freeze_takes_no_hold_and_writes_nothing(store: Store) -> None:
    """A claim the freeze refused whose hold comes after the thaw: the call stays `pending`
    (its worker opens it again), with no hold row and no audit entry of a hold."""
    store.insert_calls([write("s/t/w")], epoch="e")
    freezes = WriteFreezes(lambda: store.engine, store.audit)
    (freeze,) = freezes.begin(["*"], FreezeMode.HOLD, "incident", "ann", 1_000.0)
    freezes.end(None, "bob", 1_001.0)
    written = entries(store)

    assert hold(freezes, "s/t/w", freeze, 1_002.0) is Hold.THAWED
    assert status(store, "s/t/w") is CallStatus.PENDING
    assert holds(store) == 0
    assert entries(store) == written


def test_a_replaced_freeze_takes_no_hold(store: Store) -> None:
    """A freeze of the same scope made again ends the first; a hold under the first must meet
    the second (its worker opens the call again and the new freeze refuses its claim)."""
    store.insert_calls([write("s/t/w")], epoch="e")
    freezes = WriteFreezes(lambda: store.engine, store.audit)
    (first,) = freezes.begin(["*"], FreezeMode.HOLD, "incident", "ann", 1_000.0)
    (second,) = freezes.begin(["*"], FreezeMode.HOLD, "incident, longer", "ann", 1_001.0)
    assert hold(freezes, "s/t/w", first, 1_002.0) is Hold.THAWED
    assert hold(freezes, "s/t/w", second, 1_002.0) is Hold.HELD
    assert status(store, "s/t/w") is CallStatus.AWAITING_APPROVAL


def test_a_call_that_moved_on_is_not_held(store: Store) -> None:
    store.insert_calls([write("s/t/w")], epoch="e")
    freezes = WriteFreezes(lambda: store.engine, store.audit)
    (freeze,) = freezes.begin(["*"], FreezeMode.HOLD, "incident", "ann", 1_000.0)
    assert hold(freezes, "s/t/w", freeze, 1_001.0) is Hold.HELD
    assert hold(freezes, "s/t/w", freeze, 1_002.0) is Hold.MOVED_ON


def race(freezes: WriteFreezes, keys: list[str], now: float) -> tuple[dict[str, Hold], list[str]]:
    """Hold each of `keys` and thaw, all released together from threads of their own (each
    with its own connection); returns each hold's outcome and what the thaw released."""
    (freeze,) = freezes.begin(["*"], FreezeMode.HOLD, "incident", "ann", now)
    start = threading.Barrier(len(keys) + 1)
    outcomes: dict[str, Hold] = {}
    released: list[str] = []

    def holder(key: str) -> None:
        start.wait(timeout=30)
        outcomes[key] = hold(freezes, key, freeze, now)

    def thawer() -> None:
        start.wait(timeout=30)
        freezes.end(None, "bob", now)
        released.extend(h.record.key for h in freezes.release([], now, lambda _h: None))

    threads = [threading.Thread(target=holder, args=(k,)) for k in keys]
    threads.append(threading.Thread(target=thawer))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert len(outcomes) == len(keys)
    return outcomes, released


def test_every_hold_racing_a_thaw_is_released_by_that_thaw_or_never_made(store: Store) -> None:
    """Holds and a thaw at the same moment: each call ends either held and named in the thaw's
    release, or never held (still `pending`, for its worker to open again). A call held by the
    ended freeze and left out of the release would be a call the thaw freed without saying so,
    or never freed at all."""
    freezes = WriteFreezes(lambda: store.engine, store.audit)
    for round_ in range(15):
        keys = [f"s{round_}/t/w{i}" for i in range(12)]
        store.insert_calls([write(k) for k in keys], epoch="e")
        outcomes, released = race(freezes, keys, 1_000.0 + round_)
        for key in keys:
            if outcomes[key] is Hold.HELD:
                assert key in released, (round_, key, outcomes)
            else:
                assert outcomes[key] is Hold.THAWED, (round_, key, outcomes)
                assert key not in released
            # Either way the call is `pending` again: released by the thaw, or never held.
            assert status(store, key) is CallStatus.PENDING, (round_, key)
