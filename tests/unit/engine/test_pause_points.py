"""The engine's named pause points (dex_celery/engine/attempt/pause_points.py) and the kit's
side-effect counter (dex_celery/testing/effects.py): inert unless a test's environment turns
them on; on, a point writes its marker and holds the process until it is released or killed."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dex_celery.engine.attempt import pause_points
from dex_celery.engine.attempt.pause_points import (
    PAUSE_AT_ENV,
    PAUSE_DIR_ENV,
    PausePoint,
    armed,
    marker_name,
    pause_at,
)
from dex_celery.errors import ConfigurationError
from dex_celery.testing import effects


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.delenv(PAUSE_AT_ENV, raising=False)
    monkeypatch.setenv(PAUSE_DIR_ENV, str(tmp_path / "pause"))
    monkeypatch.delenv(effects.EFFECTS_DIR_ENV, raising=False)
    armed.cache_clear()
    yield
    armed.cache_clear()


def test_off_by_default_no_io(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_io(*_: object, **__: object) -> None:
        raise AssertionError("a pause point did I/O while off")

    monkeypatch.setattr(pause_points, "hold", no_io)
    for point in PausePoint:
        pause_at(point, "s/t/c")
    assert not (tmp_path / "pause").exists()


def test_the_environment_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    assert armed() == frozenset()
    monkeypatch.setenv(PAUSE_AT_ENV, "in_tool")
    assert armed() == frozenset()  # cached: the hot path never reads the environment again
    armed.cache_clear()
    assert armed() == {"in_tool"}


def test_an_unknown_point_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PAUSE_AT_ENV, "before_claim,in_the_middle")
    with pytest.raises(ConfigurationError, match="in_the_middle"):
        armed()


def test_a_named_point_holds_until_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PAUSE_AT_ENV, "after_tool")
    folder = tmp_path / "pause"
    pause_at(PausePoint.BEFORE_CLAIM, "s/t/c")  # not named: passes
    done = threading.Event()
    thread = threading.Thread(
        target=lambda: (pause_at(PausePoint.AFTER_TOOL, "s/t/c"), done.set()), daemon=True
    )
    thread.start()
    marker = folder / marker_name(PausePoint.AFTER_TOOL, os.getpid(), "s/t/c")
    for _ in range(200):
        if marker.exists():
            break
        threading.Event().wait(0.02)
    assert marker.read_text() == "s/t/c"
    assert not done.wait(0.3)  # held
    (folder / "release-after_tool").write_text("go")
    assert done.wait(5)


def test_effects_count_what_the_tool_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    effects.record("charge", "s/t/c1")  # outside a test run: nothing, no error
    monkeypatch.setenv(effects.EFFECTS_DIR_ENV, str(tmp_path / "effects"))
    assert effects.count("charge", "s/t/c1") == 0
    effects.record("charge", "s/t/c1")
    effects.record("charge", "s/t/c1")
    effects.record("charge", "s/t/c2")
    assert effects.count("charge", "s/t/c1") == 2
    assert effects.count("charge") == 3
    assert effects.count("refund") == 0


def test_counting_without_the_plugin_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match=r"dex_celery\.testing"):
        effects.count("charge", "s/t/c")
