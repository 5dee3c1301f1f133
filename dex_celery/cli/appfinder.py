"""Find the `Dex` named by `-A/--app`, accepting what `celery -A` accepts.

`proj`, `proj.celery`, `proj.celery:app` (a Celery app: the `Dex` created on it is used) or
`proj.celery:dex` (a `Dex`). A module without an attribute is searched like Celery does: its
`dex`, `app` or `celery` attribute, then any `Dex` or Celery app in it, then `<module>.celery`.
There is no default: without `-A` or `$DEX_APP` the command says how to name one, and never
falls back to the bundled example.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any

from celery import Celery

from dex_celery.app import Dex, dex_of
from dex_celery.errors import AppNotFound, DexError

NO_APP_HINT = (
    "no app given: pass -A/--app (a module, module:celery_app or module:dex, as for celery -A) "
    "or set DEX_APP; `dex-celery demo` runs the bundled example without one"
)


def find_dex(path: str | None) -> Dex:
    """The `Dex` that `path` names; `AppNotFound` (one line) when there is none."""
    if not path:
        raise AppNotFound(NO_APP_HINT)
    if os.getcwd() not in sys.path:  # as `celery -A`: the project is the current folder
        sys.path.insert(0, os.getcwd())
    module_name, colon, attribute = path.partition(":")
    module = _import(module_name, path)
    if module is None and not colon and "." in module_name:
        module_name, _, attribute = module_name.rpartition(".")  # `proj.celery.app`
        module = _import(module_name, path)
    if module is None:
        raise AppNotFound(f"cannot import {path.partition(':')[0]!r} (from -A/--app {path!r})")
    if attribute:
        if not hasattr(module, attribute):
            raise AppNotFound(
                f"module {module_name!r} has no attribute {attribute!r} (-A/--app {path!r})"
            )
        return _as_dex(getattr(module, attribute), path)
    return _search(module, path)


def _import(module_name: str, path: str) -> ModuleType | None:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            return None  # the named module itself is missing (not one it imports)
        raise AppNotFound(f"importing {module_name!r} (from -A/--app {path!r}) failed: {e}") from e
    except DexError:
        raise
    except Exception as e:  # the user's module raised while importing: say so in one line
        raise AppNotFound(
            f"importing {module_name!r} (from -A/--app {path!r}) failed: {type(e).__name__}: {e}"
        ) from e


def _as_dex(value: Any, path: str) -> Dex:
    if isinstance(value, Dex):
        return value
    if isinstance(value, Celery):
        dex = dex_of(value)
        if dex is None:
            raise AppNotFound(
                f"the Celery app {path!r} has no dex_celery.Dex: create one with Dex(app)"
            )
        return dex
    raise AppNotFound(
        f"-A/--app {path!r} does not name a Celery app or a dex_celery.Dex (it is a {type(value).__name__})"
    )


def _search(module: ModuleType, path: str) -> Dex:
    for name in ("dex", "app", "celery"):
        value = getattr(module, name, None)
        if isinstance(value, Dex | Celery):
            return _as_dex(value, path)
    for value in list(vars(module).values()):
        if isinstance(value, Dex):
            return value
    for value in list(vars(module).values()):
        if isinstance(value, Celery) and dex_of(value) is not None:
            return _as_dex(value, path)
    if getattr(module, "__path__", None):
        submodule = _import(f"{module.__name__}.celery", path)
        if submodule is not None:
            return _search(submodule, path)
    raise AppNotFound(
        f"module {module.__name__!r} (-A/--app {path!r}) has no Celery app with a Dex"
    )
