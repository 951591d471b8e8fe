"""Tables more than one command prints: the check report (`check`, and `up`'s preflight)."""

from __future__ import annotations

from rich.table import Table

from pdlaunch.check.results import Status
from pdlaunch.check.runner import CheckReport
from pdlaunch.cli.common import err, out

STATUS_STYLE = {
    Status.OK: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.SKIP: "dim",
}


def print_report(report: CheckReport) -> None:
    table = Table(
        title="pdlaunch check" + (" (fast subset)" if report.fast else ""), show_lines=False
    )
    for col in ("host / pair", "probe", "status", "message", "fix"):
        table.add_column(col, overflow="fold")
    first = True
    for kind, target, results in report.groups():
        if not first:
            table.add_section()
        first = False
        name = f"[bold]{target}[/]" if kind == "host" else target
        for i, r in enumerate(results):
            style = STATUS_STYLE[r.status]
            table.add_row(
                name if i == 0 else "",
                r.probe,
                f"[{style}]{r.status.value}[/]",
                r.message,
                f"[dim]{r.fix}[/]" if r.fix else "",
            )
    out.print(table)
    c = report.counts()
    summary = (
        f"{len(report.hosts)} host(s), {len(report.pairs)} pair(s) in {report.elapsed_s:.1f}s: "
        f"[green]{c['OK']} OK[/], [yellow]{c['WARN']} WARN[/], "
        f"[bold red]{c['FAIL']} FAIL[/], [dim]{c['SKIP']} SKIP[/]"
    )
    (err if report.failed else out).print(summary)
