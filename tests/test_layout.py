"""The layout: layers depend downward only and no module imports itself back.

Every import counts, at any depth of a module and under ``TYPE_CHECKING`` too. The
adapters (``statekernel.stores``, ``statekernel.providers``) sit below the kernel and
depend only on the protocols they implement (both in ``statekernel._storage``); the
kernel's core reaches them only through its lazy registry: ``statekernel._kernel.kernel``
imports ``statekernel.stores`` (to open a store URL) and ``statekernel.providers`` (to
resolve a model string) inside the functions that need them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {
    "statekernel": "statekernel",
    "stores": "statekernel.stores",
    "providers": "statekernel.providers",
}

LAYERS = [
    ("statekernel.errors", "statekernel._exports", "statekernel._secrets"),
    ("statekernel._records",),
    ("statekernel._lifecycle",),
    ("statekernel._storage",),
    ("statekernel.stores", "statekernel.providers"),
    ("statekernel._kernel",),
    ("statekernel._workers", "statekernel.testing"),
    ("statekernel", "statekernel.mcp", "statekernel.middleware", "statekernel.telemetry"),
    ("statekernel.integrations",),
    ("statekernel._front",),
    ("statekernel.web",),
    ("statekernel._cli",),
    ("statekernel.__main__",),
]
"""Bottom to top: a module imports only from its own layer or the ones below. The
public API's modules (``statekernel``, ``statekernel.mcp``...) sit on the kernel and the
workers; the engine integrations on the public API (a DBOS process keeps its kernel in
a ``statekernel.blocking.KernelThread``). The front-ends have floors of their own above
them: what they share (``_front``), then the web view, then the command line (whose
``ui`` command starts the web view); the web view never imports the command line."""

REGISTRY = {
    ("statekernel._kernel.kernel", "statekernel.stores"),
    ("statekernel._kernel.kernel", "statekernel.providers"),
}
"""(importer, imported package): the lazy registry that resolves a store URL or a model,
the core's only tie to an adapter."""

CORE = (
    "statekernel._records",
    "statekernel._lifecycle",
    "statekernel._storage",
    "statekernel._kernel",
)
OUTSIDE_CORE = (
    "statekernel._cli",
    "statekernel.web",
    "statekernel._workers",
    "statekernel.stores",
    "statekernel.providers",
    "statekernel.testing",
)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


MODULES = _modules()


def _imports(module: str) -> Iterator[str]:
    """The project modules ``module`` imports, wherever the import statement is."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    yield f"{base}.{alias.name}"
                elif base in MODULES:
                    yield base


def _edges() -> dict[str, set[str]]:
    return {m: {t for t in _imports(m) if t != m} for m in MODULES}


def _layer(module: str) -> int:
    best, length = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            owns = module == prefix or module.startswith(prefix + ".")
            if owns and len(prefix) > length:
                best, length = index, len(prefix)
    assert best >= 0, f"{module} is in no layer: add it to LAYERS"
    return best


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _registry(importer: str, imported: str) -> bool:
    return any(importer == a and _within(imported, (b,)) for a, b in REGISTRY)


def test_every_module_is_in_a_layer() -> None:
    for module in MODULES:
        _layer(module)


def test_layers_depend_downward_only() -> None:
    wrong = [
        f"{importer} (layer {_layer(importer)}) imports {imported} (layer {_layer(imported)})"
        for importer, targets in _edges().items()
        for imported in targets
        if _layer(imported) > _layer(importer)
    ]
    assert wrong == []


def test_the_core_imports_no_adapter_command_or_worker() -> None:
    wrong = [
        f"{importer} imports {imported}"
        for importer, targets in _edges().items()
        if _within(importer, CORE)
        for imported in targets
        if _within(imported, OUTSIDE_CORE) and not _registry(importer, imported)
    ]
    assert wrong == []


def test_the_workers_never_import_the_command_line() -> None:
    edges = _edges()
    assert [
        (m, t)
        for m in MODULES
        if _within(m, ("statekernel._workers",))
        for t in edges[m]
        if _within(t, ("statekernel._cli",))
    ] == []


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among ``edges`` (a path that returns to its start), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_cycle() -> None:
    edges = _edges()
    assert _cycle(edges) is None, " -> ".join(_cycle(edges) or [])


@pytest.mark.parametrize(
    ("edges", "cyclic"),
    [({"a": {"b"}, "b": {"a"}}, True), ({"a": {"b"}, "b": {"c"}, "c": set()}, False)],
)
def test_the_cycle_finder_finds_cycles(edges: dict[str, set[str]], cyclic: bool) -> None:
    assert (_cycle(edges) is not None) == cyclic


def _defined_names() -> set[str]:
    """Every name a project module defines (functions, classes, assignments, at any
    depth): what an essay may name besides a module."""
    names: set[str] = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return names


def _stale_references(module: str, defined: set[str], essay: str | None = None) -> Iterator[str]:
    """What ``module``'s essay (its docstring, or ``essay``) names that does not exist: a
    ``*.py`` file, or a private module or name in double backticks (``_writer``)."""
    path = MODULES[module]
    if essay is None:
        essay = ast.get_docstring(ast.parse(path.read_text())) or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    homes = {package, package.rpartition(".")[0], *FOLDERS.values()}
    for ref in set(re.findall(r"[\w/]+\.py\b", essay)):
        places = (ROOT / ref, ROOT / "statekernel" / ref, path.parent / ref)
        if not any(p.exists() for p in places):
            yield ref
    for ref in set(re.findall(r"``(_\w+)(?:\.\w+)*``", essay)):
        if not any(f"{home}.{ref}" in MODULES for home in homes) and ref not in defined:
            yield ref


def test_module_essays_name_only_what_exists() -> None:
    defined = _defined_names()
    stale = {m: sorted(_stale_references(m, defined)) for m in MODULES}
    assert {m: refs for m, refs in stale.items() if refs} == {}


def test_the_essay_check_finds_a_stale_name() -> None:
    module = "statekernel.stores.sqlite._store"
    essay = "Writes go through ``_writer`` and ``_gone``, as ``_gone.py`` and ``_writer.py`` say."
    assert sorted(_stale_references(module, set(), essay)) == ["_gone", "_gone.py"]
    assert list(_stale_references(module, {"_gone"}, "``_gone``")) == []


def _class_size(module: str, name: str) -> tuple[int, int]:
    """(attributes set in ``__init__``, methods and properties) of class ``name``."""
    tree = ast.parse(MODULES[module].read_text())
    (found,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    methods = [n for n in found.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    (init,) = [m for m in methods if m.name == "__init__"]
    attributes = {
        target.attr
        for node in ast.walk(init)
        for target in getattr(node, "targets", [getattr(node, "target", None)])
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    }
    return len(attributes), len(methods)


def test_the_driver_keeps_to_the_run() -> None:
    """Who holds a driver lives in ``Seats``: the driver stays at most 14 attributes and
    30 methods."""
    attributes, methods = _class_size("statekernel._kernel.drive", "RunDriver")
    assert attributes <= 14, attributes
    assert methods <= 30, methods


def _class_lines(module: str, name: str) -> int:
    tree = ast.parse(MODULES[module].read_text())
    (found,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return (found.end_lineno or found.lineno) - found.lineno + 1


def test_the_kernel_is_its_api() -> None:
    """Who holds which run (drivers, leases, their renewal, deletion under leases) lives in
    ``Tenancy``, the rules of resolving a pause in ``resolving``: ``Kernel`` keeps at most
    30 methods in at most 650 lines."""
    _, methods = _class_size("statekernel._kernel.kernel", "Kernel")
    assert methods <= 30, methods
    lines = _class_lines("statekernel._kernel.kernel", "Kernel")
    assert lines <= 650, lines


def test_no_library_module_is_over_900_lines() -> None:
    """Generated strategies aside, a module that grows past 900 lines is split."""
    long = {
        name: len(path.read_text().splitlines())
        for name, path in MODULES.items()
        if name != "statekernel.testing.strategies"
    }
    assert {name: n for name, n in long.items() if n > 900} == {}


BACKENDS = ("sqlite", "file", "redis", "postgres", "memory")
"""The store backends, each a subpackage of ``statekernel.stores``."""


def test_no_backend_imports_another() -> None:
    """What two backends share lives in a module both import (``stores._sql``,
    ``stores._format``...), never in one of them."""
    edges = _edges()
    crossing = sorted(
        (module, imported)
        for module, imported_all in edges.items()
        for imported in imported_all
        for mine in BACKENDS
        for theirs in BACKENDS
        if mine != theirs
        and _within(module, (f"statekernel.stores.{mine}",))
        and _within(imported, (f"statekernel.stores.{theirs}",))
    )
    assert crossing == []


def test_the_stores_folder_shows_its_rooms() -> None:
    """``stores/`` holds the backends and the rooms they share (``_format``, ``_host``,
    ``_sql``) as folders, and at most 10 modules of its own."""
    flat = sorted(p.name for p in (ROOT / "stores").glob("*.py"))
    assert len(flat) <= 10, flat


PUBLIC_MODULES = (
    "statekernel",
    "statekernel.errors",
    "statekernel.stores",
    "statekernel.pauses",
    "statekernel.providers",
    "statekernel.middleware",
    "statekernel.mcp",
    "statekernel.telemetry",
    "statekernel.testing",
    "statekernel.blocking",
)
"""The modules users import; a front-end imports from them only the names their
``__all__`` lists."""

FRONT_ENDS = ("statekernel.web", "statekernel._cli")


def _exported(module: str) -> set[str]:
    """The names ``module``'s ``__all__`` lists, read from its source."""
    for node in ast.parse(MODULES[module].read_text()).body:
        targets = getattr(node, "targets", [getattr(node, "target", None)])
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            value = getattr(node, "value", None)
            if isinstance(value, ast.List | ast.Tuple):
                return {
                    e.value
                    for e in value.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                }
    return set()


def _reaches(module: str, mine: tuple[str, ...]) -> Iterator[str]:
    """What ``module`` imports from the package that is neither public, nor the front
    room (``statekernel._front``), nor in ``mine``."""
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                allowed = _within(name, (*mine, "statekernel._front")) or name in PUBLIC_MODULES
                if name.startswith("statekernel.") and not allowed:
                    yield name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            source = node.module
            if not (source == "statekernel" or source.startswith("statekernel.")):
                continue
            if _within(source, (*mine, "statekernel._front")):
                continue
            public = _exported(source) if source in PUBLIC_MODULES else set()
            yield from (f"{source}.{a.name}" for a in node.names if a.name not in public)


def test_front_ends_use_the_public_api_and_their_room() -> None:
    """The command line and the web view import public names from the public modules,
    and anything else only from ``statekernel._front`` (``reach`` lists what they use
    beyond the public API); the command line may start the web view."""
    reached = sorted(
        (module, name)
        for module in MODULES
        for front, mine in (
            ("statekernel.web", ("statekernel.web",)),
            ("statekernel._cli", ("statekernel._cli", "statekernel.web")),
        )
        if _within(module, (front,))
        for name in _reaches(module, mine)
    )
    assert reached == []


def test_the_reach_check_finds_an_internal_name() -> None:
    found = set(_reaches("statekernel._front.reach", ()))
    assert "statekernel._secrets.redact" in found
    assert not any(name.startswith("statekernel.errors") for name in found)


SCHEMES = re.compile(r"\b(memory|file|sqlite|redis|rediss|postgresql|postgres)://")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module and its classes and functions."""
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            found.add(id(body[0].value))
    return found


def _scheme_lists(module: str) -> list[str]:
    """The strings of ``module`` (its docstrings aside) that name two store URL schemes
    or more: a list of which stores can do something."""
    tree = ast.parse(MODULES[module].read_text())
    skip = _docstrings(tree)
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and len(set(SCHEMES.findall(node.value))) >= 2
    ]


def test_only_the_stores_list_which_stores_can_what() -> None:
    """Which stores have run queues (or watches, or a read-only mode) is declared in
    ``statekernel.stores``; no module outside it lists URL schemes."""
    listed = {
        module: found
        for module in MODULES
        if not _within(module, ("statekernel.stores",))
        if (found := _scheme_lists(module))
    }
    assert listed == {}
