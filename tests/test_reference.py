"""The API reference (``docs/reference/*.md``): it documents every name each public
namespace exports, names nothing private in a signature, and its signatures are wrapped.

Which names a page documents comes from its ``::: path`` directives: a directive naming
the object documents it; one naming a module documents the names of the module's
``__all__`` that have a docstring (mkdocstrings leaves out the others, as mkdocs.yml's
``show_if_no_docstring: false`` says), all of them with ``show_if_no_docstring: true``.
Whether a name has a docstring is what griffe, which mkdocstrings reads the sources
with, finds.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import pkgutil
import re
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import statekernel
import statekernel.providers
import statekernel.stores

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"

# the namespaces a user imports from, each documented in full by the reference
PUBLIC = [
    "statekernel",
    "statekernel.blocking",
    "statekernel.errors",
    "statekernel.integrations.temporal",
    "statekernel.integrations.dbos",
    "statekernel.mcp",
    "statekernel.middleware",
    "statekernel.pauses",
    "statekernel.providers",
    "statekernel.stores",
    "statekernel.telemetry",
    "statekernel.testing",
    "statekernel.testing.plugin",
    "statekernel.testing.strategies",
    "statekernel.web",
]
# modules without a leading underscore that are not namespaces of their own
PARTS = {
    "statekernel.integrations": "the integrations' package: each engine's module is a namespace",
    "statekernel.web.": "the web view's parts: statekernel.web exports create_app",
}

DIRECTIVE = re.compile(r"^::: (statekernel[\w.]*)[ \t]*\n((?:[ \t]+\S.*\n|[ \t]*\n)*)", re.M)
OPTION = re.compile(r"^\s+(\w+):[ \t]*(.*?)[ \t]*$", re.M)
PRIVATE_NAME = re.compile(r"(?<![\w.])_[A-Za-z]\w*")


def directives() -> dict[str, dict[str, str]]:
    """Each ``::: path`` of the reference pages, with its options as written."""
    found: dict[str, dict[str, str]] = {}
    for page in sorted(REFERENCE.glob("*.md")):
        for match in DIRECTIVE.finditer(page.read_text() + "\n"):
            options = dict(OPTION.findall(match.group(2)))
            # a directive listing members shows only those: this reads whole modules only
            assert "members" not in options, f"{page.name}: ::: {match.group(1)} has members:"
            found[match.group(1)] = options
    return found


def exported() -> Iterator[tuple[str, str]]:
    """``(namespace, name)`` for every name of every public namespace's ``__all__``."""
    for namespace in PUBLIC:
        for name in importlib.import_module(namespace).__all__:
            yield namespace, name


def uncovered(has_docstring: Callable[[str], bool]) -> list[str]:
    """The exported names no directive shows; ``has_docstring(path)`` answers for those
    only a module directive could."""
    shown = directives()
    missing = []
    for namespace, name in exported():
        path = f"{namespace}.{name}"
        if path in shown:
            continue
        module = shown.get(namespace)
        if module is None:
            missing.append(f"{path} (no '::: {namespace}' or '::: {path}')")
        elif module.get("show_if_no_docstring") != "true" and not has_docstring(path):
            missing.append(f"{path} (no docstring: '::: {path}' with show_if_no_docstring)")
    return missing


def needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is missing: pip install -e '.[docs]'")
        pytest.skip(f"{module} is missing (pip install -e '.[docs]')")


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """statekernel as griffe (so mkdocstrings) reads it, laid out as it installs: as
    docs/_hooks.py does, with stores/ and providers/ linked in as subpackages."""
    needs("griffe")
    import griffe

    tree = tmp_path_factory.mktemp("api-src") / "statekernel"
    tree.mkdir()
    for entry in (ROOT / "statekernel").iterdir():
        if entry.name != "__pycache__":
            (tree / entry.name).symlink_to(entry)
    (tree / "stores").symlink_to(ROOT / "stores")
    (tree / "providers").symlink_to(ROOT / "providers")
    return griffe.load("statekernel", search_paths=[tree.parent], try_relative_path=False)


def find(package: Any, path: str) -> Any:
    relative = path.removeprefix("statekernel").removeprefix(".")
    return package[relative] if relative else package


def test_every_public_module_is_a_namespace_of_the_reference_or_says_why_not() -> None:
    found = [
        *pkgutil.walk_packages(statekernel.__path__, "statekernel."),
        *pkgutil.walk_packages(statekernel.stores.__path__, "statekernel.stores."),
        *pkgutil.walk_packages(statekernel.providers.__path__, "statekernel.providers."),
    ]
    unplaced = []
    for info in found:
        parts = info.name.split(".")
        if any(part.startswith("_") for part in parts) or info.name in PUBLIC:
            continue
        if any(info.name.startswith(prefix) for prefix in PARTS):
            continue
        # a backend's module (statekernel.stores.redis): its names are its parent's
        module = importlib.import_module(info.name)
        parent = importlib.import_module(info.name.rpartition(".")[0])
        if parent.__name__ in PUBLIC and all(
            getattr(parent, name, None) is getattr(module, name) for name in module.__all__
        ):
            continue
        unplaced.append(info.name)
    assert unplaced == [], "add these to PUBLIC (and the reference) or to PARTS"


def test_every_public_namespace_has_a_directive() -> None:
    shown = directives()
    assert [namespace for namespace in PUBLIC if namespace not in shown] == []


def test_every_exported_name_is_named_or_under_its_modules_directive() -> None:
    assert uncovered(lambda path: True) == []


def test_every_name_under_a_module_directive_has_the_docstring_it_is_shown_by(
    package: Any,
) -> None:
    assert uncovered(lambda path: find(package, path).has_docstrings) == []


def test_a_directive_names_what_exists() -> None:
    for path in directives():
        module, _, name = path.rpartition(".")
        try:
            importlib.import_module(path)
        except ModuleNotFoundError:
            assert hasattr(importlib.import_module(module), name), path


def test_no_signature_of_the_reference_shows_a_private_name(package: Any) -> None:
    """A default such as ``_MISSING`` says nothing to a reader: a sentinel shows a name
    the docstring explains."""
    needs("griffe")
    from griffe import AliasResolutionError

    shown = []
    seen: set[str] = set()

    def visit(obj: Any) -> None:
        if obj.is_alias:
            try:
                obj = obj.final_target
            except AliasResolutionError:  # a name from another package
                return
        if obj.path in seen or not obj.path.startswith("statekernel"):
            return
        seen.add(obj.path)
        if obj.is_function:
            for parameter in obj.parameters:
                default = "" if parameter.default is None else str(parameter.default)
                if PRIVATE_NAME.search(default):
                    shown.append(f"{obj.path}({parameter.name}={default})")
        if obj.is_class:
            for name, member in obj.members.items():
                if not name.startswith("_") or name == "__init__":
                    visit(member)

    for namespace, name in exported():
        visit(find(package, f"{namespace}.{name}"))
    assert len(seen) > 300
    assert shown == []


def test_the_docs_extra_wraps_signatures_at_mkdocs_line_length() -> None:
    """mkdocstrings wraps a signature with black or ruff when either is installed (ruff
    from mkdocstrings-python 1.13); without one, each signature is a single line."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    docs = {req.name: req for req in map(Requirement, project["optional-dependencies"]["docs"])}
    assert "ruff" in docs
    floors = [
        Version(s.version) for s in docs["mkdocstrings-python"].specifier if s.operator == ">="
    ]
    assert floors
    assert max(floors) >= Version("1.13")
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^\s+separate_signature: true\b", config, re.M)
    assert re.search(r"^\s+show_signature_annotations: true\b", config, re.M)
    length = re.search(r"^\s+line_length: (\d+)\b", config, re.M)
    assert length
    assert int(length.group(1)) <= 88


def test_where_the_docs_build_a_formatter_is_installed() -> None:
    needs("mkdocstrings_handlers")
    assert Version(importlib.metadata.version("mkdocstrings-python")) >= Version("1.13")
    assert importlib.util.find_spec("ruff") or importlib.util.find_spec("black")
