"""The wiring rules of docs/architecture.md, checked on the source with `ast`.

- The import graph inside `dex_celery` has no cycle, counting imports under
  `if TYPE_CHECKING:` too: a type-only import is still a dependency a reader must follow.
- The layers point one way (docs/architecture.md, "The layers"): the engine and everything
  below it import nothing from the process wiring, the operators' side, the clients, the façade,
  the CLI, the web app, the integrations or the examples, whatever the kind of import
  (module level, type-only, or deferred inside a function); the operators' read side and the
  clients import nothing of the process wiring or the integrations, which import nothing of the
  façade or above. Not one import runs upward.
- The engine has faces (docs/architecture.md, "The engine's rooms"): the rest of `dex_celery`
  imports it through `dex_celery.engine` only; its rooms (`request/`, `attempt/`, `upkeep/`)
  import each other only through a room's face (its `__init__`); the modules at the engine's top
  that every room uses import no room, and no room imports the engine's wiring (its face,
  `runtime`, and what acts from a `Runtime`).
- At most twelve modules sit at the top of the package; the rest live in folders by role.
- An import inside a function says why, in a comment on its line or the line above: it defers
  an optional or slow dependency, or breaks a real cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dex_celery"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def _module_level_imports(
    tree: ast.Module, *, type_only: bool = True
) -> list[ast.Import | ast.ImportFrom]:
    """Imports at module level (not in functions); those under TYPE_CHECKING with `type_only`."""
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                out.append(node)
            elif isinstance(node, ast.If):
                if type_only or not _is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(tree.body)
    return out


def _resolve(module: str, node: ast.ImportFrom) -> str | None:
    if node.level == 0:
        return node.module
    base = module.split(".")[: -node.level]
    return ".".join([*base, node.module] if node.module else base)


def import_graph(*, deferred: bool = False) -> dict[str, set[str]]:
    """module -> the `dex_celery` modules it imports at module level, type-only imports
    included (and those inside functions with `deferred`).

    Importing `pkg.mod` runs `pkg/__init__.py` first, so it is an edge to `pkg` too, except
    for a module's own packages (their `__init__` may re-export the module: Python allows it).
    """
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        tree = ast.parse(path.read_text())
        nodes = _module_level_imports(tree) + (_function_imports(tree) if deferred else [])
        for node in nodes:
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(name, node)
                if base is None:
                    continue
                # `from pkg import mod` imports the module `pkg.mod`; `from mod import x`, `mod`.
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            for target in targets:
                deps.update(_with_packages(target, modules))
        own = _packages_of(name)
        graph[name] = {d for d in deps if d != name and d not in own}
    return graph


def _packages_of(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _with_packages(target: str, modules: dict[str, Path]) -> set[str]:
    """The target and every `dex_celery` package on its way (their `__init__` runs first)."""
    found = {p for p in _packages_of(target) if p in modules and p != "dex_celery"}
    if target in modules:
        found.add(target)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_import_graph_sees_real_edges() -> None:
    graph = import_graph()
    assert "dex_celery.engine" in graph["dex_celery.app"]
    assert "dex_celery.engine.runtime" in graph["dex_celery.engine"]
    assert "dex_celery.engine.request" in graph["dex_celery.engine.runtime"]
    assert "dex_celery.engine.request.dispatch" in graph["dex_celery.engine.request"]


def test_no_import_cycle_inside_dex_celery() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _function_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            found.extend(n for n in ast.walk(fn) if isinstance(n, ast.Import | ast.ImportFrom))
    return found


@pytest.mark.parametrize("name", sorted(_modules()))
def test_every_function_level_import_says_why(name: str) -> None:
    path = _modules()[name]
    lines = path.read_text().splitlines()
    bare = []
    for node in _function_imports(ast.parse(path.read_text())):
        here = lines[node.lineno - 1]
        above = lines[node.lineno - 2] if node.lineno > 1 else ""
        if "#" not in here and not above.strip().startswith("#"):
            bare.append(f"{path.name}:{node.lineno}: {here.strip()}")
    assert not bare, "imports inside functions without a comment saying why:\n" + "\n".join(bare)


#: The layers, lowest first. A module may import from its own layer and those below it only.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "dex_celery.errors",
            "dex_celery.settings",
            "dex_celery.backend_errors",
            "dex_celery.forks",
            "dex_celery.async_bridge",
            "dex_celery.access",
            "dex_celery.model",
        ),
    ),
    # The audit log and the store write in one transaction: each calls the other (docs/audit.md).
    (
        "parts",
        ("dex_celery.tools", "dex_celery.ledger", "dex_celery.store", "dex_celery.audit"),
    ),
    ("engine", ("dex_celery.engine",)),
    ("sides", ("dex_celery.ops", "dex_celery.client")),
    ("wiring", ("dex_celery.processes", "dex_celery.integrations")),
    ("facade", ("dex_celery.app",)),
    (
        "outer",
        (
            "dex_celery.cli",
            "dex_celery.web",
            "dex_celery.examples",
            "dex_celery.testing",
            "dex_celery",
        ),
    ),
]


def layer_of(module: str) -> int:
    for rank, (_name, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes if p != "dex_celery"):
            return rank
    if module == "dex_celery":
        return len(LAYERS) - 1
    raise AssertionError(f"{module} is in no layer of LAYERS: add it to one")


def test_every_module_has_a_layer() -> None:
    for name in _modules():
        layer_of(name)


def test_layers_point_down_whatever_the_kind_of_import() -> None:
    upward = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {dep} ({LAYERS[layer_of(dep)][0]})"
        for module, deps in sorted(import_graph(deferred=True).items())
        for dep in sorted(deps)
        if layer_of(dep) > layer_of(module)
    ]
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_the_read_side_sits_below_the_process_wiring() -> None:
    """`ops/status.py` reads what the worker's wiring writes (its starts): that record lives in
    the engine (`engine/worker_starts.py`), so the read side never imports the wiring."""
    assert layer_of("dex_celery.ops.status") < layer_of("dex_celery.processes.worker")
    assert layer_of("dex_celery.client.dex_client") < layer_of("dex_celery.integrations.mcp.tasks")


def test_layer_rule_sees_a_type_only_import() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dex_celery.app import Dex\n"
    )
    assert [n.module for n in _module_level_imports(tree) if isinstance(n, ast.ImportFrom)] == [
        "typing",
        "dex_celery.app",
    ]
    assert layer_of("dex_celery.app") > layer_of("dex_celery.engine.request.approvals")


def test_at_most_twelve_modules_at_the_top_of_the_package() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top


#: The order inside the base layer, lowest first: a base module imports only from its own entry
#: (its own package) and those before it. `model/` sits below `settings`: the settings parse
#: budgets and durations with the model's parsers, and a policy names the defaults it reads
#: as a protocol (`model/policy.py`, `PolicyDefaults`) instead of importing `Settings`.
BASE_ORDER: tuple[str, ...] = (
    "dex_celery.errors",
    "dex_celery.forks",
    "dex_celery.backend_errors",
    "dex_celery.async_bridge",
    "dex_celery.model",
    "dex_celery.settings",
    "dex_celery.access",
)


def _base_rank(module: str) -> int | None:
    for rank, prefix in enumerate(BASE_ORDER):
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def imports_up_the_base(graph: dict[str, set[str]]) -> list[str]:
    """The edges of `graph` from a base module to a base module later in `BASE_ORDER`."""
    found = []
    for module, deps in sorted(graph.items()):
        rank = _base_rank(module)
        if rank is None:
            continue
        for dep in sorted(deps):
            dep_rank = _base_rank(dep)
            if dep_rank is not None and dep_rank > rank:
                found.append(f"{module} imports {dep}")
    return found


def test_base_order_covers_the_base_layer() -> None:
    assert set(BASE_ORDER) == set(dict(LAYERS)["base"])


def test_base_order_rule_sees_an_import_back_up() -> None:
    graph = {
        "dex_celery.model.policy": {"dex_celery.settings", "dex_celery.model.effects"},
        "dex_celery.settings": {"dex_celery.model.times", "dex_celery.errors"},
    }
    assert imports_up_the_base(graph) == ["dex_celery.model.policy imports dex_celery.settings"]


def test_the_base_layer_imports_in_one_order_whatever_the_kind_of_import() -> None:
    upward = imports_up_the_base(import_graph(deferred=True))
    assert not upward, "imports back up the base layer (BASE_ORDER):\n" + "\n".join(upward)


ENGINE = "dex_celery.engine"
#: The engine's rooms; each package's `__init__` is its face.
ROOMS = (f"{ENGINE}.request", f"{ENGINE}.attempt", f"{ENGINE}.upkeep")
#: Modules at the engine's top that every room may use; they import no room and no wiring.
ENGINE_BASE = frozenset(
    f"{ENGINE}.{name}"
    for name in (
        "steps",
        "epoch",
        "decided_outcomes",
        "tracing",
        "task_events",
        "counters",
        "held_back_evidence",
    )
)
#: The engine's wiring: its face, the runtime that builds the rooms' components, and what acts
#: from a `Runtime`. It may import every room's face; no room and no base module imports it.
ENGINE_WIRING = frozenset(
    {ENGINE, f"{ENGINE}.runtime", f"{ENGINE}.preview_worker", f"{ENGINE}.worker_starts"}
)


def room_of(module: str) -> str | None:
    """The room `module` belongs to (its face included), or None outside the rooms."""
    return next((r for r in ROOMS if module == r or module.startswith(r + ".")), None)


def face_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import in `graph` that passes a face of the engine or runs back up inside it."""
    found = []
    for module, deps in sorted(graph.items()):
        inside = module == ENGINE or module.startswith(ENGINE + ".")
        room = room_of(module)
        for dep in sorted(deps):
            if not dep.startswith(ENGINE + "."):
                continue
            dep_room = room_of(dep)
            if not inside:
                found.append(f"{module} imports {dep}: outside the engine, import {ENGINE}")
            elif module in ENGINE_BASE and dep not in ENGINE_BASE:
                found.append(f"{module} imports {dep}: the engine's base imports only its base")
            elif dep in ENGINE_WIRING and module not in ENGINE_WIRING:
                found.append(f"{module} imports {dep}: nothing below the wiring imports it")
            elif dep_room is not None and dep_room != room and dep != dep_room:
                found.append(f"{module} imports {dep}: another room only through {dep_room}")
    return found


def test_every_engine_module_has_a_place() -> None:
    """A module of the engine is in a room, in its base or in its wiring: a new one at the top
    says which, here."""
    loose = [
        name
        for name in _modules()
        if (name == ENGINE or name.startswith(ENGINE + "."))
        and room_of(name) is None
        and name not in ENGINE_BASE | ENGINE_WIRING
    ]
    assert not loose, f"engine modules in no room, not base, not wiring: {loose}"


def test_the_engine_is_reached_through_its_faces_whatever_the_kind_of_import() -> None:
    found = face_violations(import_graph(deferred=True))
    assert not found, "imports past the engine's faces:\n" + "\n".join(found)


def test_face_rule_sees_each_kind_of_violation() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from dex_celery.engine.request.dispatch import Dispatcher\n"
    )
    [_, hidden] = [n for n in _module_level_imports(tree) if isinstance(n, ast.ImportFrom)]
    assert hidden.module == "dex_celery.engine.request.dispatch"
    graph = {
        "dex_celery.ops.status": {"dex_celery.engine.attempt.worker"},
        "dex_celery.engine.upkeep.sweep": {str(hidden.module), "dex_celery.engine.request"},
        "dex_celery.engine.attempt.worker": {"dex_celery.engine.runtime", "dex_celery.engine"},
        "dex_celery.engine.steps": {"dex_celery.engine.attempt", "dex_celery.engine.tracing"},
        "dex_celery.engine.runtime": {"dex_celery.engine.request", "dex_celery.engine.steps"},
        "dex_celery.app": {"dex_celery.engine"},
    }
    assert face_violations(graph) == [
        "dex_celery.engine.attempt.worker imports dex_celery.engine.runtime: nothing below the "
        "wiring imports it",
        "dex_celery.engine.steps imports dex_celery.engine.attempt: the engine's base imports "
        "only its base",
        "dex_celery.engine.upkeep.sweep imports dex_celery.engine.request.dispatch: another room "
        "only through dex_celery.engine.request",
        "dex_celery.ops.status imports dex_celery.engine.attempt.worker: outside the engine, "
        "import dex_celery.engine",
    ]
