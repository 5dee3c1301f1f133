"""The previous release of dex-celery, taken from this repository's own git history.

Online schema upgrades (docs/deploy.md, "Online schema upgrades") promise that the previous
release's workers and requesters keep working against the newest schema while a deploy rolls.
The tests that check it need that release's code: `materialise` writes its `dex_celery` and
`devtools` packages into a folder, where a process started with that folder first on its path
(its working directory for `python -m ...`, and `PYTHONPATH`) imports them instead of the
working tree's.

When a release is made, `PREVIOUS_RELEASE` moves to its commit.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from devtools.processes import ROOT

#: The commit of the release before the one being built (main when issue 38 was opened).
PREVIOUS_RELEASE = "0b933ed"
#: What a worker or requester of that release imports: the package and the test tools' app.
PACKAGES = ("dex_celery", "devtools")


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, timeout=60)


def require_history(commit: str = PREVIOUS_RELEASE) -> None:
    """Fail (never skip) when the clone lacks `commit`: CI clones the whole history, so a
    missing commit is a set-up to fix, not a reason to check nothing."""
    found = _git("cat-file", "-e", f"{commit}^{{commit}}")
    if found.returncode != 0:
        pytest.fail(
            f"the previous release {commit} is not in this clone's git history "
            f"({found.stderr.decode(errors='replace').strip() or 'no git repository'}); "
            "these tests need the whole history: `git fetch --unshallow` (or clone without "
            "--depth)",
            pytrace=False,
        )


def materialise(dest: Path, commit: str = PREVIOUS_RELEASE) -> Path:
    """Write `PACKAGES` as they were at `commit` into `dest`; returns `dest`."""
    require_history(commit)
    dest.mkdir(parents=True, exist_ok=True)
    archive = _git("archive", "--format=tar", commit, *PACKAGES)
    assert archive.returncode == 0, archive.stderr.decode(errors="replace")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True, timeout=60)
    return dest


def files_naming(word: str, commit: str = PREVIOUS_RELEASE) -> list[str]:
    """The files of `dex_celery` at `commit`, migrations aside, that name `word` (a whole word):
    the code of that release that may read or write a column or table so named."""
    require_history(commit)
    found = _git(
        "grep", "-l", "-w", "-F", word, commit, "--",
        "dex_celery", ":(exclude)dex_celery/store/migrations",
    )  # fmt: skip
    if found.returncode == 1:  # git grep: no match
        return []
    assert found.returncode == 0, found.stderr.decode(errors="replace")
    return [line.split(":", 1)[1] for line in found.stdout.decode().splitlines()]
