"""`pdlaunch check TOPOLOGY`: preflight of hardware, fabric, ports and versions.

Registered on the app of `pdlaunch.cli` when this module is imported. Exit codes as in
cli.py: 0 no FAIL (WARN/SKIP allowed), 1 at least one FAIL (or rule errors), 2 unreadable
input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from pdlaunch.check.results import Status
from pdlaunch.check.runner import CheckOptions, CheckReport, run_check
from pdlaunch.cli import (
    EXIT_FINDINGS,
    EXIT_OK,
    JsonOpt,
    TopologyArg,
    app,
    err,
    out,
    plan_or_exit,
    print_json,
)

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


@app.command("check")
def check_cmd(
    topology: TopologyArg,
    as_json: JsonOpt = False,
    bandwidth: Annotated[
        bool,
        typer.Option("--bandwidth", help="Also measure ib_write_bw between prefill and decode"),
    ] = False,
    fast: Annotated[
        bool,
        typer.Option("--fast", help="Only the quick subset `up` runs (no NPU pings, no bandwidth)"),
    ] = False,
    accept_new_host_keys: Annotated[
        bool,
        typer.Option(
            "--accept-new-host-keys",
            help="Trust SSH host keys seen for the first time and record them (default: refuse)",
        ),
    ] = False,
    known_hosts: Annotated[
        Path | None,
        typer.Option("--known-hosts", help="Extra known_hosts file (new keys are recorded there)"),
    ] = None,
    ssh_config: Annotated[
        Path | None,
        typer.Option("--ssh-config", help="ssh_config file replacing ~/.ssh/config (like ssh -F)"),
    ] = None,
) -> None:
    """Preflight every host and prefill->decode pair of the topology; starts nothing."""
    plan = plan_or_exit(topology, as_json)
    opts = CheckOptions(
        fast=fast,
        bandwidth=bandwidth,
        accept_new_host_keys=accept_new_host_keys,
        known_hosts=str(known_hosts.expanduser()) if known_hosts is not None else None,
        ssh_config=str(ssh_config.expanduser()) if ssh_config is not None else None,
    )
    if as_json:
        report = run_check(plan, opts)
        print_json(report.to_dict())
    else:
        with err.status(f"checking {plan.deployment}...", spinner="dots"):
            report = run_check(plan, opts)
        print_report(report)
    raise typer.Exit(EXIT_FINDINGS if report.failed else EXIT_OK)
