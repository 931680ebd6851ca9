"""How the ``statekernel`` command shows events and runs to people (rich)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from statekernel import (
    Event,
    Message,
    ReasoningPart,
    Run,
    TextPart,
    ToolCall,
    ToolCallRecord,
    ToolResult,
)
from statekernel._front.limits import limits_text
from statekernel._front.reach import Owner
from statekernel._front.text import short, stamp, waiting_for
from statekernel._front.visible import plain, visible
from statekernel.stores import RunSummary

__all__ = [
    "EventPrinter",
    "run_details",
    "run_tree_view",
    "runs_table",
    "state_text",
    "tree_node",
]

STATE_STYLES = {
    "init": "white",
    "preparing_turn": "cyan",
    "calling_model": "cyan",
    "dispatching_tools": "cyan",
    "paused": "yellow",
    "failed": "red",
    "completed": "green",
}

_EVENT_STYLES = {
    "run_completed": "bold green",
    "run_failed": "bold red",
    "run_paused": "bold yellow",
    "run_resumed": "yellow",
    "run_retried": "yellow",
    "tool_call_started": "magenta",
    "tool_call_completed": "magenta",
    "model_started": "blue",
    "model_restarted": "bold blue",
    "model_completed": "blue",
}


def state_text(state: str) -> Text:
    """A state id, coloured."""
    return plain(state, STATE_STYLES.get(state, ""))


def _event_data(event: Event) -> str:
    data = event.data if isinstance(event.data, dict) else {"data": event.data}
    return " ".join(f"{visible(str(k))}={short(v, 60)}" for k, v in data.items())


class EventPrinter:
    """Prints a run's events as they come: persisted ones as lines, live text inline.

    ``live=False`` (``runs events``) prints persisted events only, with their time.
    """

    def __init__(self, console: Console, *, live: bool = True) -> None:
        self.console = console
        self.live = live
        self._inline = False

    def _end_inline(self) -> None:
        if self._inline:
            self.console.print()
            self._inline = False

    def show(self, event: Event) -> None:
        """Print one event."""
        if event.persisted:
            self._end_inline()
            line = Text(f"{stamp(event.at)} r{event.revision:<3} #{event.seq:<4}", style="dim")
            line.append(" ")
            line.append(visible(event.type), style=_EVENT_STYLES.get(event.type, ""))
            line.append(" " + _event_data(event))
            self.console.print(line, soft_wrap=True)
        elif self.live:
            self._show_live(event)

    def _show_live(self, event: Event) -> None:
        data = event.data if isinstance(event.data, dict) else {}
        if event.type in ("text_delta", "reasoning_delta"):
            if not self._inline:
                self.console.print("[dim]   \u2502[/dim] ", end="")
                self._inline = True
            style = "italic dim" if event.type == "reasoning_delta" else "bold"
            text = plain(str(data.get("text", "")), style, layout=True)
            self.console.print(text, end="", soft_wrap=True)
        elif event.type == "tool_output":
            self._end_inline()
            out = f"   \u2502 {visible(str(data.get('call_id')))}: {short(data.get('data'), 100)}"
            self.console.print(Text(out, style="dim"), soft_wrap=True)

    def close(self) -> None:
        """End a line of streamed text."""
        self._end_inline()


def runs_table(rows: Iterable[RunSummary], owners: Mapping[str, Owner] | None = None) -> Table:
    """The ``runs list`` table; ``owners``: who drives the runs that are not at rest,
    by run id (a column of its own when any is known)."""
    rows = list(rows)
    owners = owners or {}
    paused = any(s.pause is not None for s in rows)
    tagged = any(s.tags for s in rows)
    table = Table(show_edge=False, header_style="bold")
    names = ["run id", "state", "turns", "rev", "model", "updated"]
    if owners:
        names.append("owner")
    if tagged:
        names.append("tags")
    widest = max((len(visible(s.run_id)) for s in rows), default=0)
    for name in [*names, "waiting for"] if paused else names:
        whole = name in ("run id", "updated")  # never cut or wrapped: ids are copied
        table.add_column(
            name,
            justify="right" if name in ("turns", "rev") else "left",
            no_wrap=whole,
            min_width=widest if name == "run id" else (20 if name == "updated" else None),
        )
    for s in rows:
        updated = stamp(s.updated_at)
        cells: list[str | Text] = [
            plain(s.run_id),
            state_text(s.state),
            str(s.turns),
            str(s.revision),
            plain(s.model),
            updated,
        ]
        if owners:
            cells.append(_owner_text(owners.get(s.run_id)))
        if tagged:
            cells.append(plain(" ".join(f"{k}={v}" for k, v in sorted(s.tags.items()))))
        if paused:
            cells.append(plain(waiting_for(s.pause)) if s.pause is not None else "")
        table.add_row(*cells)
    return table


def tree_node(depth: int, run: Run) -> dict[str, Any]:
    """One run of ``runs tree --json``."""
    pause = run.pause
    return {
        "run_id": run.run_id,
        "depth": depth,
        "state": run.state,
        "revision": run.revision,
        "model": run.model,
        "parent_run_id": run.parent_run_id,
        "parent_call_id": run.parent_call_id,
        "pause": None if pause is None else {"reason": pause.reason, "metadata": pause.metadata},
    }


def run_tree_view(nodes: Sequence[tuple[int, Run]]) -> Tree:
    """A run and its child runs (depth first, as ``run_tree`` gives them) as a tree."""

    def label(run: Run) -> Text:
        text = plain(run.run_id, "bold") + Text("  ") + state_text(run.state)
        text.append(f"  rev {run.revision}  {visible(run.model)}")
        if run.parent_call_id:
            text.append(f"  (call {visible(run.parent_call_id)})", style="dim")
        if run.pause is not None:
            text.append(f"  {waiting_for(run.pause)}", style="yellow")
        return text

    root = Tree(label(nodes[0][1]))
    branches = [root]
    for depth, run in nodes[1:]:
        del branches[depth:]
        branches.append(branches[-1].add(label(run)))
    return root


def _message_lines(message: Message, limit: int) -> list[Text]:
    lines = []
    role = Text(f"{visible(message.role):>9} ", style="bold")
    for part in message.content:
        if isinstance(part, TextPart) and part.text:
            lines.append(role + Text(short(part.text, limit)))
        elif isinstance(part, ReasoningPart):
            lines.append(role + Text(short(part.text, limit), style="italic dim"))
        elif isinstance(part, ToolCall):
            call = f"\u2192 {visible(part.name)}({short(part.arguments, limit)})"
            lines.append(role + Text(call))
            lines[-1].append(f"  [{visible(part.id)}]", style="dim")
        elif isinstance(part, ToolResult):
            style = "red" if part.is_error else ""
            text = Text(f"\u2190 {visible(part.name)}: {short(part.content, limit)}", style=style)
            lines.append(role + text)
        role = Text(" " * 10)
    return lines or [role + Text("(empty)", style="dim")]


def _calls_table(title: str, records: Iterable[ToolCallRecord]) -> Table | None:
    records = list(records)
    if not records:
        return None
    table = Table(title=title, title_justify="left", show_edge=False, header_style="bold")
    for name in ("call id", "tool", "input", "attempt", "result"):
        table.add_column(name)
    for r in records:
        output = short(r.output, 60) if r.finished_at else ""
        result = plain(r.error, layout=True) if r.error is not None else plain(output)
        table.add_row(plain(r.id), plain(r.name), plain(short(r.input, 60)), str(r.attempt), result)
    return table


def _owner_text(owner: Owner | None) -> str | Text:
    """Who drives a run, red when its owner is gone ('' when not known)."""
    if owner is None:
        return ""
    return plain(owner.text) if owner.alive else plain(owner.text, "red")


def _header(run: Run, owner: Owner | None) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("run", plain(run.run_id))
    grid.add_row("state", state_text(run.state))
    if owner is not None:
        grid.add_row("owner", _owner_text(owner))
        if not owner.alive:
            grid.add_row("", plain(owner.lost, "red"))
    grid.add_row("revision", str(run.revision))
    grid.add_row("model", plain(run.model))
    grid.add_row("turns", f"{run.turn_count}" + (f" / {run.max_turns}" if run.max_turns else ""))
    grid.add_row("created", stamp(run.created_at))
    grid.add_row("updated", stamp(run.updated_at))
    if run.tags:
        grid.add_row("tags", plain(" ".join(f"{k}={v}" for k, v in sorted(run.tags.items()))))
    if run.pause is not None:
        detail = f"{run.pause.reason} (resumes to {run.pause.resume_to})"
        grid.add_row("paused", plain(detail, "yellow"))
        timer = run.pause.timer
        if timer is not None:
            then = "the run fails" if timer.fail else f"resumes with {short(timer.value, 100)}"
            grid.add_row("times out", plain(f"at {stamp(timer.at)}: {then}", "yellow"))
        if run.pause.metadata:
            grid.add_row("", plain(short(run.pause.metadata, 200)))
    if run.failure is not None:
        f = run.failure
        failure = f"{f.error}: {f.message} (in {f.failed_in})"
        grid.add_row("failed", plain(failure, "red", layout=True))
    spec = run.output_spec
    if spec is not None:
        rejected = f", {spec.failures} answer(s) sent back" if spec.failures else ""
        grid.add_row("output type", plain(f"{spec.name} (retries {spec.retries}{rejected})"))
        if run.state == "completed":
            grid.add_row("output", plain(short(run.output, 1000), "green", layout=True))
    u = run.usage
    usage = f"input {u.input_tokens}, output {u.output_tokens}"
    if u.cache_read_tokens or u.cache_write_tokens:
        usage += f", cache read {u.cache_read_tokens}, cache write {u.cache_write_tokens}"
    if u.reasoning_tokens:
        usage += f", reasoning {u.reasoning_tokens}"
    grid.add_row("usage", usage + f" (total {u.total_tokens})")
    if u.cost is not None:
        grid.add_row("cost", f"{u.cost:.6g} (at the prices of the kernels that drove it)")
    if run.limits is not None:
        grid.add_row("limits", f"{limits_text(run.limits)} (tool calls {run.tool_calls_started})")
    grid.add_row("context", plain(short(run.context, 200)))
    return grid


def run_details(run: Run, *, limit: int = 300, owner: Owner | None = None) -> Group:
    """The ``runs show`` view: header (with who drives the run, ``owner``, when known),
    transcript and the current turn's tool calls."""
    transcript = [line for m in run.messages for line in _message_lines(m, limit)]
    parts: list[object] = [
        _header(run, owner),
        Panel(Group(*transcript) if transcript else Text("(empty)"), title="transcript"),
    ]
    turn = run.current_turn
    if turn is not None:
        for title, records in (
            ("pending tool calls", turn.pending),
            ("in-flight tool calls", turn.in_flight),
            ("completed tool calls (this turn)", turn.completed),
        ):
            table = _calls_table(title, records)
            if table is not None:
                parts.append(table)
    return Group(*parts)  # type: ignore[arg-type]
