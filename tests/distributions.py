"""A distribution installed for a test: a ``.dist-info`` folder and its modules in a
folder put on ``sys.path``, which is what ``importlib.metadata`` reads for any installed
distribution (entry points included)."""

from __future__ import annotations

from pathlib import Path

import pytest


def install(
    site: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    entry_points: dict[str, dict[str, str]],
    modules: dict[str, str],
) -> None:
    """Install distribution ``name`` 1.0 into ``site`` with ``entry_points`` (group ->
    name -> ``module:object``) and ``modules`` (module name -> source), and put ``site``
    on ``sys.path`` for this test."""
    # the folder's name escapes the project's as wheels do: "a-b" would read as
    # project "a", which importlib.metadata then takes for another of that name
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    sections = [
        f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in points.items())
        for group, points in entry_points.items()
    ]
    (info / "entry_points.txt").write_text("\n".join(sections))
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(site))
