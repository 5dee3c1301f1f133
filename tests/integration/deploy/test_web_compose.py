"""The compose file's web app: behind its authentication, never open (checked by parsing)."""

from __future__ import annotations

import yaml

from devtools.processes import ROOT
from tests.support.faults.crash import env_names


def test_the_web_service_requires_users_and_a_secret_key_from_the_environment() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    web = services["web"]
    assert web["command"][:4] == ["dex-celery", "-A", "dex_celery.examples.orderdesk.app", "web"]
    assert web["command"][web["command"].index("--host") + 1] == "0.0.0.0"
    environment = web["environment"]
    # `${VAR:?message}`: compose refuses to start the stack without them.
    assert str(environment["DEX_WEB_USERS"]).startswith("${DEX_WEB_USERS:?")
    assert str(environment["DEX_WEB_SECRET_KEY"]).startswith("${DEX_WEB_SECRET_KEY:?")
    assert set(environment) <= env_names()
    assert web["healthcheck"]["test"] and "/healthz" in " ".join(web["healthcheck"]["test"])
    assert "web" in (ROOT / "Dockerfile").read_text().split("pip install", 1)[1].split("\n")[0]
    beat = services["beat"]["environment"]
    assert "DEX_WEBHOOK_URLS" in beat and "DEX_WEBHOOK_SECRET" in beat
