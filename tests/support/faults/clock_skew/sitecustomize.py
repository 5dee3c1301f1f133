"""A host clock that is wrong by `DEX_TEST_CLOCK_SKEW` seconds, for the clock-skew crash test.

Python imports `sitecustomize` at start-up from the first folder of `sys.path` that holds one, so
a child process started with this folder first on `PYTHONPATH` runs with `time.time`,
`time.time_ns` and `datetime.datetime.now` / `utcnow` / `today` shifted before any module of
Celery, Kombu, redis-py or dex-celery is imported (a module that did `from time import time`
gets the shifted function too). `time.monotonic` is left alone: skew between hosts is a
disagreement of wall clocks, and a monotonic clock has no meaning between hosts anyway.

Without the variable (or with 0) this module changes nothing.
"""

from __future__ import annotations

import datetime as _datetime
import os
import time

SKEW_ENV = "DEX_TEST_CLOCK_SKEW"

_skew = float(os.environ.get(SKEW_ENV) or 0.0)

if _skew:
    _true_time = time.time
    _true_time_ns = time.time_ns
    _skew_ns = round(_skew * 1_000_000_000)
    _delta = _datetime.timedelta(seconds=_skew)

    def _skewed_time() -> float:
        return _true_time() + _skew

    def _skewed_time_ns() -> int:
        return _true_time_ns() + _skew_ns

    class _SkewedDatetime(_datetime.datetime):
        """`datetime.now()` reads the C clock, not `time.time`: shift it here too."""

        @classmethod
        def now(cls, tz: _datetime.tzinfo | None = None) -> _SkewedDatetime:
            return super().now(tz) + _delta

        @classmethod
        def utcnow(cls) -> _SkewedDatetime:
            return super().utcnow() + _delta

        @classmethod
        def today(cls) -> _SkewedDatetime:
            return super().today() + _delta

    time.time = _skewed_time
    time.time_ns = _skewed_time_ns
    _datetime.datetime = _SkewedDatetime  # type: ignore[misc]
