"""Worker apps of two releases around the test tools' `audit` (version skew, docs/reliability.md,
"Deploys"): `old` lacks the tool, as the previous release's workers do while requesters of the
new one already ask for it; `new` has it under another policy than the requesters' (a
start-to-close far shorter than its run), so a call that succeeds shows the worker ran it under
the call's recorded snapshot (S1.5), not its own registration.

Run as `celery -A tests.support.apps.skew_apps:old worker` / `...:new worker`; both announce readiness
like the test tools' app (the `worker_ready` hook of `devtools.toolapp`, imported here).
"""

from __future__ import annotations

from devtools.toolapp import NEW_TOOL, NEW_TOOL_POLICY, make_app
from dex_celery import ToolPolicy

#: The new release's own registration of `audit`: 0.5 s to run a tool the test makes take 1.5 s.
NEW_WORKER_POLICY = ToolPolicy(
    effect=NEW_TOOL_POLICY.effect,
    requires_approval=False,
    repeat_guard=False,
    start_to_close=0.5,
)

old, _old_dex = make_app(without=frozenset({NEW_TOOL}))
new, _new_dex = make_app(new_tool_policy=NEW_WORKER_POLICY)
