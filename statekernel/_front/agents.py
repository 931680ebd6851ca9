"""The agent a front-end is told to drive runs with: ``package.module:attribute``, the
``Kernel`` keyword arguments (tools, hooks, providers) an application gives, as the
command line's ``--agent`` and the web view's ``agent=`` name them."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from typing import Any

from statekernel.errors import ConfigError

__all__ = ["load_agent", "load_named"]


def load_named(option: str, spec: str) -> Any:
    """The object ``package.module:attribute`` that ``option`` names, the module looked
    for in the current directory too (as ``python -m`` finds it); ``ConfigError`` naming
    the option when it is malformed or cannot be loaded."""
    module_name, sep, attr = spec.partition(":")
    if not (module_name and sep and attr):
        raise ConfigError(f"{option} must look like package.module:function, got {spec!r}")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {option} {spec!r}: {exc}") from exc
    return target


def load_agent(spec: str | None, option: str = "--agent") -> Mapping[str, Any]:
    """The ``Kernel`` keyword arguments named by ``package.module:attribute`` (none for
    None): a function returning them (called once, with no arguments) or the mapping
    itself; ``ConfigError`` naming ``option`` otherwise."""
    if not spec:
        return {}
    target = load_named(option, spec)
    options = target() if callable(target) else target
    if not isinstance(options, Mapping):
        raise ConfigError(f"{option} {spec!r} gave {type(options).__name__}, not a mapping")
    return options
