"""The live view of a run on a terminal (rich): nodes, tickets by stage, calls, tokens, spend
and elapsed time, redrawn in place while `run` or `resume` waits."""

from __future__ import annotations

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.cli.progress import Tally

REFRESH_PER_S = 4  # elapsed time ticks between events; the counts change on events


class LiveView:
    """A rich Live display of a `Tally`; `stop()` leaves its last frame on the screen."""

    def __init__(self, run_id: str, tally: Tally, console: Console | None = None) -> None:
        self.run_id = run_id
        self.tally = tally
        self.live = Live(
            get_renderable=self.render,
            console=console or Console(),
            refresh_per_second=REFRESH_PER_S,
            transient=False,
        )
        self.live.start()

    def update(self) -> None:
        """Redraw now (the tally changed)."""
        self.live.refresh()

    def stop(self) -> None:
        """Draw the last frame and give the terminal back."""
        self.live.stop()

    def render(self) -> Group:
        """The current frame."""
        t = self.tally
        nodes = Table.grid(padding=(0, 2))
        for node, state in t.nodes.items():
            ms = f"{t.node_ms[node]} ms" if node in t.node_ms else ""
            style = {"done": "green", "running": "yellow"}.get(state, "dim")
            nodes.add_row(node, Text(state, style=style), ms)
        tickets = Table(box=None, padding=(0, 2), show_edge=False)
        for column in ("tickets", "drafted", "reviewed", "pass", "need a human", "failed"):
            tickets.add_column(column, justify="right")
        tickets.add_row(
            str(t.tickets),
            str(len(t.drafted)),
            str(t.reviewed),
            Text(str(len(t.passed)), style="green"),
            Text(str(len(t.needs_human)), style="yellow" if t.needs_human else ""),
            Text(str(len(t.failed)), style="red" if t.failed else ""),
        )
        spend = Text(
            f"{t.calls} model calls · {t.tokens:,} tokens · {t.spend} · {t.elapsed_s:.1f} s elapsed"
        )
        parts = [Text(f"run {self.run_id}", style="bold"), nodes, tickets, spend]
        if (waits := t.waits.line()) is not None:
            parts.append(Text(waits, style="yellow"))
        return Group(*parts)
