"""Stores and providers of other distributions, registered through entry points.

A distribution registers a store for a URL scheme in the entry point group
``statekernel.stores`` (the object is called with the URL and returns a
``CheckpointStore``) and a model provider for a ``provider/`` prefix in
``statekernel.providers`` (the object is called with no arguments and returns a
``ModelProvider``, configured from the environment as the built-in ones are)::

    [project.entry-points."statekernel.stores"]
    dynamo = "my_package.store:DynamoStore"

    [project.entry-points."statekernel.providers"]
    corp = "my_package.models:CorpProvider"

The built-in stores and providers come first: entry points are read only for a name
that is not built in, so one cannot replace a built-in (``Kernel(providers={...})``
replaces a provider for one kernel; ``Kernel(store=...)`` takes any store object).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from statekernel.errors import ConfigError, StatekernelError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

# importlib.metadata is imported when an entry point is first looked up: it takes a
# tenth of the import of statekernel, and the built-in stores and providers never need it.

__all__ = ["PROVIDER_GROUP", "STORE_GROUP", "load_registered", "make_registered", "registered"]

STORE_GROUP: Final = "statekernel.stores"
"""The entry point group of stores: name = URL scheme, object = ``factory(url)``."""

PROVIDER_GROUP: Final = "statekernel.providers"
"""The entry point group of providers: name = provider prefix, object = ``factory()``."""


def registered(group: str) -> dict[str, EntryPoint]:
    """The entry points of ``group`` by name (lowercased), of every installed distribution."""
    from importlib.metadata import entry_points

    return {ep.name.lower(): ep for ep in entry_points(group=group)}


def _dist(ep: EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "an unknown distribution"


def load_registered(group: str, name: str) -> Any | None:
    """The object the entry point ``name`` of ``group`` names, or None when none is
    registered. One that cannot be loaded is a ``ConfigError`` naming its distribution,
    and so is a name that two distributions register for different objects (which one
    would serve it depended on the order of ``sys.path``)."""
    from importlib.metadata import entry_points

    named = {ep.value: ep for ep in entry_points(group=group) if ep.name.lower() == name.lower()}
    if not named:
        return None
    if len(named) > 1:
        each = ", ".join(f"{_dist(ep)} ({ep.value})" for ep in named.values())
        raise ConfigError(
            f"{group} entry point {name!r} is registered by more than one distribution:"
            f" {each}; uninstall all but one"
        )
    (ep,) = named.values()
    dist = _dist(ep)
    try:
        return ep.load()
    except Exception as exc:  # an entry point runs someone else's import
        raise ConfigError(
            f"{group} entry point {name!r} of {dist} ({ep.value}) failed to load: {exc}"
        ) from exc


def make_registered(group: str, name: str, factory: Any, args: tuple[Any, ...], kind: type) -> Any:
    """``factory(*args)``, checked: what a registered factory raises (other than
    statekernel's own errors) or returns that is not a ``kind`` is a ``ConfigError``
    naming the entry point, not a failure deep in a run."""
    try:
        made = factory(*args)
    except StatekernelError:
        raise
    except Exception as exc:  # someone else's code, configured by the environment
        raise ConfigError(
            f"the {group} entry point {name!r} failed to make its {kind.__name__}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(made, kind):
        raise ConfigError(
            f"the {group} entry point {name!r} made a {type(made).__name__}, not a {kind.__name__}"
        )
    return made
