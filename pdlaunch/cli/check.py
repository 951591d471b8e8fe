"""`pdlaunch check TOPOLOGY`: preflight of hardware, fabric, ports and versions. Exit codes:
0 no FAIL (WARN/SKIP allowed), 1 at least one FAIL (or rule errors), 2 unreadable input."""

from __future__ import annotations

from typing import Annotated

import typer

from pdlaunch.check.runner import CheckOptions, run_check
from pdlaunch.cli import summary
from pdlaunch.cli.common import EXIT_FINDINGS, EXIT_OK, app, err, plan_on_hosts, print_json
from pdlaunch.cli.options import (
    AcceptKeysOpt,
    JsonOpt,
    KnownHostsOpt,
    SshConfigOpt,
    TopologyArg,
    connect_options,
)
from pdlaunch.cli.reports import print_report


@app.command("check", short_help=summary("check"))
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
    accept_new_host_keys: AcceptKeysOpt = False,
    known_hosts: KnownHostsOpt = None,
    ssh_config: SshConfigOpt = None,
) -> None:
    """Preflight every host and prefill->decode pair of the topology; starts nothing."""
    from pdlaunch.hosts import HostPool

    connect = connect_options(accept_new_host_keys, known_hosts, ssh_config)
    pool = HostPool(connect)  # one connection a host: the core count read, then the check
    try:
        plan = plan_on_hosts(topology, connect, as_json, pool=pool)
        opts = CheckOptions(fast=fast, bandwidth=bandwidth, connect=connect)
        if as_json:
            report = run_check(plan, opts, pool=pool)
            print_json(report.to_dict())
        else:
            with err.status(f"checking {plan.deployment}...", spinner="dots"):
                report = run_check(plan, opts, pool=pool)
            print_report(report)
    finally:
        pool.close()
    raise typer.Exit(EXIT_FINDINGS if report.failed else EXIT_OK)
