"""Moved to `devtools.toolapp` (shared with bench/). This name stays the same module object, so
`-A tests.support.toolapp`, imports and monkeypatching in the tests keep working."""

import sys

import devtools.toolapp

sys.modules[__name__] = devtools.toolapp
