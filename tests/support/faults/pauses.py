"""A folder of pause points for a worker the suite starts itself (`devtools.processes.Worker`):
the environment that arms a point, the wait for a process standing there, and its release
(the protocol of `dex_celery/engine/attempt/pause_points.py`; the user's kit has its own in
`dex_celery.testing`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from devtools.processes import wait_for
from dex_celery.engine.attempt.pause_points import PAUSE_AT_ENV, PAUSE_DIR_ENV, PausePoint


@dataclass(frozen=True)
class Pauses:
    folder: Path

    def env(self, point: PausePoint) -> dict[str, str]:
        """The worker's extra environment: its processes stop at `point`."""
        return {PAUSE_AT_ENV: point.value, PAUSE_DIR_ENV: str(self.folder)}

    def wait(self, point: PausePoint, what: str, timeout: float = 30) -> None:
        """Until a process stands at `point` (its marker is in the folder)."""
        prefix = f"{point.value}-"
        wait_for(
            lambda: any(p.name.startswith(prefix) for p in self.folder.iterdir()),
            timeout=timeout,
            what=what,
        )

    def release(self, point: PausePoint) -> None:
        """Let every process held at `point` go on."""
        (self.folder / f"release-{point.value}").touch()


def pauses_in(tmp_path: Path) -> Pauses:
    folder = tmp_path / "pauses"
    folder.mkdir()
    return Pauses(folder)
