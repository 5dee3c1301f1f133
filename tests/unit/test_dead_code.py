"""No dead code in `dex_celery/`: vulture finds no unused function, class, method, attribute or
variable, at its lowest confidence (60%: where it reports unused functions at all).

What a framework calls by name, what users call and what the tests read as their oracle is in
`devtools/vulture_allowlist.py`, each entry saying who uses it; anything else vulture reports
is dead and is deleted, not listed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWLIST = ROOT / "devtools" / "vulture_allowlist.py"


def _vulture(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vulture", *map(str, paths), "--min-confidence", "60"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_no_dead_code_in_the_package() -> None:
    result = _vulture(ROOT / "dex_celery", ALLOWLIST)
    assert result.returncode == 0 and not result.stdout, "dead code:\n" + result.stdout


def test_vulture_sees_a_dead_function(tmp_path: Path) -> None:
    module = tmp_path / "dead.py"
    module.write_text(
        "def used() -> int:\n    return 1\n\n\ndef never_called() -> int:\n    return used()\n"
    )
    result = _vulture(module, ALLOWLIST)
    assert "never_called" in result.stdout
