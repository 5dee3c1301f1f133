"""Moved to `devtools.processes` (shared with bench/). This name stays the same module object, so
`-A tests.support.processes`, imports and monkeypatching in the tests keep working."""

import sys

import devtools.processes

sys.modules[__name__] = devtools.processes
