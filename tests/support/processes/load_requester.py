"""One requester process of the deploy tests' steady load (tests/crash/worker/test_rolling_restarts.py).

`python -m tests.support.processes.load_requester SESSION COUNT SEED KEYS_FILE` requests COUNT calls of the
test tools in session SESSION, at a steady pace, mixing the four effect classes and tool
durations of 0.1-3 s (most short, some long), and appends each call's key to KEYS_FILE as it is
requested. Settings from the environment, as any requester's.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from devtools.toolapp import make_app
from dex_celery import EffectClass, Settings

#: Seconds between two requests of one requester.
PACE = 0.6


def duration(rng: random.Random) -> float:
    """A tool's run: 0.1-0.4 s for most calls, 0.5-3 s for one in four."""
    return round(rng.uniform(0.5, 3.0) if rng.random() < 0.25 else rng.uniform(0.1, 0.4), 2)


def main(session: str, count: int, seed: int, keys_file: Path) -> None:
    rng = random.Random(seed)
    _app, dex = make_app(Settings.from_env())
    client = dex.client()
    effects = list(EffectClass)
    for i in range(count):
        tool = f"slow_{rng.choice(effects).value}"
        record = client.request_call(
            session, f"t{i}", "c", tool, {"seconds": duration(rng), "value": f"v{i}"}
        )
        with keys_file.open("a") as out:
            out.write(record.key + "\n")
        time.sleep(PACE)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
