"""The orphan check pages through every call in flight (docs/ledger.md, crash table, first row).

A crash between the SQL insert and the ledger open leaves a pending call with no ledger entry;
the sweeper must find it even behind a backlog larger than one sweep's batch.
"""

from __future__ import annotations

from devtools.toolapp import make_app
from dex_celery import CallKey, Settings
from dex_celery.engine.request.dispatch import admit
from dex_celery.model.policy import EffectClass, ToolPolicy, resolve_policy
from dex_celery.store.values import Admission, NewCall


def test_orphan_behind_a_backlog_is_started_within_a_few_sweeps(env: dict[str, str]) -> None:
    settings = Settings.from_env(env, sweep_batch=5, orphan_grace=0.0)
    _app, dex = make_app(settings)
    dex.store.create_schema()
    policy = ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False)

    def resolve(default: EffectClass | None, now: float) -> Admission:
        return admit(resolve_policy(policy, None, default, settings), now)

    keys = [CallKey.of("s", "t", f"c{i:02d}") for i in range(12)]
    epoch = dex.epoch()
    records = dex.store.insert_calls(
        [NewCall(k, "slow_non_idempotent_write", "{}", resolve) for k in keys],
        epoch=epoch,
    )
    # Eleven calls were opened in the ledger (healthy, in flight); the newest one never was.
    for record, _created in records[:-1]:
        dex.ledger.open(record.key, record.policy, epoch=epoch)
    orphan = keys[-1].key
    assert dex.ledger.read(orphan) is None

    sweeper = dex.sweeper
    reopened = [sweeper.sweep_once().reopened for _ in range(3)]

    assert sum(reopened) == 1, reopened
    entry = dex.ledger.read(orphan)
    assert entry is not None and entry.state == "enqueued" and entry.attempt == 1
    # Healthy calls were left alone: each still has exactly its one enqueued attempt.
    for key in keys[:-1]:
        healthy = dex.ledger.read(key.key)
        assert healthy is not None and healthy.attempt == 1 and healthy.state == "enqueued"
