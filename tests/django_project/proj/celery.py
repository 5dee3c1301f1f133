"""The Django project's Celery app, as Celery's Django guide writes it, with dex-celery bound to
it: `Dex(app)` reads its settings from the app's configuration, which Celery took from the
Django settings (docs/django.md)."""

import os
from pathlib import Path
from typing import Any

from celery import Celery, signals

from dex_celery import Dex, EffectClass, ToolContext, ToolPolicy

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django_project.proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
dex = Dex(app)
app.conf.beat_schedule = dex.beat_schedule()


@dex.tool(policy=ToolPolicy(effect=EffectClass.READ))
def shout(ctx: ToolContext, text: str) -> str:
    """Says `text` louder."""
    return text.upper()


@signals.worker_ready.connect
def _announce_ready(sender: Any = None, **_: Any) -> None:
    """Tells the test the worker is ready (a file in its folder); a real project has no need."""
    folder = os.environ.get("DJANGO_EXAMPLE_READY_DIR")
    if folder:
        (Path(folder) / f"ready-{os.getpid()}").write_text("ready")
