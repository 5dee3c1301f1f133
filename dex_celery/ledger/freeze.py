"""The ledger's copy of the write freezes in force (S13.2), and how it is kept equal to SQL's.

SQL (`dex_write_freezes`) is the record; each ledger shard holds a copy in its freeze key
(`KeySpace.freeze`), which `claim.lua` reads in the same script as the claim. Redis may come back
without it (a restart from an older snapshot, a replaced server, eviction): `reassert` rewrites
every shard from SQL, conservatively (what SQL holds wins). The sweeper runs it at every sweep,
and the ledger guard before it starts a new life of the ledger (`ledger/guard.py`), so a rollback
that the guard detects never opens a life without the freeze.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from dex_celery.ledger.ledger import Ledger
from dex_celery.model.freeze import WriteFreeze
from dex_celery.store.freezes import WriteFreezes

log = logging.getLogger("dex_celery.ledger.freeze")


def ledger_copy(active: Sequence[WriteFreeze]) -> str:
    """The ledger's copy of the freezes in force: one JSON object, scope -> freeze (what
    `claim.lua` reads); '' when none is in force."""
    if not active:
        return ""
    return json.dumps(
        {f.tool: f.ledger_entry() for f in active}, sort_keys=True, separators=(",", ":")
    )


def reassert(ledger: Ledger, freezes: WriteFreezes) -> bool:
    """Make every shard's copy say what SQL says; True if any shard differed (then it was
    rewritten, and a warning says so). A freeze Redis lost comes back, and a thaw whose ledger
    write failed takes effect."""
    active = freezes.active()
    wanted = ledger_copy(active)
    if all((seen or "") == wanted for seen in ledger.read_freezes()):
        return False
    log.warning(
        "the ledger's copy of the write freezes differed from the database's (in force: %s); "
        "re-asserted from the database",
        ", ".join(sorted(f.tool for f in active)) or "none",
    )
    ledger.set_freezes(wanted)
    return True
