"""`--app tests.support.apps.cliapp:dex` for CLI tests: the test sets `dex` to its own `Dex` first,
so the command under test talks to the same per-test database and ledger as the test."""

from __future__ import annotations

from dex_celery import Dex

dex: Dex | None = None
