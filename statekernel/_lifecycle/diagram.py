"""Diagrams generated from the lifecycle chart: Mermaid, DOT and SVG.

The text formats are built here from the chart's own states and transitions, so the
same chart always gives the same bytes (the checked-in files in ``diagrams/`` are
compared with a fresh generation by a test). SVG is rendered from the DOT text by
graphviz's ``dot`` program. A :class:`RunTrace` (see ``_lifecycle.trace``) highlights what one
run visited, with counts, and marks its current state.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from statekernel._lifecycle.chart import RunLifecycle
from statekernel._lifecycle.trace import RunTrace, TransitionKey
from statekernel.errors import ConfigError, InvalidArgument

__all__ = [
    "DIAGRAM_NAME",
    "FORMATS",
    "LifecycleGraph",
    "can_render_svg",
    "lifecycle_dot",
    "lifecycle_graph",
    "lifecycle_mermaid",
    "render",
    "render_svg",
    "write_diagrams",
]

DIAGRAM_NAME = "run_lifecycle"
"""The base name of the generated files in ``diagrams/``."""

FORMATS = ("mmd", "dot", "svg")
"""The formats ``statekernel diagram`` writes, by file extension."""

_VISITED_FILL = "#d8f3e4"
_CURRENT_FILL = "#40e0d0"
_VISITED_LINE = "#1f7a4d"
_UNVISITED = "#9a9a9a"


@attrs.frozen
class Transition:
    """One arrow of the chart: ``event`` leads from ``source`` to ``target`` when ``guard``."""

    source: str
    target: str
    event: str
    guard: str | None
    internal: bool

    @property
    def key(self) -> TransitionKey:
        """What a run trace counts this arrow by."""
        return (self.source, self.target, self.event)


@attrs.frozen
class LifecycleGraph:
    """The states (id, display name) and transitions of a chart, in declaration order."""

    name: str
    initial: str
    states: tuple[tuple[str, str], ...]
    transitions: tuple[Transition, ...]


def lifecycle_graph(chart: Any = RunLifecycle) -> LifecycleGraph:
    """Read the states and transitions of a ``python-statemachine`` chart class."""
    states = tuple((s.id, s.name) for s in chart.states)
    initial = next(s.id for s in chart.states if s.initial)
    transitions = []
    for state in chart.states:
        for t in state.transitions:
            guards = [str(c) for c in t.cond]
            transitions.append(
                Transition(
                    t.source.id,
                    t.target.id,
                    str(t.event),
                    ", ".join(guards) or None,
                    bool(t.internal),
                )
            )
    return LifecycleGraph(chart.__name__, initial, states, tuple(transitions))


def _count(n: int) -> str:
    return f" \u00d7{n}" if n else ""


# -- Mermaid -----------------------------------------------------------------------


def lifecycle_mermaid(graph: LifecycleGraph | None = None, trace: RunTrace | None = None) -> str:
    """Mermaid ``stateDiagram-v2`` text; with ``trace``, visited parts carry counts."""
    graph = graph or lifecycle_graph()
    title = graph.name if trace is None else trace.title
    lines = ["---", f"title: {title}", "---", "stateDiagram-v2", "    direction LR"]
    for sid, name in graph.states:
        label = name + (_count(trace.state_visits.get(sid, 0)) if trace else "")
        lines.append(f'    state "{label}" as {sid}')
    lines.append(f"    [*] --> {graph.initial}")
    for t in graph.transitions:
        label = t.event + (f" [{t.guard}]" if t.guard else "")
        if trace is not None:
            label += _count(trace.transitions.get(t.key, 0))
        lines.append(f"    {t.source} --> {t.target} : {label}")
    if trace is not None:
        lines += _mermaid_classes(graph, trace)
    return "\n".join(lines) + "\n"


def _mermaid_classes(graph: LifecycleGraph, trace: RunTrace) -> list[str]:
    lines = [
        f"    classDef visited fill:{_VISITED_FILL},stroke:{_VISITED_LINE}",
        f"    classDef current fill:{_CURRENT_FILL},stroke:#333,stroke-width:3px",
        f"    classDef unvisited color:{_UNVISITED},stroke:{_UNVISITED}",
    ]
    for sid, _ in graph.states:
        if sid == trace.current:
            kind = "current"
        elif trace.state_visits.get(sid):
            kind = "visited"
        else:
            kind = "unvisited"
        lines.append(f"    class {sid} {kind}")
    return lines


# -- DOT ---------------------------------------------------------------------------


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(**values: object) -> str:
    return "[" + ", ".join(f"{k}={_quote(str(v))}" for k, v in values.items()) + "]"


def lifecycle_dot(graph: LifecycleGraph | None = None, trace: RunTrace | None = None) -> str:
    """Graphviz DOT text; with ``trace``, visited parts are highlighted with counts."""
    graph = graph or lifecycle_graph()
    title = graph.name if trace is None else trace.title
    initial = _attrs(
        shape="circle", style="filled", fillcolor="black", label="", width=0.15, fixedsize="true"
    )
    node = _attrs(
        shape="box", style="rounded,filled", fillcolor="white", fontname="Helvetica", fontsize=11
    )
    lines = [
        f"digraph {graph.name} {{",
        f"  graph {_attrs(rankdir='LR', label=title, labelloc='t', fontname='Helvetica')};",
        f"  node {node};",
        f"  edge {_attrs(fontname='Helvetica', fontsize=9)};",
        f"  __initial {initial};",
        f"  __initial -> {graph.initial};",
    ]
    lines += [f"  {sid} {_state_attrs(sid, name, trace)};" for sid, name in graph.states]
    lines += [f"  {t.source} -> {t.target} {_edge_attrs(t, trace)};" for t in graph.transitions]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _state_attrs(sid: str, name: str, trace: RunTrace | None) -> str:
    if trace is None:
        return _attrs(label=name)
    visits = trace.state_visits.get(sid, 0)
    if sid == trace.current:
        return _attrs(
            label=f"{name}{_count(visits)}\n(current)", fillcolor=_CURRENT_FILL, penwidth=3
        )
    if visits:
        return _attrs(label=f"{name}{_count(visits)}", fillcolor=_VISITED_FILL, penwidth=2)
    return _attrs(label=name, color=_UNVISITED, fontcolor=_UNVISITED)


def _edge_attrs(t: Transition, trace: RunTrace | None) -> str:
    label = t.event + (f"\n[{t.guard}]" if t.guard else "")
    style = "dashed" if t.internal else "solid"
    if trace is None:
        return _attrs(label=label, style=style)
    count = trace.transitions.get(t.key, 0)
    if count:
        return _attrs(label=label + _count(count), style=style, color=_VISITED_LINE, penwidth=2.5)
    return _attrs(label=label, style=style, color=_UNVISITED, fontcolor=_UNVISITED)


# -- rendering and files -------------------------------------------------------------


def _bundled_graphviz() -> Any | None:
    """pygraphviz's ``AGraph`` when its wheel (with Graphviz's libraries) is installed."""
    try:
        module = importlib.import_module("pygraphviz")
    except ImportError:
        return None
    return getattr(module, "AGraph", None)


def can_render_svg() -> bool:
    """Whether SVG can be rendered: graphviz's ``dot`` on ``PATH``, else the Graphviz
    libraries of the ``pygraphviz`` wheel (the ``diagrams`` and ``test`` extras)."""
    return shutil.which("dot") is not None or _bundled_graphviz() is not None


def render_svg(dot_text: str) -> bytes:
    """Render DOT text to SVG with graphviz (``dot`` on ``PATH``, else the libraries of
    the ``pygraphviz`` wheel); raises ``ConfigError`` when there is neither."""
    dot = shutil.which("dot")
    if dot is None:
        agraph = _bundled_graphviz()
        if agraph is None:
            raise ConfigError(
                "graphviz is not installed (the 'dot' program, or the pygraphviz wheel: "
                "pip install 'statekernel[diagrams]', renders SVG)"
            )
        try:
            return bytes(agraph(dot_text).draw(format="svg", prog="dot"))
        except Exception as exc:
            raise ConfigError(f"graphviz failed: {exc}") from exc
    done = subprocess.run(
        [dot, "-Tsvg"], input=dot_text.encode(), capture_output=True, check=False, timeout=60
    )
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()
        raise ConfigError(f"graphviz failed: {detail[0] if detail else done.returncode}")
    return done.stdout


def render(fmt: str, trace: RunTrace | None = None) -> bytes:
    """The lifecycle diagram in ``fmt`` (``mmd``, ``dot`` or ``svg``) as bytes."""
    graph = lifecycle_graph()
    if fmt == "mmd":
        return lifecycle_mermaid(graph, trace).encode()
    if fmt == "dot":
        return lifecycle_dot(graph, trace).encode()
    if fmt == "svg":
        return render_svg(lifecycle_dot(graph, trace))
    raise InvalidArgument(f"unknown diagram format {fmt!r} (known: {', '.join(FORMATS)})")


def write_diagrams(directory: Path, formats: Iterable[str] = FORMATS) -> list[Path]:
    """Write ``run_lifecycle.<fmt>`` files into ``directory``; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        path = directory / f"{DIAGRAM_NAME}.{fmt}"
        path.write_bytes(render(fmt))
        written.append(path)
    return written
