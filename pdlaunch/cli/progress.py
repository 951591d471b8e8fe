"""`up`'s progress on the terminal: a live table of every process under the current step.

The lifecycle reports through a :class:`~pdlaunch.runtime.lifecycle.Reporter` it is given;
this is the one the CLI gives it, kept apart from the commands so the lifecycle's calls land
in a module whose one job is printing."""

from __future__ import annotations

import threading

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pdlaunch.runtime import lifecycle as launch

_STATE_STYLE = {
    "pending": "dim",
    "starting": "yellow",
    "healthy": "green",
    "running": "green",
    "failed": "bold red",
    "stopping": "yellow",
    "stopped": "dim",
}


class RichReporter(launch.Reporter):
    """A live table of every process (state starting/healthy/failed) under the current step."""

    def __init__(self, console: Console, enabled: bool = True):
        self.console = console
        self.enabled = enabled
        self._views: list[launch.View] = []
        self._step = ""
        self._lock = threading.Lock()
        self.live: Live | None = None

    def __enter__(self) -> RichReporter:
        if self.enabled:
            self.live = Live(
                get_renderable=self.render,
                console=self.console,
                refresh_per_second=8,
                transient=False,
            )
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.stop()
            self.live = None
            if not self.console.is_terminal:
                self.console.line()

    def render(self) -> Group:
        table = Table(box=None, pad_edge=False, header_style="bold")
        for col in ("process", "role", "host", "pid", "state", "detail"):
            table.add_column(col, overflow="fold")
        with self._lock:
            views = list(self._views)
        for v in views:
            table.add_row(
                v.name,
                v.role,
                v.host,
                str(v.pid) if v.pid else "",
                Text(v.state, style=_STATE_STYLE.get(v.state, "")),
                v.detail,
            )
        if not views:
            return Group(Text(self._step, style="bold"))
        return Group(Text(self._step, style="bold"), table)

    def step(self, message: str) -> None:
        self._step = message
        if self.enabled and self.live is None:
            self.console.print(f"[dim]{message}[/]")

    def views(self, views: list[launch.View]) -> None:
        with self._lock:
            self._views = views

    def update(self) -> None:
        pass  # Live refreshes itself from render()

    def warn(self, message: str) -> None:
        if self.enabled:
            self.console.print(f"[yellow]warning[/] {message}")
