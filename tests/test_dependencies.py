"""The declared dependencies say the truth: every package the library imports is
declared (in ``dependencies``, or in the extra that names the feature), and every declared
dependency is used."""

from __future__ import annotations

import ast
import functools
import os
import re
import sys
import tomllib
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("statekernel", "stores", "providers")
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
FOR_THE_PROJECT = {"test", "dev", "docs", "bench"}
"""Extras for working on the project itself, not features of the library."""
USED_WITHOUT_AN_IMPORT = {
    "jsonschema-specifications": "imported as jsonschema_specifications (checked below)",
    "pygraphviz": "imported by name with importlib (statekernel/_lifecycle/diagram.py)",
    "python-multipart": "Starlette's form parser (request.form() in statekernel/web/actions.py)",
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return canonical(re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0])


def declared() -> dict[str, set[str]]:
    """Distribution -> where it is declared (``core`` or the extras)."""
    where: dict[str, set[str]] = {}
    for requirement in PROJECT["dependencies"]:
        where.setdefault(requirement_name(requirement), set()).add("core")
    for extra, requirements in PROJECT["optional-dependencies"].items():
        for requirement in requirements:
            if not requirement.startswith("statekernel["):
                where.setdefault(requirement_name(requirement), set()).add(extra)
    return where


def imports() -> dict[str, set[str]]:
    """Top-level module -> the library's files that import it (third-party modules only)."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "statekernel":
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


@functools.cache
def installed() -> Mapping[str, list[str]]:
    return packages_distributions()


def distributions(module: str) -> set[str]:
    return {canonical(dist) for dist in installed().get(module, [module])}


def test_every_imported_package_is_declared_for_the_library() -> None:
    where = declared()
    undeclared = {}
    for module, files in imports().items():
        homes = {
            extra
            for dist in distributions(module)
            for extra in where.get(dist, set())
            if extra not in FOR_THE_PROJECT
        }
        if not homes:
            undeclared[module] = sorted(files)
    assert not undeclared, f"imported but declared in no extra of the library: {undeclared}"


def test_every_declared_dependency_is_imported() -> None:
    imported = {dist for module in imports() for dist in distributions(module)}
    library = {
        dist
        for dist, extras in declared().items()
        if extras - FOR_THE_PROJECT and dist not in USED_WITHOUT_AN_IMPORT
    }
    assert library - imported == set(), "declared for the library but never imported"


def floors() -> dict[str, Version]:
    """Distribution -> its declared floor (``>=``), for the requirements that apply here."""
    found: dict[str, Version] = {}
    sections = {"": PROJECT["dependencies"], **PROJECT["optional-dependencies"]}
    for extra, requirements in sections.items():
        for text in requirements:
            requirement = Requirement(text)
            if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
                continue
            for spec in requirement.specifier:
                if spec.operator == ">=":
                    name = canonical(requirement.name)
                    found[name] = max(found.get(name, Version("0")), Version(spec.version))
    return found


@pytest.mark.skipif(
    os.environ.get("STATEKERNEL_TEST_LOWEST") != "required",
    reason="the lowest-versions run only (tox -e lowest)",
)
def test_each_floor_is_the_version_the_lowest_run_installed() -> None:
    """A floor that another dependency lifts (mcp needs pydantic 2.12, say) is a version
    the suite never ran on: every declared floor of an installed package is the version
    ``uv --resolution lowest-direct`` installed."""
    lifted = {}
    for name, floor in floors().items():
        try:
            found = Version(version(name))
        except PackageNotFoundError:
            continue  # an extra the run does not install (docs, dev, local)
        if found != floor:
            lifted[name] = f"declared >={floor}, installed {found}"
    assert not lifted, f"floors the lowest-versions run did not run on: {lifted}"
