"""mkdocs hook: lay out the package as it installs, for the API reference.

``statekernel.stores`` and ``statekernel.providers`` live in the top-level folders
``stores/`` and ``providers/`` (setuptools ``package-dir``), so neither the source tree
nor an editable install shows griffe a ``statekernel/stores`` folder. Before each build
this hook links the three folders into ``build/api-src/statekernel`` as they install,
and mkdocstrings reads the sources from there.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "api-src" / "statekernel"


@event_priority(100)  # before mkdocstrings looks at its paths
def on_config(config: Any) -> Any:
    """Link ``statekernel/*``, ``stores/`` and ``providers/`` into ``build/api-src``."""
    if TREE.exists():
        shutil.rmtree(TREE)
    TREE.mkdir(parents=True)
    for entry in (ROOT / "statekernel").iterdir():
        if entry.name != "__pycache__":
            (TREE / entry.name).symlink_to(entry)
    (TREE / "stores").symlink_to(ROOT / "stores")
    (TREE / "providers").symlink_to(ROOT / "providers")
    return config


def on_files(files: Any, config: Any) -> Any:
    """Publish the checked-in lifecycle diagram (``diagrams/``) as ``assets/``."""
    svg = ROOT / "diagrams" / "run_lifecycle.svg"
    files.append(File.generated(config, "assets/run_lifecycle.svg", abs_src_path=str(svg)))
    return files


ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):(<code>)")


def on_page_content(html: str, **kwargs: Any) -> str:
    """Drop the reST roles some docstrings name objects with (``:class:`X```): Markdown
    shows the name as code without them."""
    return ROLE.sub(r"\1", html)
