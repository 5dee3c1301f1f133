"""`dex_celery.testing`: test your own tools against the faults dex-celery survives.

A pytest plugin, enabled explicitly (`pytest_plugins = ["dex_celery.testing"]` in conftest.py,
or `pytest -p dex_celery.testing`): fixtures that start a private redis-server, a throwaway
database, a real Celery worker (and beat) of your app, and SIGKILL the worker at a named point of
an attempt, roll Redis back to an older snapshot, or cut the worker's Redis link; a side-effect
counter for your tool body (`effects`) and assertions on the record (docs/testing.md).

This module imports no pytest: a tool may `from dex_celery.testing import effects` in a worker.
"""

from dex_celery.engine import PausePoint

#: The fixtures and hooks, loaded by pytest when it loads this module as a plugin.
pytest_plugins = ["dex_celery.testing.plugin"]

__all__ = ["PausePoint"]
