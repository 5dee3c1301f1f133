"""dex-celery's Alembic migrations, run by `dex-celery db upgrade` (`dex_celery.store.migrate`).

Every migration after `0007` is **expand-then-contract** (docs/deploy.md, "Online schema
upgrades"). `dex-celery db upgrade` runs first in a deploy, while the previous release's workers,
beat and requesters still run against the database, so:

- A release's migrations only *expand*: new tables, new columns that are nullable or have a
  server default (the old code's INSERTs do not name them), new indexes, nullable columns made
  wider. The old code keeps reading and writing what it knows, unchanged.
- What the new code no longer needs is *contracted* one release later, when no process of the
  release that used it can still run: a migration that drops, renames, retypes or makes NOT NULL
  names what it removes in a module-level `contracts = ("table.column", ...)`, and nothing the
  previous release's code uses may be in it.
- A rename is therefore three steps over two releases: add the new column and write both
  (release N), read the new one and backfill (release N), drop the old one (release N+1).
- `downgrade()` may drop what its own `upgrade()` added.

tests/unit/store/test_migration_policy.py enforces these rules on the source of every migration after
`0007`; tests/integration/store/test_online_migration.py runs the previous release's worker and
requester, for real, against the schema migrated to the newest revision.
"""
