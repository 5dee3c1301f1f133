"""The alert rules in deploy/prometheus are valid, each one fires where its unit test says (and
not before), and each has its runbook entry in docs/operations.md ("Alerts").

`promtool` comes with Debian's `prometheus` package (.ci/run installs it). Without it the test
skips on a workstation and fails in CI (`CI=true`), so CI never passes without running it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
OPERATIONS = ROOT / "docs" / "operations.md"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("promtool is missing in CI: install Debian's `prometheus` package")
        pytest.skip("promtool is not installed (Debian package `prometheus`)")
    return found


def alerts() -> dict[str, dict[str, object]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"]}


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = subprocess.run(
        [promtool(), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULE_TESTS.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_unit_test_and_a_runbook_entry() -> None:
    fired: set[str] = set()
    checked: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            checked.add(check["alertname"])
            if check.get("exp_alerts"):
                fired.add(check["alertname"])
    names = set(alerts())
    assert names - fired == set(), "alerts never shown firing"
    assert names == checked
    headings = {
        m.group(1).lower() for m in re.finditer(r"^### `?(Dex\w+)`?", OPERATIONS.read_text(), re.M)
    }
    for name, rule in alerts().items():
        assert name.lower() in headings, f"{name} has no runbook entry in docs/operations.md"
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert annotations["runbook"] == f"docs/operations.md#{name.lower()}"
