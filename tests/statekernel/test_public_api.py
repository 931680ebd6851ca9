"""``__all__`` stays honest: sorted, resolvable, complete, documented."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

PUBLIC_MODULES = [
    "statekernel",
    "statekernel.errors",
    "statekernel.mcp",
    "statekernel.middleware",
    "statekernel.telemetry",
    "statekernel.testing",
    "statekernel.stores",
    "statekernel.providers",
]


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_all_is_sorted_unique_and_resolvable(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported), f"{name}.__all__ is not sorted"
    assert len(exported) == len(set(exported))
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ names missing {attr!r}"


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_every_public_class_and_function_is_exported_and_documented(name: str) -> None:
    module = importlib.import_module(name)
    for attr, value in vars(module).items():
        if attr.startswith("_") or inspect.ismodule(value):
            continue
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        if not getattr(value, "__module__", "").startswith("statekernel"):
            continue
        assert attr in module.__all__, f"{name}.{attr} is public but not in __all__"
        assert inspect.getdoc(value), f"{name}.{attr} has no docstring"


def test_every_error_derives_from_the_one_root() -> None:
    from statekernel import errors

    for attr in errors.__all__:
        cls = getattr(errors, attr)
        assert issubclass(cls, errors.StatekernelError)


def test_every_module_declares_an_honest_all() -> None:
    """Every module and package, at any depth, says what it exports, and it exists."""
    seen = 0
    import statekernel.providers
    import statekernel.stores

    found = [
        *pkgutil.walk_packages(statekernel.__path__, "statekernel."),
        *pkgutil.walk_packages(statekernel.stores.__path__, "statekernel.stores."),
        *pkgutil.walk_packages(statekernel.providers.__path__, "statekernel.providers."),
    ]
    for info in found:
        # statekernel.integrations exports nothing: each integration is a module of its own
        if info.name in ("statekernel.__main__", "statekernel.integrations"):
            continue
        module = importlib.import_module(info.name)
        assert hasattr(module, "__all__"), f"{info.name} has no __all__"
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert missing == [], f"{info.name}.__all__ names what it lacks: {missing}"
        seen += 1
    assert seen > 100


@pytest.mark.parametrize(
    ("old", "module", "new"),
    [
        ("Middleware", "statekernel.middleware", "Middleware"),
        ("ModelCall", "statekernel.middleware", "ModelCall"),
        ("ToolInvocation", "statekernel.middleware", "ToolInvocation"),
        ("MCPConnection", "statekernel.mcp", "MCPConnection"),
        ("mcp_http", "statekernel.mcp", "mcp_http"),
        ("mcp_stdio", "statekernel.mcp", "mcp_stdio"),
        ("set_tracer_provider", "statekernel.telemetry", "set_tracer_provider"),
        ("ToolOutput", "statekernel", "ToolReturn"),
    ],
)
def test_a_moved_or_renamed_name_still_works_and_warns(old: str, module: str, new: str) -> None:
    import statekernel

    with pytest.warns(
        DeprecationWarning, match=rf"statekernel\.{old} is deprecated; use {module}\.{new}"
    ):
        value = getattr(statekernel, old)
    assert value is getattr(importlib.import_module(module), new)
    assert old not in statekernel.__all__


def test_an_unknown_top_level_name_is_an_attribute_error() -> None:
    import statekernel

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        getattr(statekernel, "Nope")  # noqa: B009


def test_the_version_is_the_installed_distributions() -> None:
    import importlib.metadata
    import tomllib
    from pathlib import Path

    import statekernel

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["version"]
    assert statekernel.__version__ == importlib.metadata.version("statekernel") == declared
    changelog = (pyproject.parent / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(declared)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)
