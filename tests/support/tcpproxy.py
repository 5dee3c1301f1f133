"""Moved to `dex_celery.testing.tcpproxy` (the users' test kit cuts the worker's Redis link with
it). This name stays the same module object, so imports and monkeypatching keep working."""

import sys

import dex_celery.testing.tcpproxy

sys.modules[__name__] = dex_celery.testing.tcpproxy
