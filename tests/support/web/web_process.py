"""`dex-celery web` as a real process, and Debian's chromium driven headless by Selenium."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.processes import ROOT, free_port, wait_for
from dex_celery.processes.parent_death import popen_with_parent_death

#: Set to a folder to have the browser test save its screenshots there (docs/web/ in the repo).
SCREENSHOTS_ENV = "DEX_WEB_SCREENSHOTS"


@dataclass
class WebServer:
    """`dex-celery --app <app> web --port <free>` with the given environment."""

    env: Mapping[str, str]
    log_path: Path
    app: str = "devtools.toolapp:dex"
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        exe = Path(sys.executable).with_name("dex-celery")
        return [str(exe), "--app", self.app, "web", "--host", self.host, "--port", str(self.port)]

    def start(self) -> WebServer:
        # `PYTHONPATH`: the console script imports this checkout's code, as the workers do
        # (their `python -m` puts it first), even where another checkout is installed.
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, **self.env, "PYTHONPATH": path}
        with self.log_path.open("wb") as out:
            self.process = popen_with_parent_death(
                self.command(), cwd=ROOT, env=env,
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_for(self._healthy, timeout=30, what=f"the web app on port {self.port}")
        return self

    def _healthy(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"web app exited:\n{self.log_path.read_text()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None


CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A headless Debian chromium under chromedriver, with a fresh profile; skipped if absent
    (`.ci/run` installs both)."""
    binary = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip(
            "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver  # deferred: only this browser test needs selenium
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="dex-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def shot(driver: Any, name: str) -> None:
    """Save the page as `<name>.png` in the folder `DEX_WEB_SCREENSHOTS` names, if it is set."""
    folder = os.environ.get(SCREENSHOTS_ENV)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))


def texts(driver: Any, element_id: str) -> list[str]:
    """Texts of the elements with this id on the page now (none while a page is loading)."""
    from selenium.common.exceptions import WebDriverException  # deferred: test-only dependency

    try:
        return [e.text for e in driver.find_elements("id", element_id)]
    except WebDriverException:  # the page changed under us (a refresh): look again
        return []
