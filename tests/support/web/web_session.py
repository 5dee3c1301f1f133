"""Two web users and a signed-in test client, for the tests that read the web app as a person."""

from __future__ import annotations

from starlette.testclient import TestClient

from dex_celery import Settings
from dex_celery.web.app import WebApp
from dex_celery.web.auth import Credentials

CREDENTIALS = Credentials.from_settings(Settings(web_users="alice:pw-a,bob:pw-b"))


def signed_in(app: WebApp, name: str, password: str) -> TestClient:
    client = TestClient(app.build(), base_url="http://localhost", follow_redirects=False)
    response = client.post("/login", data={"name": name, "password": password, "next": "/"})
    assert response.status_code == 303, response.text
    return client
