"""Moved to `devtools.pg_schema` (shared with bench/). This name stays the same module object, so
`-A tests.support.pg_schema`, imports and monkeypatching in the tests keep working."""

import sys

import devtools.pg_schema

sys.modules[__name__] = devtools.pg_schema
